"""``LowRank``: factorize Linears into two thinner ones (activation-aware SVD by default), slot by slot.

The subject names the places a transform may rewrite (``module_slots``) and their real inputs;
each slot is factorized on its own ``train`` inputs. A slot that is the whole subject reports one
``LowRankSummary``; layer slots (an encoder's) report layer by layer.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from attn_export.compress.registry import Method, PlanContext, Source, register_method
from attn_export.errors import ConfigError
from attn_export.vocab.choices import LOW_RANK_METHODS, LOW_RANK_TARGET_NAMES

if TYPE_CHECKING:
    from torch import nn

    from attn_export.runtime.artifacts import Artifact
    from attn_export.compress.lowrank import LowRankConfig
    from attn_export.compress.subject_hooks import ModuleSlot
    from attn_export.vocab.run_options import RunOptions

__all__ = ["LowRank", "low_rank_slots_"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LowRank(Method):
    """Factorize Linears keeping ``rank_ratio`` of their parameters, fitted on the train split."""

    role: ClassVar[str] = "transform"
    tolerance: ClassVar[str] = "lowrank"
    needs: ClassVar[tuple[str, ...]] = ("train",)
    stage: ClassVar[str] = "lowrank"
    filename: ClassVar[str] = "model.lowrank.onnx"
    key_part: ClassVar[str] = "lowrank"  # the 8-bit stages of a low-rank student: lowrank-int8-static, held to lowrank-int8

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


def low_rank_slots_(student: nn.Module, slots: list[ModuleSlot], config: LowRankConfig) -> Any:
    """Factorize every slot of ``student`` on its own ``train`` inputs, in place; the summary of the whole student."""
    from attn_export.compress.lowrank import LayerwiseLowRankSummary, low_rank_

    if len(slots) == 1 and slots[0].layer is None:
        return low_rank_(slots[0].student, config, slots[0].inputs("train"))
    summary = LayerwiseLowRankSummary(params_before=sum(p.numel() for p in student.parameters()), params_after=0)
    for n, slot in enumerate(slots):
        low = low_rank_(slot.student, config, slot.inputs("train"))
        summary.add(n if slot.layer is None else slot.layer, low)
        log.info("layer %s: %s", slot.layer, low.describe())
    student.eval()
    summary.params_after = sum(p.numel() for p in student.parameters())
    log.info("%s", summary.describe())
    return summary


@register_method(LowRank)
def low_rank(source: Source, config: LowRank) -> Artifact:
    from attn_export.compress.lowrank import LowRankConfig

    ctx, subject = source.ctx, source.subject
    ctx.say(f"low-rank: {config.method} SVD at {config.rank_ratio} of {','.join(config.targets)} parameters")
    student = copy.deepcopy(source.artifact.module)
    summary = low_rank_slots_(student, subject.module_slots(student), LowRankConfig(rank_ratio=config.rank_ratio, method=config.method,
                                                                                     targets=config.targets))  # fmt: skip
    ctx.say(summary.describe())
    result = subject.export(student, source.path, ctx.fp32_spec)
    return ctx.onnx_artifact(
        source.name, source.path, "fp32", config.tolerance, module=student, onnx_fp32=source.path, params=subject.params(student),
        details={"low_rank": summary.to_dict(), "export": result.to_dict()},
    )  # fmt: skip
