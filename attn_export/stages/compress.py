"""Low-rank and distillation stages: factorize a copy of the layer, export it, measure it.

The factorized layer is only worth shipping if it is faster than the dense one in the
runtime that will run it; each low-rank stage records its latency against the dense ONNX
stage and says "slower than dense" when the factorization does not pay off.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from attn_export.compress import (
    CalibrationData,
    DistillConfig,
    LowRankConfig,
    distill_,
    factorization_is_profitable,
    low_rank_,
)
from attn_export.export import ExportSpec, export_onnx
from attn_export.layers import MaskedLayer
from attn_export.stages.context import StageContext
from attn_export.validate.report import Stage
from attn_export.validate.tolerances import Tolerance

__all__ = ["LOSSY_TOLERANCE", "CompressedModel", "run_low_rank", "run_distill"]

# Low-rank is lossy by design; a layer whose outputs keep cosine >= 0.99 is still usable.
LOSSY_TOLERANCE = Tolerance(cosine_min=0.99)


@dataclass
class CompressedModel:
    """A student layer and its fp32 ONNX export (what int8 quantizes next)."""

    layer: MaskedLayer
    onnx_path: str
    stage: Stage


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _profitability(stage: Stage, dense: Stage | None, summary_layers: dict) -> dict:
    flop_ok = all(factorization_is_profitable(v["m"], v["n"], v["rank"]) for v in summary_layers.values() if "rank" in v)
    info: dict = {"fewer_flops": flop_ok}
    if dense is not None and dense.latency_ms.get("artifact") and stage.latency_ms.get("artifact"):
        ratio = dense.latency_ms["artifact"].p50 / stage.latency_ms["artifact"].p50
        info["speedup_vs_dense_onnx"] = ratio
        info["faster_than_dense"] = ratio > 1.0
    return info


def run_low_rank(
    ctx: StageContext,
    teacher: MaskedLayer,
    data: CalibrationData,
    config: LowRankConfig,
    spec: ExportSpec,
    dense: Stage | None,
) -> CompressedModel:
    """Factorize a copy of ``teacher`` with calibration activations; stage ``lowrank``."""
    student = copy.deepcopy(teacher)
    x, kpm = data.calib.to_torch()
    ctx.say(f"low-rank: {config.method} SVD at {config.rank_ratio} of {','.join(config.targets)} parameters")
    summary = low_rank_(student, config, x, kpm)
    ctx.say(summary.describe())
    path = ctx.out / "model.lowrank.onnx"
    result = export_onnx(student, path, spec)
    stage = ctx.evaluate(
        "lowrank",
        ctx.ort(path),
        precision="fp32",
        tolerance=LOSSY_TOLERANCE,
        artifact=path,
        size_bytes=result.size_bytes,
        params=_params(student),
        details={"low_rank": summary.to_dict(), "export": result.to_dict()},
    )
    stage.details["profitability"] = _profitability(stage, dense, summary.layers)
    if stage.details["profitability"].get("faster_than_dense") is False:
        ctx.report.notes.append(
            f"low-rank at this rank is slower than the dense layer in ONNX Runtime "
            f"({stage.details['profitability']['speedup_vs_dense_onnx']:.2f}x); use a lower --low-rank ratio"
        )
    return CompressedModel(student, str(path), stage)


def run_distill(
    ctx: StageContext,
    teacher: MaskedLayer,
    student: CompressedModel,
    data: CalibrationData,
    config: DistillConfig,
    spec: ExportSpec,
) -> CompressedModel:
    """Distil the student from the original layer on the calibration split; stage ``lowrank+distill``."""
    ctx.say(f"distillation: up to {config.steps} steps, early stopping on the validation split")
    model = student.layer
    torch.manual_seed(config.seed)
    summary = distill_(model, teacher, data.calib, data.val, config)
    model.eval()
    ctx.say(summary.describe())
    path = ctx.out / "model.lowrank-distilled.onnx"
    result = export_onnx(model, path, spec)
    stage = ctx.evaluate(
        "lowrank+distill",
        ctx.ort(path),
        precision="fp32",
        tolerance=LOSSY_TOLERANCE,
        artifact=path,
        size_bytes=result.size_bytes,
        params=_params(model),
        details={"distill": {k: v for k, v in summary.to_dict().items() if k != "history"}, "export": result.to_dict()},
    )
    return CompressedModel(model, str(path), stage)
