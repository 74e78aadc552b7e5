"""ELECTRA (``model_type: electra``): BERT's layers behind a smaller embedding.

transformers' ``models/electra/modeling_electra.py``: the embedding tables are
``embedding_size`` wide (128 in ELECTRA-small, and transformers' default when the key is
absent) and ``embeddings_project`` maps them to ``hidden_size`` only when the two differ
(the factorised-embedding projection of ``layers/encoder.py``). Task models save the encoder
under ``electra.``; the sequence head is ``classifier.dense`` -> GELU (erf, whatever
``hidden_act`` says) -> ``classifier.out_proj`` on token 0.
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
    name="electra",
    model_types=("electra",),
    prefix="electra.",
    config_keys=BERT_KEYS.with_defaults(embedding_size=128),  # transformers' ElectraConfig default
    refusals=BERT_REFUSALS,
    projection="when-sizes-differ",
    embedding_parts=BERT_EMBEDDING_PARTS,
    layer_key=BERT_LAYER_KEY,
    layer_parts=BERT_LAYER_PARTS,
    sequence_activation="gelu",
    sequence_head={"classifier.dense": "head.dense", "classifier.out_proj": "head.out"},
    extra_parts={"embeddings_project": "embeddings.project"},
    # ElectraForPreTraining's discriminator head; ElectraForMaskedLM's generator head
    dropped=("discriminator_predictions.", "generator_predictions.", "generator_lm_head."),
)
