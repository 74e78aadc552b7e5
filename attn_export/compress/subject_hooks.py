"""What a transform or a route may ask of a subject: generic hooks that name no method.

A subject (``subjects/``: a reference layer, a checkpoint, layer N of a checkpoint) implements
``TransformSubject``; the full ``subjects.base.Subject`` protocol extends it with what the plan,
the runner and the deploy steps need. The hooks are generic, so a new transform is a registry
entry (``compress.registry``) and never a new method on every subject:

* ``module_slots(student)``: the places of a student a transform may rewrite (``ModuleSlot``:
  the student's module, the reference's module at the same place, its real inputs per data role,
  whether its pretrained weights must stay);
* the data roles, never mixed: ``train`` fits, ``select`` decides, ``report`` only measures
  (``feeds(split)``, ``calibration()``, ``ModuleSlot.inputs(split)``);
* ``select_error(candidate, limit)``: a quick error on the select split, for ranking and early
  stopping (never a verdict);
* ``training_defaults()``: the settings a training transform starts from on this subject (a plain
  mapping: each transform takes the keys its config has);
* ``end_to_end(student, settings)``: train what transforms added through the whole model, after
  the slots were fitted one by one (None: the slots already are the whole model).

Light at import (no torch): ``compress.registry`` types its ``Source`` with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import nn

    from attn_export.compress.quant.mixed_precision import FallbackGoal
    from attn_export.export.onnx_export import ExportResult
    from attn_export.export.spec import ExportSpec
    from attn_export.runtime.base import Feed, Runner
    from attn_export.validate.report import Accuracy

__all__ = ["Judgement", "ModuleSlot", "Split", "TransformSubject"]

Split = Literal["train", "select", "report"]


@dataclass
class Judgement:
    """An artifact's accuracy against the reference on one split.

    ``score`` is the one figure selection ranks by (higher is better): the output cosine for a
    layer, the mean sentence-embedding cosine for an encoder, the mean logit cosine for a task head.
    """

    accuracy: Accuracy
    passed: bool
    tolerance: dict[str, float]
    score: float
    violations: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def headline(self) -> str:
        """The figures users read first."""
        emb = self.details.get("embedding")
        if emb:
            return f"mean cosine {emb['mean_cosine']:.6f}, min {emb['min_cosine']:.6f}, top-1 {emb['top1_neighbor_agreement']:.3f}"
        logits = self.details.get("logits")
        if logits:
            return f"label agreement {logits['label_agreement']:.4f}, logit cosine mean {logits['mean_cosine']:.6f}, min {logits['min_cosine']:.6f}"
        return f"cosine {self.accuracy.cosine:.6f}, rel L2 {self.accuracy.rel_l2:.2e}"


@dataclass
class ModuleSlot:
    """One place of a student that a transform may rewrite in place, fitted on the inputs that place really sees.

    ``layer`` is None when the slot is the whole subject module (a reference layer, layer N of a
    checkpoint: a transform reports it as one), else the index of the layer it is (an encoder's
    layers: a transform reports them layer by layer). ``inputs(split)`` are the activations the
    *reference* feeds this place on a data role. ``frozen``: the pretrained weights must stay, so
    a training transform trains only what a transform put in.
    """

    student: nn.Module
    teacher: nn.Module
    inputs: Callable[[Split], Any]  # split -> compress.calib_data.ActivationSet
    layer: int | None = None
    frozen: bool = False


@runtime_checkable
class TransformSubject(Protocol):
    """What the methods (transforms, routes, refinements) need of a subject (see the module docstring)."""

    # the eager reference and what is exported
    @property
    def module(self) -> nn.Module: ...
    @property
    def input_names(self) -> list[str]: ...
    @property
    def output_names(self) -> list[str]: ...
    def eager_runner(self, module: nn.Module | None = None, name: str = "eager-fp32") -> Runner: ...
    def params(self, module: nn.Module | None = None) -> int: ...
    def export(self, module: nn.Module, path: Path, spec: ExportSpec) -> ExportResult: ...

    # data, by role
    def feeds(self, split: Split) -> list[Feed]: ...
    def latency_feed(self) -> Feed: ...
    def calibration(self) -> Any: ...

    # what a transform may rewrite, and how a training transform starts
    def module_slots(self, student: nn.Module) -> list[ModuleSlot]: ...
    def training_defaults(self) -> Mapping[str, Any]: ...
    def end_to_end(self, student: nn.Module, settings: Any) -> Any: ...

    # judging
    def judge(self, candidate: Runner, split: Split, tolerance_key: str, batch: int | None = None) -> Judgement: ...
    def select_error(self, candidate: Runner, limit: int) -> float: ...
    @property
    def select_error_name(self) -> str: ...
    def fallback_goal(self, tolerance_key: str) -> FallbackGoal: ...
