"""``Distill``: train the low-rank student towards the original (the teacher), slot by slot, then end to end.

Each slot the subject names (``module_slots``) trains on its own ``train`` inputs and stops early
on its ``select`` inputs (``compress.distill.distill_slot_``), starting from the subject's training
settings (``training_defaults``). A subject whose slots are its layers then trains the whole
student at once (``end_to_end``). A slot that is the whole subject reports one ``DistillSummary``.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

from attn_export.compress.registry import Method, PlanContext, Source, register_method
from attn_export.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from attn_export.runtime.artifacts import Artifact
    from attn_export.compress.distill import DistillConfig
    from attn_export.compress.subject_hooks import ModuleSlot, TransformSubject
    from attn_export.vocab.run_options import RunOptions

__all__ = ["Distill", "LayerwiseDistillSummary", "distill_slots_"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Distill(Method):
    """Up to ``steps`` optimizer steps on the train split, early stopping on the select split."""

    role: ClassVar[str] = "transform"
    tolerance: ClassVar[str] = "lowrank"
    needs: ClassVar[tuple[str, ...]] = ("train", "select")
    stage: ClassVar[str] = "lowrank+distill"
    filename: ClassVar[str] = "model.lowrank-distilled.onnx"
    key_part: ClassVar[str] = "lowrank"  # a distilled student is still a low-rank one

    steps: int = 200

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError(f"expected --distill STEPS >= 1, got {self.steps}")

    def fitted(self) -> str | None:
        return "the distilled weights, trained on the train split"

    @classmethod
    def from_run(cls, run: RunOptions, ctx: PlanContext, parent: Method | None = None) -> Distill | None:
        return None if run.distill is None else cls(steps=int(run.distill))


class LayerwiseDistillSummary:
    """A student distilled layer by layer, then end to end: what the report records (``to_dict``) and says (``describe``)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def to_dict(self) -> dict[str, Any]:
        return dict(self._data)

    def describe(self) -> str:
        layers = self._data.get("layers") or {}
        rel = ", ".join(f"{v['val_rel_l2_before']:.3g}->{v['val_rel_l2_after']:.3g}" for v in layers.values())
        out = f"distilled {len(layers)} layers ({self._data.get('steps_per_layer')} steps max each); select-split rel L2 per layer {rel}"
        e2e = self._data.get("end_to_end")
        if e2e:
            out += (f"; then end to end on {e2e['train_texts']} texts (hidden states of every layer + embedding): select embedding error "
                    f"{e2e['select_error_before']:.3e} -> {e2e['select_error_after']:.3e} (best at step {e2e['best_step']} of {e2e['steps_run']})")  # fmt: skip
        return out


def distill_slots_(student: nn.Module, subject: TransformSubject, slots: list[ModuleSlot], config: DistillConfig) -> Any:
    """Distil every slot of ``student`` (in place), then, where the subject has one, its whole-model stage."""
    from attn_export.compress.distill import distill_slot_
    from attn_export.compress.lowrank import LowRankLinear

    if len(slots) == 1 and slots[0].layer is None:
        return distill_slot_(slots[0], config)
    layers: dict[int, dict[str, Any]] = {}
    for n, slot in enumerate(slots):
        if slot.frozen and not any(isinstance(m, LowRankLinear) for m in slot.student.modules()):
            continue  # nothing was put in: a frozen layer has nothing to train
        summary = distill_slot_(slot, config).to_dict()
        layers[n if slot.layer is None else slot.layer] = {k: v for k, v in summary.items() if k != "history"}
        log.info("layer %s distilled: val rel L2 %.4g -> %.4g", slot.layer, summary["val_rel_l2_before"], summary["val_rel_l2_after"])
    student.eval()
    e2e = subject.end_to_end(student, config)
    return LayerwiseDistillSummary({"layers": layers, "steps_per_layer": config.steps, "end_to_end": None if e2e is None else e2e.to_dict()})


@register_method(Distill)
def distill(source: Source, config: Distill) -> Artifact:
    from attn_export.compress.distill import DistillConfig

    ctx, subject = source.ctx, source.subject
    ctx.say(f"distillation: up to {config.steps} steps, early stopping on the select split")
    student = copy.deepcopy(source.artifact.module)
    known = {f.name for f in fields(DistillConfig)}
    settings = DistillConfig(**{**{k: v for k, v in subject.training_defaults().items() if k in known}, "steps": config.steps})
    summary = distill_slots_(student, subject, subject.module_slots(student), settings)
    ctx.say(summary.describe())
    result = subject.export(student, source.path, ctx.fp32_spec)
    details = {"distill": {k: v for k, v in summary.to_dict().items() if k != "history"}, "export": result.to_dict()}
    return ctx.onnx_artifact(source.name, source.path, "fp32", config.tolerance, module=student, onnx_fp32=source.path,
                             params=subject.params(student), details=details)  # fmt: skip
