"""Schemas of a checkpoint's own files: config.json per family, sentence-transformers' modules, the safetensors index.

Upper bounds sit well above any BERT-family encoder (XLM-R: vocab 250k; BERT-large: hidden
1024, 24 layers) and far below what would exhaust memory, so a hostile or broken file is
refused in one line before anything is allocated (``schema.validate``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator

from attn_export.validate.schema import NonNegInt, StrictSchema, expected_error, finite_number
from attn_export.vocab.choices import POOLING_MODES, is_ascii_digits

__all__ = [
    "BertConfigSchema",
    "DistilBertConfigSchema",
    "ElectraConfigSchema",
    "RobertaConfigSchema",
    "SafetensorsIndexSchema",
    "SentenceBertConfigSchema",
    "StModulesSchema",
    "StNormalizeSchema",
    "StPoolingSchema",
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


# Upper bounds well above any BERT-family encoder (XLM-R: vocab 250k; BERT-large: hidden 1024,
# 24 layers), far below what would exhaust memory: refused before anything is allocated.
class BertConfigSchema(_LabelsSchema):
    vocab_size: Annotated[int, Field(ge=1, le=1_048_576)]
    hidden_size: Annotated[int, Field(ge=1, le=16_384)]
    num_attention_heads: Annotated[int, Field(ge=1, le=1024)]
    num_hidden_layers: Annotated[int, Field(ge=1, le=512)]
    intermediate_size: Annotated[int, Field(ge=1, le=65_536)]
    max_position_embeddings: Annotated[int, Field(ge=1, le=131_072)] = 512
    type_vocab_size: Annotated[int, Field(ge=1, le=1024)] = 2
    layer_norm_eps: Annotated[float, AfterValidator(finite_number), Field(gt=0.0, lt=1.0)] = 1e-12
    hidden_act: str = "gelu"
    position_embedding_type: str = "absolute"
    pad_token_id: NonNegInt | None = 0

    _pad_in_vocab = field_validator("pad_token_id")(_pad_below_vocab)


class RobertaConfigSchema(BertConfigSchema):
    """RoBERTa, XLM-RoBERTa, CamemBERT: BERT's keys; the pad id is also the position offset, so it is required to be an id."""

    pad_token_id: NonNegInt = 1  # transformers' RobertaConfig default


class ElectraConfigSchema(BertConfigSchema):
    embedding_size: Annotated[int, Field(ge=1, le=16_384)] = 128  # transformers' ElectraConfig default


class DistilBertConfigSchema(_LabelsSchema):
    """DistilBERT's own key names (``dim``, ``n_heads``, ...); LayerNorm eps is fixed at 1e-12 in its modeling code."""

    vocab_size: Annotated[int, Field(ge=1, le=1_048_576)]
    dim: Annotated[int, Field(ge=1, le=16_384)]
    n_heads: Annotated[int, Field(ge=1, le=1024)]
    n_layers: Annotated[int, Field(ge=1, le=512)]
    hidden_dim: Annotated[int, Field(ge=1, le=65_536)]
    max_position_embeddings: Annotated[int, Field(ge=1, le=131_072)] = 512
    activation: str = "gelu"
    sinusoidal_pos_embds: bool = False  # the table is saved either way; only its initialisation differs
    pad_token_id: NonNegInt | None = 0

    _pad_in_vocab = field_validator("pad_token_id")(_pad_below_vocab)


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
