"""The ``Subject`` contract: what the one pipeline compresses, exports and judges.

A subject is either a reference layer (``LayerSubject``) or a pretrained checkpoint, whole
or one layer of it in context (``EncoderSubject``). The plan and the runner only talk to
this interface, so every stage, flag and deploy target works the same for both.

Data comes in three roles, never mixed:

* ``train``: fits things (int8 ranges, activation-aware low-rank, distillation);
* ``select``: decides things (distillation early stopping, int8 route selection);
* ``report``: only measured, never used for a decision. Every accuracy figure in a report is
  on this split.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from torch import nn

from attn_export.runtime.base import Feed, Runner
from attn_export.validate.report import Accuracy

__all__ = ["Judgement", "Split", "Subject"]

Split = Literal["train", "select", "report"]


@dataclass
class Judgement:
    """An artifact's accuracy against the eager reference on one split."""

    accuracy: Accuracy
    passed: bool
    tolerance: dict[str, float]
    violations: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def headline(self) -> str:
        """The figure users read first (cosine for layers, mean embedding cosine for encoders)."""
        emb = self.details.get("embedding")
        if emb:
            return f"mean cosine {emb['mean_cosine']:.6f}, min {emb['min_cosine']:.6f}, top-1 {emb['top1_neighbor_agreement']:.3f}"
        return f"cosine {self.accuracy.cosine:.6f}, rel L2 {self.accuracy.rel_l2:.2e}"


class Subject(ABC):
    """One thing to take to production; see the module docstring for the data roles."""

    kind: ClassVar[str]

    # -- identity -----------------------------------------------------------------------
    @property
    @abstractmethod
    def name(self) -> str:
        """Short name for logs and file names, e.g. ``transformer`` or ``encoder``."""

    @abstractmethod
    def model_info(self) -> dict[str, Any]:
        """``report.model``: what was compressed (always has ``layer``, ``d_model``, ``heads``, ``params``)."""

    @abstractmethod
    def inputs_info(self) -> dict[str, Any]:
        """``report.inputs``: which data every figure was measured on."""

    # -- the eager reference ------------------------------------------------------------
    @property
    @abstractmethod
    def module(self) -> nn.Module:
        """The eager fp32 module that is exported (a layer, the encoder, or layer N)."""

    @property
    @abstractmethod
    def input_names(self) -> list[str]: ...

    @property
    @abstractmethod
    def output_names(self) -> list[str]: ...

    def eager_runner(self, module: nn.Module | None = None, name: str = "eager-fp32") -> Runner:
        from attn_export.runtime import EagerRunner

        return EagerRunner(module if module is not None else self.module, self.input_names, self.output_names, name=name)

    # -- data ---------------------------------------------------------------------------
    @abstractmethod
    def feeds(self, split: Split) -> list[Feed]:
        """Inputs of ``module`` for a data role (see the module docstring)."""

    @abstractmethod
    def latency_feed(self) -> Feed:
        """The input every variant is timed on (``--batch`` x ``--seq-len``)."""

    @abstractmethod
    def calibration(self) -> Any:
        """What the static int8 quantizer calibrates on: an ``ActivationSet`` or ready feed dicts (train split)."""

    @property
    def needs_training_data(self) -> bool:
        return True

    # -- building -----------------------------------------------------------------------
    @abstractmethod
    def export(self, module: nn.Module, path: Path, spec: Any) -> Any:
        """Export ``module`` (the subject or a compressed copy) to ONNX; returns an ``ExportResult``."""

    @abstractmethod
    def low_rank(self, student: nn.Module, config: Any) -> Any:
        """Factorize ``student`` in place on the train split; returns a summary with ``to_dict()``."""

    @abstractmethod
    def distill(self, student: nn.Module, config: Any) -> Any:
        """Train ``student`` towards ``module`` on train, early-stopping on select; returns a summary."""

    @property
    @abstractmethod
    def default_distill_config(self) -> Any:
        """The distillation settings measured best for this subject (steps come from ``--distill``)."""

    # -- judging ------------------------------------------------------------------------
    @abstractmethod
    def judge(self, candidate: Runner, split: Split, tolerance_key: str) -> Judgement:
        """``candidate`` against the eager reference on ``split``, held to the tolerance ``tolerance_key``."""

    @abstractmethod
    def quick_error(self, candidate: Runner, split: Split, limit: int) -> float:
        """A cheap scalar error of ``candidate`` on the first ``limit`` items of ``split`` (0 = exact).

        For ranking, never for a verdict: the int8 sensitivity analysis calls it once per GEMM
        group. Encoder: 1 - mean sentence-embedding cosine; layer: relative L2 of the output.
        """

    def copy_module(self) -> nn.Module:
        """A student: a deep copy of the subject module (compression never touches the reference)."""
        import copy

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
