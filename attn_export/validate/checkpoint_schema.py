"""Schemas of a checkpoint's own files: config.json per family, sentence-transformers' modules, the safetensors index.

A family's config.json schema is built from the family's own declaration (its file in
``checkpoint/families/`` names the keys and transformers' defaults); the bounds of each field
are here, the same for every family.

Upper bounds sit well above any BERT-family encoder (XLM-R: vocab 250k; BERT-large: hidden
1024, 24 layers) and far below what would exhaust memory, so a hostile or broken file is
refused in one line before anything is allocated (``schema.validate``).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, create_model, field_validator

from attn_export.validate.schema import NonNegInt, StrictSchema, expected_error, finite_number
from attn_export.vocab.choices import POOLING_MODES, is_ascii_digits

__all__ = [
    "ENCODER_FIELDS",
    "SafetensorsIndexSchema",
    "SentenceBertConfigSchema",
    "StModulesSchema",
    "StNormalizeSchema",
    "StPoolingSchema",
    "encoder_config_schema",
]


def _pad_below_vocab(cls: type, v: int | None, info: ValidationInfo) -> int | None:
    """``pad_token_id`` is a token id: below ``vocab_size`` (every family's config names both)."""
    vocab = info.data.get("vocab_size")
    if v is not None and isinstance(vocab, int) and v >= vocab:
        raise expected_error(f"an id < vocab_size ({vocab})")
    return v


# --- checkpoint config.json ---------------------------------------------------------------------
def _label_id(v: str) -> str:
    if not is_ascii_digits(v, max_len=7):
        raise expected_error('a label id written as a JSON string of digits ("0", "1", ...)', got=json.dumps(v))
    return v


class _LabelsSchema(StrictSchema):
    """``id2label`` / ``label2id`` as transformers reads them (``PretrainedConfig``: ``dict[int, str]`` keyed by the
    label id as a JSON string): a JSON list is refused here, not an AttributeError inside transformers."""

    id2label: Annotated[dict[Annotated[str, AfterValidator(_label_id)], str], Field(max_length=1_000_000)] | None = None
    label2id: Annotated[dict[str, Annotated[int, Field(ge=0, lt=1_000_000)]], Field(max_length=1_000_000)] | None = None


# The bounds of every EncoderConfig field a config.json can set, whatever its key is called in a family
# (``checkpoint/families/<name>.py`` names the key and transformers' default): well above any
# BERT-family encoder (XLM-R: vocab 250k; BERT-large: hidden 1024, 24 layers), far below what would
# exhaust memory, so refused before anything is allocated.
ENCODER_FIELDS: dict[str, Any] = {
    "vocab_size": Annotated[int, Field(ge=1, le=1_048_576)],
    "hidden_size": Annotated[int, Field(ge=1, le=16_384)],
    "num_attention_heads": Annotated[int, Field(ge=1, le=1024)],
    "num_hidden_layers": Annotated[int, Field(ge=1, le=512)],
    "intermediate_size": Annotated[int, Field(ge=1, le=65_536)],
    "max_position_embeddings": Annotated[int, Field(ge=1, le=131_072)],
    "type_vocab_size": Annotated[int, Field(ge=1, le=1024)],
    "layer_norm_eps": Annotated[float, AfterValidator(finite_number), Field(gt=0.0, lt=1.0)],
    "hidden_act": str,
    "pad_token_id": NonNegInt | None,
    "embedding_size": Annotated[int, Field(ge=1, le=16_384)],
    "relative_attention_buckets": Annotated[int, Field(ge=4, le=1024)],
    # pre-norm rotary families (ModernBERT)
    "local_attention": Annotated[int, Field(ge=2, le=131_072)],
    "attention_bias": bool,
    "mlp_bias": bool,
    "norm_bias": bool,
}


class _EncoderKeys(_LabelsSchema):
    """The base of every family's config.json schema: fields are EncoderConfig names, read from the family's keys."""

    _pad_in_vocab = field_validator("pad_token_id", check_fields=False)(_pad_below_vocab)


@functools.cache
def _schema(name: str, keys: tuple[tuple[str, str], ...], defaults: tuple[tuple[str, Any], ...]) -> type[StrictSchema]:
    given, names = dict(defaults), dict(keys)
    fields: dict[str, Any] = {  # in ENCODER_FIELDS' order: vocab_size is validated before pad_token_id is checked against it
        field: (kind, Field(given[field] if field in given else ..., validation_alias=names[field])) for field, kind in ENCODER_FIELDS.items() if field in names
    }
    return create_model(f"{name}ConfigSchema", __base__=_EncoderKeys, **fields)


def encoder_config_schema(name: str, keys: Mapping[str, str], defaults: Mapping[str, Any]) -> type[StrictSchema]:
    """The pydantic schema of one family's config.json (built once per family, cached).

    ``keys``: EncoderConfig field -> the config.json key that holds it (optimum's
    ``NormalizedConfig.with_args``: DistilBERT's ``hidden_size`` is ``dim``); ``defaults``: the
    value transformers uses when the key is absent (a field without one is required). The
    validated object's attributes are the EncoderConfig field names; a failure names the key.
    """
    return _schema(name, tuple(keys.items()), tuple(sorted(defaults.items())))


# --- sentence-transformers files (modules.json, 1_Pooling/config.json, ...) ----------------------
class StModuleSchema(StrictSchema):
    idx: NonNegInt | None = None
    name: str | None = None
    path: str
    type: Annotated[str, Field(min_length=1, max_length=256)]


class StModulesSchema(StrictSchema):
    """``modules.json`` (a JSON list, validated as ``{"modules": [...]}``): the pipeline, in order."""

    modules: Annotated[list[StModuleSchema], Field(min_length=1, max_length=64)]


def _st_modes(v: str | list[str] | None) -> str | list[str] | None:
    for mode in [v] if isinstance(v, str) else v or []:
        if mode not in POOLING_MODES:
            raise expected_error(f"pooling modes among {', '.join(POOLING_MODES)}", got=json.dumps(mode))
    return v


class StPoolingSchema(StrictSchema):
    """``1_Pooling/config.json``: the legacy ``pooling_mode_*`` booleans or sentence-transformers 6's ``pooling_mode``."""

    word_embedding_dimension: Annotated[int, Field(ge=1, le=65_536)] | None = None
    embedding_dimension: Annotated[int, Field(ge=1, le=65_536)] | None = None
    pooling_mode: Annotated[str | Annotated[list[str], Field(min_length=1, max_length=6)] | None, AfterValidator(_st_modes)] = None
    pooling_mode_cls_token: bool = False
    pooling_mode_max_tokens: bool = False
    pooling_mode_mean_tokens: bool = False
    pooling_mode_mean_sqrt_len_tokens: bool = False
    pooling_mode_weightedmean_tokens: bool = False
    pooling_mode_lasttoken: bool = False
    include_prompt: bool = True


class StNormalizeSchema(StrictSchema):
    """``2_Normalize/config.json`` (optional): only the pooled sentence embedding is supported."""

    module_input_name: Literal["sentence_embedding"] = "sentence_embedding"
    module_output_name: Literal["sentence_embedding"] | None = None


class SentenceBertConfigSchema(StrictSchema):
    max_seq_length: Annotated[int, Field(ge=1, le=131_072)] | None = None
    do_lower_case: bool = False


# --- model.safetensors.index.json ---------------------------------------------------------------
def _shard_name(name: str) -> str:
    if "\x00" in name or not name.endswith(".safetensors"):
        raise expected_error("a .safetensors file name")
    if os.path.isabs(name) or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise expected_error("a file name relative to the checkpoint directory")
    if ".." in Path(name.replace("\\", "/")).parts:
        raise expected_error("a file inside the checkpoint directory (no '..')")
    return name


class SafetensorsIndexSchema(StrictSchema):
    metadata: dict[str, Any] = Field(default_factory=dict)
    weight_map: Annotated[dict[str, Annotated[str, AfterValidator(_shard_name)]], Field(min_length=1)]
