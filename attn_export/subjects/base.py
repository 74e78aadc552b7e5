"""The ``Subject`` protocol: what the one pipeline compresses, exports and judges.

A subject is a reference layer (``LayerSubject``), a pretrained checkpoint (``EncoderSubject``)
or one layer of a checkpoint in context (``EncoderLayerSubject``). The plan, the runner and
the compression methods only talk to this protocol, so every stage, flag and deploy target
works the same for all of them, and no module outside ``subjects/`` asks which kind it has.
What the methods need of it (``compress.subject_hooks.TransformSubject``) lives below compress
and names no method: the slots a transform may rewrite, the data roles, a quick error on the
select split, a training transform's defaults.

Data comes in three roles, never mixed:

* ``train``: fits things (8-bit ranges, transforms such as activation-aware low-rank and distillation);
* ``select``: decides things (distillation early stopping, route selection, the fallback);
* ``report``: only measured, never used for a decision. Every accuracy figure in a report is
  on this split.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np
from torch import nn

from attn_export.compress.subject_hooks import Judgement, ModuleSlot, Split, TransformSubject
from attn_export.runtime.base import Feed, Runner

if TYPE_CHECKING:
    from attn_export.compress.quant.mixed_precision import FallbackGoal
    from attn_export.validate.latency import TimingPoint
    from attn_export.validate.tolerances import Tolerance

__all__ = ["BaseSubject", "Judgement", "ModuleSlot", "Split", "Subject", "concat_output", "rel_l2"]


@runtime_checkable
class Subject(TransformSubject, Protocol):
    """What the plan and the runner need of a subject, besides the methods' hooks (``TransformSubject``)."""

    kind: str  # what the report calls it: layer | encoder | encoder-layer (never branched on outside subjects/)

    @property
    def name(self) -> str: ...
    def model_info(self) -> dict[str, Any]: ...
    def inputs_info(self) -> dict[str, Any]: ...
    def describe_data(self) -> str: ...
    def notes(self) -> list[str]: ...  # what the report must say about the data (none for most subjects)

    # timing
    def timing_points(self, warmup: int, repeats: int) -> list[TimingPoint]: ...

    # deploying and reporting
    @property
    def deploy_name(self) -> str: ...
    def bundle_reference(self, tolerance_key: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, Tolerance]]: ...
    def report_attention(self, report: Mapping[str, Any], report_dir: Path) -> Any: ...
    def batch_invariance(self, candidate: Runner, split: Split) -> Any: ...


class BaseSubject(ABC):
    """What every subject shares; subclasses implement the rest of ``Subject``."""

    kind: ClassVar[str]
    deploy_name: ClassVar[str] = "model"  # the Triton model name

    @property
    @abstractmethod
    def module(self) -> nn.Module: ...

    def notes(self) -> list[str]:
        return []

    @property
    @abstractmethod
    def input_names(self) -> list[str]: ...

    @property
    @abstractmethod
    def output_names(self) -> list[str]: ...

    @abstractmethod
    def latency_feed(self) -> Feed: ...

    @abstractmethod
    def feeds(self, split: Split) -> list[Feed]: ...

    @abstractmethod
    def module_slots(self, student: nn.Module) -> list[ModuleSlot]:
        """The places of ``student`` (a copy of ``module``) a transform may rewrite, with the reference's module at each."""

    def report_attention(self, report: Mapping[str, Any], report_dir: Path) -> Any:
        """What the report shows for attention maps: ``validate.render.write_reports``' ``attention`` argument
        ("auto": the renderer rebuilds the layer from report.json; an ``AttentionSection``: maps or a note; None: no section)."""
        return None

    def batch_invariance(self, candidate: Runner, split: Split) -> Any:
        """The batch-invariance figure (``validate.batch_invariance.BatchInvariance``) of ``candidate`` on ``split``'s texts;
        None: the subject's inputs are not texts a service batches (a layer on random tensors)."""
        return None

    def training_defaults(self) -> Mapping[str, Any]:
        """The settings a training transform starts from on this subject (each takes the keys its config has)."""
        return {}

    def end_to_end(self, student: nn.Module, settings: Any) -> Any:
        """Train what transforms added through the whole model after the slots were fitted; None: the slots are the whole model."""
        return None

    @abstractmethod
    def tensor_tolerance(self, tolerance_key: str) -> Tolerance:
        """The bar each output tensor is held to (the on-device validator compares every output)."""

    def eager_runner(self, module: nn.Module | None = None, name: str = "eager-fp32") -> Runner:
        from attn_export.runtime import EagerRunner

        return EagerRunner(module if module is not None else self.module, self.input_names, self.output_names, name=name)

    def timing_points(self, warmup: int, repeats: int) -> list[TimingPoint]:
        """What every variant is timed on: the fixed ``--batch`` x ``--seq-len`` input."""
        from attn_export.validate.latency import TimingPoint

        feed = self.latency_feed()
        return [TimingPoint("fixed", feed, batch=len(next(iter(feed.values()))), warmup=warmup, repeats=repeats)]

    def bundle_reference(self, tolerance_key: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, Tolerance]]:
        """What a Jetson bundle checks on the device: report-split inputs, their eager outputs, and a tolerance per output."""
        feed = dict(self.feeds("report")[0])
        reference = self.eager_runner().infer(feed)
        return feed, reference, {name: self.tensor_tolerance(tolerance_key) for name in reference}

    def fallback_goal(self, tolerance_key: str) -> FallbackGoal:
        """What the 8-bit fallback must reach on the select split: the stage's tolerance alone, unless a subject says more."""
        from attn_export.compress.quant.mixed_precision import FallbackGoal

        return FallbackGoal()

    def copy_module(self) -> nn.Module:
        """A student: a deep copy of the subject module (compression never touches the reference)."""
        return copy.deepcopy(self.module)

    def reference_size_bytes(self) -> int:
        """Bytes of the eager module's parameters and buffers."""
        return int(sum(t.numel() * t.element_size() for t in list(self.module.parameters()) + list(self.module.buffers())))

    def params(self, module: nn.Module | None = None) -> int:
        return int(sum(p.numel() for p in (module if module is not None else self.module).parameters()))


def rel_l2(ref: np.ndarray, got: np.ndarray) -> float:
    """||got - ref|| / ||ref|| in float64."""
    r, g = np.asarray(ref, dtype=np.float64).ravel(), np.asarray(got, dtype=np.float64).ravel()
    return float(np.linalg.norm(g - r) / max(float(np.linalg.norm(r)), 1e-30))


def concat_output(outputs: list[dict[str, np.ndarray]], name: str) -> np.ndarray:
    """One output of several feeds, flattened and concatenated (for tensor metrics)."""
    return np.concatenate([np.asarray(o[name], dtype=np.float32).ravel() for o in outputs])
