"""RoBERTa, XLM-RoBERTa and CamemBERT (``model_type`` roberta, xlm-roberta, camembert).

BERT's layer layout (transformers' ``models/roberta/modeling_roberta.py``; XLM-R and CamemBERT
are copies of it), saved under ``roberta.`` by task models, with two differences that matter:

- positions: ``padding_idx + cumsum(input_ids != pad)`` and ``padding_idx`` for pads
  (``create_position_ids_from_input_ids``), so 514 position rows hold 512 tokens;
  ``pad_token_id`` (default 1) is the offset;
- ``type_vocab_size`` is 1 in the released checkpoints (absent -> transformers' default 2);
- the sequence head is ``classifier.dense`` -> tanh -> ``classifier.out_proj`` on ``<s>``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from attn_export.checkpoint.families.base import Family
from attn_export.checkpoint.families.bert import (
    BERT_EMBEDDING_PARTS,
    BERT_LAYER_KEY,
    BERT_LAYER_PARTS,
    bert_style_config,
)
from attn_export.layers.encoder_config import EncoderConfig

__all__ = ["ROBERTA"]

log = logging.getLogger(__name__)


def _read_roberta(config: Mapping[str, Any], path: str) -> EncoderConfig:
    from attn_export.validate.checkpoint_schema import RobertaConfigSchema

    return bert_style_config(config, path, RobertaConfigSchema, "padded")


ROBERTA = Family(
    name="roberta",
    model_types=("roberta", "xlm-roberta", "camembert"),
    prefix="roberta.",
    read_config=_read_roberta,
    embedding_parts=BERT_EMBEDDING_PARTS,
    layer_key=BERT_LAYER_KEY,
    layer_parts=BERT_LAYER_PARTS,
    sequence_style="roberta",
    sequence_head={"classifier.dense": "head.dense", "classifier.out_proj": "head.out"},
    dropped=("pooler.", "lm_head."),  # RobertaModel's pooler (unused by last_hidden_state); ...ForMaskedLM's head
)
