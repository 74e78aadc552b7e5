"""What an encoder family is, as data: one object per family, every fact of it in its own file.

A family (``checkpoint/families/<name>.py``, found by the registry in ``__init__``) says how a
Hugging Face checkpoint of that ``model_type`` maps onto ``SentenceEncoder``, the way optimum's
per-architecture ``OnnxConfig`` owns every fact of an architecture:

- its config.json keys (``ConfigKeys``: which key holds each ``EncoderConfig`` field, with
  transformers' default when absent: optimum's ``NormalizedConfig.with_args``); the bounds of
  the fields are the same for every family (``validate/checkpoint_schema.ENCODER_FIELDS``);
- its refusals: config values these layers do not compute, refused by name (``Refusal``);
- its embedding and position style: positions ``absolute`` or RoBERTa's ``padded``,
  factorised embeddings projected to ``hidden_size`` (``projection``), layers shared across
  depth (``shared_layers``); the mechanisms themselves live in ``layers/``;
- its weight names: embeddings, layers, the prefix its task models save the encoder under
  (``roberta.``), the keys ``AutoModel`` drops (pooler, pretraining heads);
- its heads: the module names of its sequence- and token-classification heads and the
  sequence head's activation; a family whose heads are read from config.json (ModernBERT's
  ``classifier_pooling``, ``classifier_activation``) names those keys (``head_keys``);
- fields a config.json spreads over keys that are not one field each (ModernBERT's
  ``layer_types`` / ``global_attn_every_n_layers``, ``rope_parameters``): a ``derive`` function
  of the family's file;
- the fidelity bar its re-implementation is held to against transformers (``FidelityBar``).

The loader (``attn_export.checkpoint.loader``) does the rest the same way for every family.
The task comes from ``architectures`` in config.json when it is there (it is what
``AutoModelFor...`` builds), else from which head keys the weights hold.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from attn_export.errors import CheckpointError, ConfigError
from attn_export.layers.encoder_config import (
    ACTIVATIONS,
    HEAD_ACTIVATIONS,
    LAYER_KINDS,
    POSITION_STYLES,
    EncoderConfig,
    HeadConfig,
)

__all__ = [
    "CONFIG_FIX",
    "PROJECTIONS",
    "TASK_SUFFIXES",
    "ConfigKeys",
    "Family",
    "FidelityBar",
    "Refusal",
    "detect_head",
    "head_parts",
    "map_key",
    "task_from_architectures",
]

log = logging.getLogger(__name__)

CONFIG_FIX = "fix config.json or use the checkpoint's original one"
_PARAM = {"weight": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}  # old TF-style LayerNorm names
_KEY = re.compile(r"^(.+)\.(weight|bias|gamma|beta)$")
# ``...ForX`` -> the task this project reproduces (None = the bare encoder, as AutoModel loads it)
TASK_SUFFIXES: dict[str, str | None] = {
    "Model": None, "ForMaskedLM": None, "ForPreTraining": None,
    "ForSequenceClassification": "sequence", "ForTokenClassification": "token",
}  # fmt: skip
_SUPPORTED_TASKS = "the bare encoder (...Model, ...ForMaskedLM, ...ForPreTraining), ...ForSequenceClassification, ...ForTokenClassification"
# How a family's embedding tables reach hidden_size: "none" (they are hidden_size wide), "when-sizes-differ"
# (ELECTRA: a projection only when embedding_size != hidden_size), "always" (ALBERT: a projection even when equal).
PROJECTIONS: tuple[str, ...] = ("none", "when-sizes-differ", "always")


@dataclass(frozen=True)
class ConfigKeys:
    """Which config.json key holds each ``EncoderConfig`` field, and transformers' default when it is absent.

    ``names``: field -> key, for every field read from config.json; ``defaults``: field -> the
    modeling code's default (a field without one is required); ``fixed``: field -> a value the
    modeling code hard-codes, with no key (DistilBERT's LayerNorm eps). Built like optimum's
    ``NormalizedConfig.with_args``: ``BERT_KEYS.with_args(hidden_size="dim")``.
    """

    names: Mapping[str, str]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)

    def with_args(self, **keys: str) -> ConfigKeys:
        """The same fields, some read from other keys (``hidden_size="dim"``)."""
        return replace(self, names={**self.names, **keys})

    def with_defaults(self, **defaults: Any) -> ConfigKeys:
        """Fields added or given another default (``embedding_size=128``); each is read from its own name unless renamed."""
        names = {**{f: f for f in defaults if f not in self.names}, **self.names}
        return replace(self, names=names, defaults={**self.defaults, **defaults})

    def key(self, name: str) -> str:
        """The config.json key of a field (for messages)."""
        return self.names.get(name, name)


@dataclass(frozen=True)
class Refusal:
    """A config.json value these layers do not compute: any value but ``supported`` (same type) is refused by name."""

    key: str
    supported: Any
    why: str  # completes "(<model_type> <why>)", e.g. "with relative position embeddings"

    def refused(self, config: Mapping[str, Any]) -> bool:
        value = config.get(self.key, self.supported)
        return type(value) is not type(self.supported) or value != self.supported


@dataclass(frozen=True)
class FidelityBar:
    """How close the re-implementation must be to transformers at load (``checkpoint/fidelity.py``).

    The default is the fp32 export's own bar: two float32 implementations of the same maths
    differ by ~1e-6; a wrong position offset, activation or pooling by 1e-1.
    """

    min_cosine: float = 0.9999
    max_abs: float = 1e-4

    def to_dict(self) -> dict[str, float]:
        return {"min_cosine": self.min_cosine, "max_abs": self.max_abs}


@dataclass(frozen=True)
class Family:
    """One encoder family; weight keys are matched after the optional ``prefix`` is removed."""

    name: str
    model_types: tuple[str, ...]
    prefix: str  # transformers' base_model_prefix + "."
    config_keys: ConfigKeys
    embedding_parts: Mapping[str, str]  # HF module -> SentenceEncoder module
    layer_key: re.Pattern[str]  # groups: layer index, HF part inside the layer
    layer_parts: Mapping[str, str]  # HF part -> TransformerLayer module
    sequence_activation: str  # of its ...ForSequenceClassification head (HEAD_ACTIVATIONS)
    sequence_head: Mapping[str, str]  # HF module -> SentenceEncoder module (head.dense, head.out)
    positions: str = "absolute"  # POSITION_STYLES
    projection: str = "none"  # PROJECTIONS
    shared_layers: bool = False  # one layer's weights at every depth (the checkpoint holds layer 0 only)
    refusals: tuple[Refusal, ...] = ()
    token_head: Mapping[str, str] = field(default_factory=lambda: {"classifier": "head.out"})
    extra_parts: Mapping[str, str] = field(default_factory=dict)  # e.g. ELECTRA's embeddings_project
    dropped: tuple[str, ...] = ()  # key prefixes AutoModel drops: pretraining heads, the pooler of a bare encoder
    # transformers' _keys_to_ignore_on_load_unexpected: patterns of keys dropped when the model has no such weight
    # (DeBERTa-v3's checkpoints keep a position table that position_biased_input false leaves unused)
    ignore_unexpected: tuple[str, ...] = ()
    layer_template: str = "encoder.layer.{index}.{part}"  # for messages: the HF name of a missing key
    fidelity: FidelityBar = field(default_factory=FidelityBar)
    # pre-norm rotary families (ModernBERT): EncoderConfig fields computed from config.json (raw config, path -> fields),
    # and head facts read from it (HeadConfig field -> (config.json key, transformers' default)); head_norm: a
    # LayerNorm after the head's activation, on both tasks' heads (ModernBertPredictionHead)
    derive: Callable[[Mapping[str, Any], str], Mapping[str, Any]] | None = None
    head_keys: Mapping[str, tuple[str, Any]] = field(default_factory=dict)
    head_norm: bool = False
    layer_kind: str = "post-norm"

    def __post_init__(self) -> None:
        checks = {"positions": (self.positions, POSITION_STYLES), "projection": (self.projection, PROJECTIONS),
                  "sequence_activation": (self.sequence_activation, HEAD_ACTIVATIONS), "layer_kind": (self.layer_kind, LAYER_KINDS)}  # fmt: skip
        for what, (value, allowed) in checks.items():
            if value not in allowed:
                raise ConfigError(f"family {self.name}: expected {what} in {', '.join(allowed)}, got {value!r}")

    def read_config(self, config: Mapping[str, Any], path: str) -> EncoderConfig:
        """config.json -> EncoderConfig (shape only); absent keys take the family's transformers defaults."""
        from attn_export.validate.checkpoint_schema import encoder_config_schema
        from attn_export.validate.schema import validate

        keys = self.config_keys
        cfg = validate(encoder_config_schema(self.name, keys.names, keys.defaults), dict(config), path, CONFIG_FIX, error=CheckpointError)
        values: dict[str, Any] = {**keys.fixed, **{f: getattr(cfg, f) for f in keys.names}}
        if self.derive is not None:
            values.update(self.derive(config, path))
        if values["hidden_act"] not in ACTIVATIONS:
            raise CheckpointError(f"{path}: {keys.key('hidden_act')}: expected one of {', '.join(ACTIVATIONS)}, got {values['hidden_act']!r}; {CONFIG_FIX}")
        if values.get("pad_token_id") is None and self.positions == "padded":  # positions count from the pad id
            raise CheckpointError(f"{path}: {keys.key('pad_token_id')}: expected an integer, got null; {CONFIG_FIX}")
        width = values.pop("embedding_size", None)
        factorised = self.projection == "always" or (self.projection == "when-sizes-differ" and width != values["hidden_size"])
        values["pad_token_id"] = values.get("pad_token_id") or 0
        try:
            return EncoderConfig(
                **values,
                family=str(config.get("model_type") or self.name),
                positions=self.positions,
                embedding_size=width if factorised else None,
                shared_layers=self.shared_layers,
                layer_kind=self.layer_kind,
            )
        except ConfigError as err:
            raise CheckpointError(f"{path}: {err}") from err

    def hf_module(self, ours: str) -> str:
        """The Hugging Face name of one of our modules (for a missing-key message)."""
        if m := re.match(r"^layers\.(\d+)\.(.+)$", ours):
            part = {v: k for k, v in self.layer_parts.items()}.get(m.group(2), m.group(2))
            return self.layer_template.format(index=m.group(1), part=part)
        inverse = {v: k for parts in (self.embedding_parts, self.extra_parts, self.sequence_head) for k, v in parts.items()}
        return inverse.get(ours, ours)


def head_parts(family: Family, task: str | None) -> Mapping[str, str]:
    """HF module -> our module of the family's head for ``task`` (empty for the bare encoder)."""
    if task is None:
        return {}
    return family.sequence_head if task == "sequence" else family.token_head


def map_key(family: Family, key: str, task: str | None) -> str | None:
    """One checkpoint key -> our state-dict key; None for a key AutoModel drops too.

    Raises CheckpointError for a key that belongs to none of the family's modules.
    """
    bare = key.removeprefix(family.prefix)
    m = _KEY.match(bare)
    if m is not None:
        module, param = m.group(1), _PARAM[m.group(2)]
        for parts in (family.embedding_parts, family.extra_parts, head_parts(family, task)):
            if module in parts:
                return f"{parts[module]}.{param}"
        if (lm := family.layer_key.match(module)) and lm.group(2) in family.layer_parts:
            return f"layers.{lm.group(1)}.{family.layer_parts[lm.group(2)]}.{param}"
    if bare.endswith("position_ids") or any(bare.startswith(p) for p in family.dropped):
        return None
    what = f"{family.name} encoder keys" + ("" if task is None else f" and a {task}-classification head")
    raise CheckpointError(
        f"unexpected key {key!r} in the checkpoint; expected only {what} ({', '.join(sorted(family.embedding_parts))}, "
        f"{family.layer_template.format(index='N', part='*')}); save the encoder alone or with a sequence/token classification head"
    )


def task_from_architectures(config: Mapping[str, Any], path: str) -> tuple[bool, str | None]:
    """(architectures given?, task) from config.json; an unsupported task head is refused by name."""
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        return False, None
    arch = archs[0]
    for suffix, task in TASK_SUFFIXES.items():
        if arch.endswith(suffix):
            return True, task
    raise CheckpointError(f"{path}: architectures: {arch} is a task head attn-export does not reproduce; supported: {_SUPPORTED_TASKS}")


def _task_from_keys(family: Family, keys: Collection[str]) -> str | None:
    """Which head the weights hold: the family's sequence head keys win (they are the more specific)."""
    matches = (_KEY.match(k.removeprefix(family.prefix)) for k in keys)
    modules = {m.group(1) for m in matches if m is not None}
    if all(name in modules for name in family.sequence_head):
        return "sequence"
    if all(name in modules for name in family.token_head):
        return "token"
    return None


def detect_head(family: Family, config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], path: str) -> HeadConfig | None:
    """The task head the checkpoint holds (None = bare encoder), its label count read from the weights."""
    given, task = task_from_architectures(config, path)
    if not given:
        task = _task_from_keys(family, shapes)
    if task is None:
        return None
    parts = head_parts(family, task)
    out = next(hf for hf, ours in parts.items() if ours == "head.out")
    weight = next((shapes[k] for k in (f"{out}.weight", f"{family.prefix}{out}.weight") if k in shapes), None)
    if weight is None or len(weight) != 2:
        raise CheckpointError(f"missing key '{out}.weight' in the checkpoint; config.json names a {task}-classification model ({path})")
    num_labels = int(weight[0])
    labels = config.get("id2label")
    if isinstance(labels, dict) and labels and len(labels) != num_labels:
        raise CheckpointError(
            f"{path}: id2label: expected {num_labels} labels (the rows of {out}.weight), got {len(labels)}; use the config that matches the weights"
        )
    read = {name: config.get(key, default) for name, (key, default) in family.head_keys.items()}  # e.g. ModernBERT's classifier_pooling
    try:
        if task == "sequence":
            return HeadConfig(task=task, style=family.name, num_labels=num_labels, **{"activation": family.sequence_activation, **read, "norm": family.head_norm})
        if family.head_norm:  # dense -> activation -> norm on every token before the classifier
            token = {k: v for k, v in read.items() if k != "pooling"}
            return HeadConfig(task=task, style=family.name, num_labels=num_labels, **{"activation": family.sequence_activation, **token, "norm": True})
    except ConfigError as err:
        keys = ", ".join(key for key, _ in family.head_keys.values())
        raise CheckpointError(f"{path}: {err} (read from {keys}); {CONFIG_FIX}") from err
    return HeadConfig(task=task, style="linear", num_labels=num_labels)
