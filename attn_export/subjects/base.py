"""The ``Subject`` protocol: what the one pipeline compresses, exports and judges.

A subject is a reference layer (``LayerSubject``), a pretrained checkpoint (``EncoderSubject``)
or one layer of a checkpoint in context (``EncoderLayerSubject``). The plan, the runner and
the compression methods only talk to this protocol, so every stage, flag and deploy target
works the same for all of them, and no module outside ``subjects/`` asks which kind it has.

Data comes in three roles, never mixed:

* ``train``: fits things (8-bit ranges, activation-aware low-rank, distillation);
* ``select``: decides things (distillation early stopping, route selection, the fallback);
* ``report``: only measured, never used for a decision. Every accuracy figure in a report is
  on this split.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np
from torch import nn

from attn_export.runtime.base import Feed, Runner
from attn_export.validate.report import Accuracy

if TYPE_CHECKING:
    from attn_export.compress.quant.mixed_precision import FallbackGoal
    from attn_export.export.onnx_export import ExportResult
    from attn_export.export.spec import ExportSpec
    from attn_export.validate.latency import TimingPoint
    from attn_export.validate.tolerances import Tolerance

__all__ = ["BaseSubject", "Judgement", "Split", "Subject", "concat_output", "rel_l2"]

Split = Literal["train", "select", "report"]


@dataclass
class Judgement:
    """An artifact's accuracy against the reference on one split.

    ``score`` is the one figure selection ranks by (higher is better): the output cosine for a
    layer, the mean sentence-embedding cosine for an encoder.
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
        return f"cosine {self.accuracy.cosine:.6f}, rel L2 {self.accuracy.rel_l2:.2e}"


@runtime_checkable
class Subject(Protocol):
    """What the plan, the runner and the methods need of a subject (see the module docstring)."""

    kind: str  # what the report calls it: layer | encoder | encoder-layer (never branched on outside subjects/)

    @property
    def name(self) -> str: ...
    def model_info(self) -> dict[str, Any]: ...
    def inputs_info(self) -> dict[str, Any]: ...
    def describe_data(self) -> str: ...
    def notes(self) -> list[str]: ...  # what the report must say about the data (none for most subjects)

    # the eager reference and what is exported
    @property
    def module(self) -> nn.Module: ...
    @property
    def input_names(self) -> list[str]: ...
    @property
    def output_names(self) -> list[str]: ...
    def eager_runner(self, module: nn.Module | None = None, name: str = "eager-fp32") -> Runner: ...
    def params(self, module: nn.Module | None = None) -> int: ...

    # data
    def feeds(self, split: Split) -> list[Feed]: ...
    def latency_feed(self) -> Feed: ...
    def timing_points(self, warmup: int, repeats: int) -> list[TimingPoint]: ...
    def calibration(self) -> Any: ...

    # building
    def export(self, module: nn.Module, path: Path, spec: ExportSpec) -> ExportResult: ...
    def low_rank(self, student: nn.Module, config: Any) -> Any: ...
    def distill(self, student: nn.Module, config: Any) -> Any: ...
    @property
    def default_distill_config(self) -> Any: ...

    # judging
    def judge(self, candidate: Runner, split: Split, tolerance_key: str) -> Judgement: ...
    def quick_error(self, candidate: Runner, split: Split, limit: int) -> float: ...
    @property
    def quick_error_name(self) -> str: ...
    def fallback_goal(self, tolerance_key: str) -> FallbackGoal: ...

    # deploying and reporting
    @property
    def deploy_name(self) -> str: ...
    def bundle_reference(self, tolerance_key: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, Tolerance]]: ...
    @property
    def renders_attention_maps(self) -> bool: ...


class BaseSubject(ABC):
    """What every subject shares; subclasses implement the rest of ``Subject``."""

    kind: ClassVar[str]
    renders_attention_maps: ClassVar[bool] = False  # report.html's per-head maps rebuild the layer from report.json
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
