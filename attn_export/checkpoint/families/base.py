"""What an encoder family is, as data: its config reader, weight names and task heads.

A family (``bert.py``, ``roberta.py``, ``distilbert.py``, ``electra.py``) says how a Hugging
Face checkpoint of that ``model_type`` maps onto ``SentenceEncoder``: which config.json keys
hold the shape, the module names of its embeddings and layers, the prefix its task models
save the encoder under (``roberta.``), the keys ``AutoModel`` drops (pooler, pretraining
heads), and the module names of its sequence- and token-classification heads. The loader
(``attn_export.checkpoint.loader``) does the rest the same way for every family.

The task comes from ``architectures`` in config.json when it is there (it is what
``AutoModelFor...`` builds), else from which head keys the weights hold.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from attn_export.errors import CheckpointError
from attn_export.layers.encoder_config import EncoderConfig, HeadConfig

__all__ = ["Family", "TASK_SUFFIXES", "detect_head", "head_parts", "map_key", "task_from_architectures"]

log = logging.getLogger(__name__)

_PARAM = {"weight": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}  # old TF-style LayerNorm names
_KEY = re.compile(r"^(.+)\.(weight|bias|gamma|beta)$")
# ``...ForX`` -> the task this project reproduces (None = the bare encoder, as AutoModel loads it)
TASK_SUFFIXES: dict[str, str | None] = {
    "Model": None, "ForMaskedLM": None, "ForPreTraining": None,
    "ForSequenceClassification": "sequence", "ForTokenClassification": "token",
}  # fmt: skip
_SUPPORTED_TASKS = "the bare encoder (...Model, ...ForMaskedLM, ...ForPreTraining), ...ForSequenceClassification, ...ForTokenClassification"


@dataclass(frozen=True)
class Family:
    """One encoder family; keys are matched after the optional ``prefix`` is removed."""

    name: str
    model_types: tuple[str, ...]
    prefix: str  # transformers' base_model_prefix + "."
    read_config: Callable[[Mapping[str, Any], str], EncoderConfig]  # (config.json dict, its path) -> shape only
    embedding_parts: Mapping[str, str]  # HF module -> SentenceEncoder module
    layer_key: re.Pattern[str]  # groups: layer index, HF part inside the layer
    layer_parts: Mapping[str, str]  # HF part -> TransformerLayer module
    sequence_style: str  # HeadConfig.style of its ...ForSequenceClassification
    sequence_head: Mapping[str, str]  # HF module -> SentenceEncoder module
    token_head: Mapping[str, str] = field(default_factory=lambda: {"classifier": "head.out"})
    extra_parts: Mapping[str, str] = field(default_factory=dict)  # e.g. ELECTRA's embeddings_project
    dropped: tuple[str, ...] = ()  # key prefixes AutoModel drops: pretraining heads, the pooler of a bare encoder
    layer_template: str = "encoder.layer.{index}.{part}"  # for messages: the HF name of a missing key

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
    style = family.sequence_style if task == "sequence" else "linear"
    return HeadConfig(task=task, style=style, num_labels=num_labels)
