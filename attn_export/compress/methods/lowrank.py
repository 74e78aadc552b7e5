"""``LowRank``: factorize Linears into two thinner ones (activation-aware SVD by default)."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from attn_export.compress.registry import Method, PlanContext, Source, register_method
from attn_export.errors import ConfigError
from attn_export.vocab.choices import LOW_RANK_METHODS, LOW_RANK_TARGET_NAMES

if TYPE_CHECKING:
    from attn_export.runtime.artifacts import Artifact
    from attn_export.vocab.run_options import RunOptions

__all__ = ["LowRank"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LowRank(Method):
    """Factorize Linears keeping ``rank_ratio`` of their parameters, fitted on the train split."""

    role: ClassVar[str] = "transform"
    tolerance: ClassVar[str] = "lowrank"
    needs: ClassVar[tuple[str, ...]] = ("train",)
    stage: ClassVar[str] = "lowrank"
    filename: ClassVar[str] = "model.lowrank.onnx"
    lossy_source: ClassVar[bool] = True

    rank_ratio: float = 0.5
    method: str = "activation"
    targets: tuple[str, ...] = ("q", "k", "v", "o")

    def __post_init__(self) -> None:
        if not 0.0 < self.rank_ratio < 1.0:
            raise ConfigError(f"expected a rank ratio in (0, 1), got {self.rank_ratio}; use e.g. 0.5")
        if self.method not in LOW_RANK_METHODS:
            raise ConfigError(f"expected a low-rank method in {LOW_RANK_METHODS}, got {self.method!r}")
        if not self.targets or any(t not in LOW_RANK_TARGET_NAMES for t in self.targets):
            raise ConfigError(f"expected low-rank targets from {','.join(LOW_RANK_TARGET_NAMES)}, got {self.targets}")

    def fitted(self) -> str | None:
        return "the activation-aware factors, fitted on the train split's activations" if self.method == "activation" else None

    @classmethod
    def from_run(cls, run: RunOptions, ctx: PlanContext, parent: Method | None = None) -> LowRank | None:
        if run.low_rank is None:
            return None
        return cls(rank_ratio=float(run.low_rank), method=run.low_rank_method, targets=run.resolved_low_rank_targets)


@register_method(LowRank)
def low_rank(source: Source, config: LowRank) -> Artifact:
    from attn_export.compress.lowrank import LowRankConfig

    ctx = source.ctx
    ctx.say(f"low-rank: {config.method} SVD at {config.rank_ratio} of {','.join(config.targets)} parameters")
    student = copy.deepcopy(source.artifact.module)
    summary = source.subject.low_rank(student, LowRankConfig(rank_ratio=config.rank_ratio, method=config.method, targets=config.targets))
    ctx.say(summary.describe())
    result = source.subject.export(student, source.path, ctx.fp32_spec)
    return ctx.onnx_artifact(
        source.name, source.path, "fp32", config.tolerance, module=student, onnx_fp32=source.path, params=source.subject.params(student),
        details={"low_rank": summary.to_dict(), "export": result.to_dict()},
    )  # fmt: skip
