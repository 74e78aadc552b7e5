"""ELECTRA (``model_type: electra``): BERT's layers behind a smaller embedding.

transformers' ``models/electra/modeling_electra.py``: the embedding tables are
``embedding_size`` wide (128 in ELECTRA-small, and transformers' default when the key is
absent) and ``embeddings_project`` maps them to ``hidden_size`` when the two differ. Task
models save the encoder under ``electra.``; the sequence head is ``classifier.dense`` ->
GELU (erf, whatever ``hidden_act`` says) -> ``classifier.out_proj`` on token 0.
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

__all__ = ["ELECTRA"]

log = logging.getLogger(__name__)


def _read_electra(config: Mapping[str, Any], path: str) -> EncoderConfig:
    from attn_export.validate.checkpoint_schema import ElectraConfigSchema

    return bert_style_config(config, path, ElectraConfigSchema, "absolute")


ELECTRA = Family(
    name="electra",
    model_types=("electra",),
    prefix="electra.",
    read_config=_read_electra,
    embedding_parts=BERT_EMBEDDING_PARTS,
    layer_key=BERT_LAYER_KEY,
    layer_parts=BERT_LAYER_PARTS,
    sequence_style="electra",
    sequence_head={"classifier.dense": "head.dense", "classifier.out_proj": "head.out"},
    extra_parts={"embeddings_project": "embeddings.project"},
    # ElectraForPreTraining's discriminator head; ElectraForMaskedLM's generator head
    dropped=("discriminator_predictions.", "generator_predictions.", "generator_lm_head."),
)
