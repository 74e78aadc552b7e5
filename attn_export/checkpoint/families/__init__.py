"""Encoder families as data, and the one place that decides which family a checkpoint is.

``family_for(config)`` reads config.json's ``model_type``: a supported family comes back as
its ``Family``; anything this project does not reproduce exactly is refused *before any
work* with one line that names it and lists what is supported. Refused on purpose:

- relative positions (``position_embedding_type`` relative_key / relative_key_query), which
  BERT-family configs could ask for and an absolute-position re-implementation would ignore;
- DeBERTa(-v2)'s disentangled attention, MPNet's relative position bias, ALBERT's shared
  layers and factorised embeddings, and every ``model_type`` not listed here.

A config.json without ``model_type`` (very old BERT exports) is read as BERT only when its
``architectures`` also say BERT (or say nothing).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from attn_export.checkpoint.families.base import Family, detect_head, head_parts, map_key
from attn_export.checkpoint.families.bert import BERT
from attn_export.checkpoint.families.distilbert import DISTILBERT
from attn_export.checkpoint.families.electra import ELECTRA
from attn_export.checkpoint.families.roberta import ROBERTA
from attn_export.errors import CheckpointError

__all__ = ["FAMILIES", "Family", "REFUSED", "SUPPORTED_MODEL_TYPES", "detect_head", "family_for", "head_parts", "map_key"]

log = logging.getLogger(__name__)

FAMILIES: tuple[Family, ...] = (BERT, ROBERTA, DISTILBERT, ELECTRA)
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(t for f in FAMILIES for t in f.model_types)
_BY_TYPE: dict[str, Family] = {t: f for f in FAMILIES for t in f.model_types}
# model_type -> what it is and why this project's layers do not reproduce it
REFUSED: dict[str, str] = {
    "deberta": "DeBERTa: disentangled attention with relative position terms",
    "deberta-v2": "DeBERTa-v2/v3: disentangled attention with relative position terms",
    "mpnet": "MPNet: a relative position bias in every attention layer",
    "albert": "ALBERT: layers shared across depth and factorised embeddings",
    "xlm-roberta-xl": "XLM-RoBERTa-XL: pre-norm layers",
    "modernbert": "ModernBERT: rotary positions and alternating local attention",
    "nomic_bert": "NomicBERT: rotary positions and a gated FFN",
}


def _supported() -> str:
    return f"supported model_types: {', '.join(SUPPORTED_MODEL_TYPES)} (absolute positions)"


def family_for(config: Mapping[str, Any], path: str = "config.json") -> Family:
    """The family of a config.json dict, or a one-line CheckpointError naming what is not supported."""
    model_type = config.get("model_type")
    if model_type is None:
        archs = config.get("architectures")
        arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
        if arch is not None and not arch.startswith("Bert"):
            raise CheckpointError(f"{path}: model_type: expected one of the {_supported()}, got none (architectures {arch}); add the model's model_type")
        model_type = "bert"
    if not isinstance(model_type, str):
        raise CheckpointError(f"{path}: model_type: expected a string, got {model_type!r}; {_supported()}")
    if model_type in REFUSED:
        raise CheckpointError(f"{path}: model_type {model_type!r} ({REFUSED[model_type]}) is not supported; {_supported()}")
    family = _BY_TYPE.get(model_type)
    if family is None:
        raise CheckpointError(f"{path}: model_type {model_type!r} is not a supported encoder family; {_supported()}")
    positions = config.get("position_embedding_type", "absolute")
    if positions != "absolute":
        raise CheckpointError(
            f"{path}: position_embedding_type {positions!r} ({model_type} with relative position embeddings) is not supported; {_supported()}"
        )
    return family
