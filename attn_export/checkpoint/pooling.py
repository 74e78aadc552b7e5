"""The pooling a checkpoint ships: read from its sentence-transformers files, or overridden.

A sentence-transformers folder is a pipeline (``modules.json``): the Transformer at the
folder's root, then ``1_Pooling`` (its ``config.json`` names the mode), then optionally
``2_Normalize``; ``sentence_bert_config.json`` holds ``max_seq_length``. This module reads
those files (pydantic schemas in ``attn_export.validate.schema``), so the exported
``sentence_embedding`` is the vector ``SentenceTransformer.encode`` returns, and records
where the pooling came from:

- ``"1_Pooling/config.json"``: the model's own (with Normalize when modules.json has it);
- ``"--pooling"``: the user's override (``resolve_pooling(dir, override="cls")``); Normalize
  stays as the model ships it (or on, for a folder without sentence-transformers files);
- ``"default mean"``: a plain Hugging Face folder ships no pooling; mean + Normalize, as
  all-MiniLM-L6-v2 and the project's earlier releases do.

A pipeline with any other module (Dense, LayerNorm, a custom module...) is refused by name:
its output is not what this encoder computes. Module types are matched against an allow-list
of the class paths sentence-transformers itself writes (``_MODULE_TYPES``), so a look-alike
such as ``sentence_transformers.evil.Pooling`` is refused, never imported. A pipeline with no
Pooling module (Transformer -> Normalize) is refused too: ``SentenceTransformer.encode`` itself
fails on it (no ``sentence_embedding``), so there is no user's model to match.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from attn_export.checkpoint.paths import inside
from attn_export.errors import CheckpointError, ConfigError
from attn_export.layers.encoder_config import PoolingConfig
from attn_export.vocab.choices import POOLING_MODES

__all__ = ["SentenceTransformersInfo", "parse_pooling", "read_sentence_transformers", "resolve_pooling"]

log = logging.getLogger(__name__)

_FIX = "fix the file or re-save the model with sentence-transformers"
_LEGACY_ORDER = (  # sentence-transformers' concatenation order for the legacy boolean keys
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
    ("pooling_mode_weightedmean_tokens", "weightedmean"),
    ("pooling_mode_lasttoken", "lasttoken"),
)
# The class paths sentence-transformers writes into modules.json for the three supported modules:
# sentence-transformers < 6 (``models.X``) and 6's modules (with the aliases its deprecated_import maps).
_MODULE_TYPES = {
    "sentence_transformers.models.Transformer": "Transformer",
    "sentence_transformers.models.transformer.Transformer": "Transformer",
    "sentence_transformers.base.modules.Transformer": "Transformer",
    "sentence_transformers.base.modules.transformer.Transformer": "Transformer",
    "sentence_transformers.models.Pooling": "Pooling",
    "sentence_transformers.models.pooling.Pooling": "Pooling",
    "sentence_transformers.sentence_transformer.modules.Pooling": "Pooling",
    "sentence_transformers.sentence_transformer.modules.pooling.Pooling": "Pooling",
    "sentence_transformers.models.Normalize": "Normalize",
    "sentence_transformers.models.normalize.Normalize": "Normalize",
    "sentence_transformers.base.modules.Normalize": "Normalize",
    "sentence_transformers.base.modules.normalize.Normalize": "Normalize",
    "sentence_transformers.sentence_transformer.modules.Normalize": "Normalize",
    "sentence_transformers.sentence_transformer.modules.normalize.Normalize": "Normalize",
}


@dataclass(frozen=True)
class SentenceTransformersInfo:
    """What a sentence-transformers folder ships: its pooling, Normalize, max length."""

    pooling_modes: tuple[str, ...]
    normalize: bool
    max_seq_length: int | None
    pooling_path: str | None  # "1_Pooling" (for the report's "1_Pooling/config.json")
    include_prompt: bool = True  # False: sentence-transformers pools without the prompt's tokens
    do_lower_case: bool = False  # sentence-transformers lower-cases every text before its tokenizer's own normalizer


def _kind(type_name: str) -> str | None:
    """``sentence_transformers.models.Pooling`` (a class path sentence-transformers writes) -> ``"Pooling"``; else None."""
    return _MODULE_TYPES.get(type_name)


def _pooling_modes(path: Path) -> tuple[tuple[str, ...], bool]:
    """The modes of a Pooling config, and its ``include_prompt``."""
    from attn_export.validate.checkpoint_schema import StPoolingSchema
    from attn_export.validate.schema import read_json, validate

    raw = read_json(path, "a sentence-transformers Pooling config", _FIX, error=CheckpointError)
    cfg = validate(StPoolingSchema, raw, str(path), _FIX, error=CheckpointError)
    if cfg.pooling_mode is not None:  # sentence-transformers >= 6 writes one key; it wins over the legacy ones
        return ((cfg.pooling_mode,) if isinstance(cfg.pooling_mode, str) else tuple(cfg.pooling_mode)), cfg.include_prompt
    modes = tuple(mode for key, mode in _LEGACY_ORDER if getattr(cfg, key))
    return modes or ("mean",), cfg.include_prompt  # sentence-transformers' own default when no flag is set


def read_sentence_transformers(checkpoint_dir: str | os.PathLike[str]) -> SentenceTransformersInfo | None:
    """The folder's sentence-transformers pipeline, or None when it has no ``modules.json``."""
    from attn_export.validate.checkpoint_schema import SentenceBertConfigSchema, StModulesSchema, StNormalizeSchema
    from attn_export.validate.schema import read_json, validate

    root = Path(checkpoint_dir)
    if not (root / "modules.json").is_file():
        return None
    modules_path = inside(root, "modules.json", "sentence-transformers modules")
    raw = read_json(modules_path, "a sentence-transformers modules.json", _FIX, error=CheckpointError)
    if not isinstance(raw, list):
        raise CheckpointError(f"{modules_path}: expected a JSON list of modules, got {type(raw).__name__}; {_FIX}")
    modules = validate(StModulesSchema, {"modules": raw}, str(modules_path), _FIX, error=CheckpointError).modules
    kinds = [_kind(m.type) for m in modules]
    for m, kind in zip(modules, kinds):
        if kind is None:
            raise CheckpointError(
                f"{modules_path}: module {m.type!r} is not supported; supported sentence-transformers pipelines: Transformer, Pooling, "
                "Normalize, by the class paths sentence-transformers writes (sentence_transformers.models.Pooling, ...); nothing else is imported"
            )
    order = [k for k in kinds if k is not None]
    if order[0] != "Transformer" or order.count("Transformer") != 1 or order.count("Pooling") > 1 or order.count("Normalize") > 1:
        raise CheckpointError(f"{modules_path}: expected Transformer, then Pooling, then optionally Normalize, got {' -> '.join(order)}; {_FIX}")
    if ("Normalize" in order and order[-1] != "Normalize") or ("Pooling" in order and order.index("Pooling") != 1):
        raise CheckpointError(f"{modules_path}: expected Transformer, then Pooling, then optionally Normalize, got {' -> '.join(order)}; {_FIX}")
    transformer = modules[0]
    if transformer.path not in ("", "."):
        raise CheckpointError(
            f"{modules_path}: the Transformer module lives in {transformer.path!r}; pass --checkpoint {root / transformer.path} "
            "(config.json and the weights are there)"
        )
    if "Pooling" not in order:  # SentenceTransformer.encode itself fails on it: no sentence_embedding is produced
        raise CheckpointError(
            f"{modules_path}: expected a Pooling module after the Transformer, got {' -> '.join(order)}; sentence-transformers "
            "cannot encode a pipeline without one: add sentence_transformers.models.Pooling and re-save the model"
        )
    pooling = modules[order.index("Pooling")]
    pooling_path = pooling.path
    modes, include_prompt = _pooling_modes(inside(root, f"{pooling.path}/config.json", "Pooling config"))
    normalize = "Normalize" in order
    if normalize and (cfg_path := inside(root, f"{modules[order.index('Normalize')].path}/config.json", "Normalize config")).is_file():
        validate(StNormalizeSchema, read_json(cfg_path, "a Normalize config", _FIX, error=CheckpointError), str(cfg_path), _FIX, error=CheckpointError)
    max_len, lower = None, False
    if (sbert := inside(root, "sentence_bert_config.json", "sentence-transformers config")).is_file():
        raw_sb = read_json(sbert, "a sentence_bert_config.json", _FIX, error=CheckpointError)
        sb = validate(SentenceBertConfigSchema, raw_sb, str(sbert), _FIX, error=CheckpointError)
        max_len, lower = sb.max_seq_length, sb.do_lower_case
    return SentenceTransformersInfo(pooling_modes=modes, normalize=normalize, max_seq_length=max_len, pooling_path=pooling_path,
                                    include_prompt=include_prompt, do_lower_case=lower)  # fmt: skip


def parse_pooling(text: str) -> tuple[str, ...]:
    """``--pooling cls`` / ``mean`` / ``cls+mean`` -> the modes; one line naming the choices otherwise."""
    modes = tuple(part.strip().lower().replace("-", "_") for part in str(text).split("+"))
    aliases = {"mean_sqrt_len": "mean_sqrt_len_tokens", "last": "lasttoken", "weighted_mean": "weightedmean"}
    modes = tuple(aliases.get(m, m) for m in modes)
    bad = [m for m in modes if m not in POOLING_MODES]
    if bad or not modes:
        raise ConfigError(f"expected --pooling one of {', '.join(POOLING_MODES)} (or several joined by '+'), got {str(text)[:80]!r}")
    if len(set(modes)) != len(modes):  # each mode once: at most len(POOLING_MODES) poolings, each concatenated into the embedding
        repeated = next(m for m in modes if modes.count(m) > 1)
        raise ConfigError(f"expected each --pooling mode once (at most {len(POOLING_MODES)}), got {repeated} {modes.count(repeated)} times; "
                          f"drop the repeats, e.g. --pooling {'+'.join(dict.fromkeys(modes))}")  # fmt: skip
    return modes


def resolve_pooling(checkpoint_dir: str | os.PathLike[str], override: str | None = None) -> PoolingConfig:
    """The pooling to export for a checkpoint folder, with its source (see the module docstring)."""
    from attn_export.layers.pooling import PoolingConfig

    info = read_sentence_transformers(checkpoint_dir)
    normalize = True if info is None else info.normalize
    if override is not None:
        return PoolingConfig(modes=parse_pooling(override), normalize=normalize, source="--pooling")
    if info is None:
        return PoolingConfig(source="default mean")
    return PoolingConfig(modes=info.pooling_modes, normalize=normalize, source=f"{info.pooling_path}/config.json")
