"""RoBERTa, XLM-RoBERTa and CamemBERT (``model_type`` roberta, xlm-roberta, camembert).

BERT's layer layout (transformers' ``models/roberta/modeling_roberta.py``; XLM-R and CamemBERT
are copies of it), saved under ``roberta.`` by task models, with two differences that matter:

- positions: ``padding_idx + cumsum(input_ids != pad)`` and ``padding_idx`` for pads
  (``create_position_ids_from_input_ids``), so 514 position rows hold 512 tokens;
  ``pad_token_id`` (default 1) is the offset, so it must be an id (null is refused);
- ``type_vocab_size`` is 1 in the released checkpoints (absent -> transformers' default 2);
- the sequence head is ``classifier.dense`` -> tanh -> ``classifier.out_proj`` on ``<s>``.
"""

from __future__ import annotations

import logging

from attn_export.checkpoint.families.base import Family
from attn_export.checkpoint.families.bert import (
    BERT_EMBEDDING_PARTS,
    BERT_KEYS,
    BERT_LAYER_KEY,
    BERT_LAYER_PARTS,
    BERT_REFUSALS,
)

__all__ = ["FAMILY"]

log = logging.getLogger(__name__)

FAMILY = Family(
    name="roberta",
    model_types=("roberta", "xlm-roberta", "camembert"),
    prefix="roberta.",
    config_keys=BERT_KEYS.with_defaults(pad_token_id=1),  # transformers' RobertaConfig default
    refusals=BERT_REFUSALS,
    positions="padded",
    embedding_parts=BERT_EMBEDDING_PARTS,
    layer_key=BERT_LAYER_KEY,
    layer_parts=BERT_LAYER_PARTS,
    sequence_activation="tanh",
    sequence_head={"classifier.dense": "head.dense", "classifier.out_proj": "head.out"},
    dropped=("pooler.", "lm_head."),  # RobertaModel's pooler (unused by last_hidden_state); ...ForMaskedLM's head
)
