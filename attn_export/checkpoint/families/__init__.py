"""The encoder families, discovered, and the one place that decides which family a checkpoint is.

Every module of this package but ``base`` is one family and defines ``FAMILY`` (a ``Family``);
the registry imports them all (``pkgutil``), so a new family is a new file here and nothing
else. ``family_for(config)`` reads config.json's ``model_type``: a supported family comes back
as its ``Family`` once its refusals pass; anything this project does not reproduce exactly is
refused *before any work* with one line that names it and lists what is supported. Refused on
purpose, by ``model_type`` (``REFUSED``) or by a family's ``Refusal`` of a config value:

- relative positions (``position_embedding_type`` relative_key / relative_key_query), which
  BERT-family configs could ask for and an absolute-position re-implementation would ignore;
- DeBERTa (v1)'s disentangled attention (v2/v3 are the ``deberta_v2`` family), XLM-RoBERTa-XL's
  pre-norm layers, NomicBERT, and every ``model_type`` no family file lists.

A config.json without ``model_type`` (very old BERT exports) is read as BERT only when its
``architectures`` also say BERT (or say nothing).
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Mapping
from typing import Any

from attn_export.checkpoint.families.base import Family, detect_head, head_parts, map_key
from attn_export.errors import CheckpointError

__all__ = ["FAMILIES", "Family", "REFUSED", "SUPPORTED_MODEL_TYPES", "detect_head", "family_for", "family_of", "head_parts", "map_key"]

log = logging.getLogger(__name__)


def _discover() -> tuple[Family, ...]:
    """The ``FAMILY`` of every module in this package (``base`` excepted), by name."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            found.append(importlib.import_module(f"{__name__}.{info.name}").FAMILY)
    return tuple(sorted(found, key=lambda f: f.name))


FAMILIES: tuple[Family, ...] = _discover()
_BY_TYPE: dict[str, Family] = {t: f for f in FAMILIES for t in f.model_types}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_BY_TYPE))
# model_type -> what it is and why this project's layers do not reproduce it
REFUSED: dict[str, str] = {
    "deberta": "DeBERTa: disentangled attention with relative position terms",
    "xlm-roberta-xl": "XLM-RoBERTa-XL: pre-norm layers",
    "nomic_bert": "NomicBERT: rotary positions and a gated FFN",
}


def _supported() -> str:
    return f"supported model_types: {', '.join(SUPPORTED_MODEL_TYPES)} (absolute positions)"


def family_of(model_type: str) -> Family:
    """The family of a supported ``model_type`` (``EncoderConfig.family``); a CheckpointError for any other."""
    family = _BY_TYPE.get(model_type)
    if family is None:
        raise CheckpointError(f"model_type {model_type!r} is not a supported encoder family; {_supported()}")
    return family


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
    for refusal in family.refusals:
        if refusal.refused(config):
            value = config.get(refusal.key)
            raise CheckpointError(f"{path}: {refusal.key} {value!r} ({model_type} {refusal.why}) is not supported; {_supported()}")
    return family
