"""``Distill``: train the low-rank student towards the original (the teacher)."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from attn_export.compress.registry import Method, PlanContext, Source, register_method
from attn_export.errors import ConfigError

if TYPE_CHECKING:
    from attn_export.runtime.artifacts import Artifact
    from attn_export.vocab.run_options import RunOptions

__all__ = ["Distill"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Distill(Method):
    """Up to ``steps`` optimizer steps on the train split, early stopping on the select split."""

    role: ClassVar[str] = "transform"
    tolerance: ClassVar[str] = "lowrank"
    needs: ClassVar[tuple[str, ...]] = ("train", "select")
    stage: ClassVar[str] = "lowrank+distill"
    filename: ClassVar[str] = "model.lowrank-distilled.onnx"
    lossy_source: ClassVar[bool] = True

    steps: int = 200

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError(f"expected --distill STEPS >= 1, got {self.steps}")

    def fitted(self) -> str | None:
        return "the distilled weights, trained on the train split"

    @classmethod
    def from_run(cls, run: RunOptions, ctx: PlanContext, parent: Method | None = None) -> Distill | None:
        return None if run.distill is None else cls(steps=int(run.distill))


@register_method(Distill)
def distill(source: Source, config: Distill) -> Artifact:
    ctx = source.ctx
    ctx.say(f"distillation: up to {config.steps} steps, early stopping on the select split")
    student = copy.deepcopy(source.artifact.module)
    summary = source.subject.distill(student, replace(source.subject.default_distill_config, steps=config.steps))
    ctx.say(summary.describe())
    result = source.subject.export(student, source.path, ctx.fp32_spec)
    details = {"distill": {k: v for k, v in summary.to_dict().items() if k != "history"}, "export": result.to_dict()}
    return ctx.onnx_artifact(source.name, source.path, "fp32", config.tolerance, module=student, onnx_fp32=source.path,
                             params=source.subject.params(student), details=details)  # fmt: skip
