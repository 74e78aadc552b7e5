"""int8 stages: every requested route is built and measured, then the fastest one that meets
the int8 tolerance is selected and copied to ``model.int8.onnx``.

Routes: ``static`` (Q/DQ, calibrated; the only one TensorRT can take), ``dynamic``
(ONNX Runtime CPU's fastest; DynamicQuantizeLinear is not parsed by TensorRT) and
``torchao`` (eager PyTorch int8, the reference for int8 accuracy; not an ONNX artifact, so
it is reported but never selected for deployment).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from torch import nn

from attn_export._atomic import atomic_path
from attn_export.compress import (
    DYNAMIC_NOT_FOR_TENSORRT,
    CalibrationData,
    StaticQuantSpec,
    check_route_for_target,
    quantize_dynamic_layer,
    quantize_eager_,
    quantize_static_onnx,
)
from attn_export.errors import ConfigError
from attn_export.export import ExportSpec
from attn_export.export.targets import Target
from attn_export.layers import MaskedLayer
from attn_export.runtime import EagerRunner
from attn_export.stages.context import StageContext
from attn_export.validate.report import Stage
from attn_export.validate.tolerances import Tolerance

__all__ = ["INT8_MODES", "run_int8", "select_int8"]

INT8_MODES: tuple[str, ...] = ("auto", "static", "dynamic", "torchao")


def _module_bytes(model: nn.Module) -> int:
    """Bytes of parameters and buffers as stored (int8 tensors count 1 byte per element)."""
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        inner = [getattr(t, a) for a in ("qdata", "int_data", "scale", "zero_point") if hasattr(t, a)]
        total += sum(i.numel() * i.element_size() for i in inner) if inner else t.numel() * t.element_size()
    return total


def routes_for(mode: str, target: Target) -> tuple[list[str], list[str]]:
    """The routes to try for ``--int8-mode`` on ``target``, and notes on the ones left out."""
    if mode not in INT8_MODES:
        raise ConfigError(f"expected --int8-mode in {', '.join(INT8_MODES)}, got {mode!r}")
    wanted = ["static", "dynamic", "torchao"] if mode == "auto" else [mode]
    routes: list[str] = []
    notes: list[str] = []
    for route in wanted:
        if route == "dynamic" and target.is_tensorrt:
            if mode != "auto":
                raise ConfigError(f"--int8-mode dynamic cannot target {target.name}: {DYNAMIC_NOT_FOR_TENSORRT}; use --int8-mode static")
            notes.append(f"int8 route dynamic skipped for target {target.name}: {DYNAMIC_NOT_FOR_TENSORRT}")
            continue
        routes.append(route)
        notes.extend(check_route_for_target(route, target.name))
    return routes, notes


def run_int8(
    ctx: StageContext,
    subject: MaskedLayer,
    subject_onnx: str | Path,
    data: CalibrationData,
    mode: str,
    static_spec: StaticQuantSpec,
    target: Target,
    tolerance: Tolerance,
    export_spec: ExportSpec,
    prefix: str = "int8",
) -> list[Stage]:
    """Build and measure each route for ``subject``; returns the int8 stages."""
    routes, notes = routes_for(mode, target)
    ctx.report.notes.extend(notes)
    stages: list[Stage] = []
    fp32_size = os.path.getsize(subject_onnx)
    for route in routes:
        if route == "torchao":
            ctx.say("int8 torchao: quantize_ with Int8DynamicActivationInt8WeightConfig")
            qmodel = quantize_eager_(subject, "int8-dynamic")
            runner = EagerRunner(qmodel, subject.input_names, ["y"], name="torchao-int8")
            stages.append(
                ctx.evaluate(f"{prefix}-torchao", runner, precision="int8", tolerance=tolerance, artifact=None,
                             size_bytes=_module_bytes(qmodel), details={"route": "torchao", "mode": "int8-dynamic"})
            )  # fmt: skip
            continue
        path = ctx.out / f"model.{prefix}-{route}.onnx"
        if route == "static":
            ctx.say(f"int8 static Q/DQ: {static_spec.method} calibration on {len(data.calib)} sequences")
            result = quantize_static_onnx(subject_onnx, path, data.calib, static_spec)
        else:
            ctx.say("int8 dynamic: ONNX Runtime quantize_dynamic (MatMul weights)")
            result = quantize_dynamic_layer(subject, path, export_spec)  # unfused QKV: faster on CPU
        details = {"route": route, "quantization": result.to_dict(), "size_ratio_vs_fp32": result.size_bytes / fp32_size}
        stages.append(
            ctx.evaluate(f"{prefix}-{route}", ctx.ort(path), precision="int8", tolerance=tolerance, artifact=path,
                         size_bytes=result.size_bytes, details=details)
        )  # fmt: skip
    return stages


def select_int8(ctx: StageContext, stages: list[Stage], key: str = "int8") -> Stage | None:
    """Pick the fastest ONNX int8 stage that passed; copy it to ``model.<key>.onnx``."""
    tried = [
        {"stage": s.name, "passed": s.passed, "p50_ms": s.latency_ms["artifact"].p50, "speedup_vs_eager": s.speedup_vs_eager,
         "cosine": s.accuracy.cosine if s.accuracy else None}
        for s in stages
    ]  # fmt: skip
    candidates = [s for s in stages if s.passed and s.artifact]
    if not candidates:
        ctx.report.notes.append(f"no {key} ONNX route met the int8 tolerance; see the stages' accuracy")
        ctx.report.selection[key] = {"route": None, "tried": tried}
        return None
    best = min(candidates, key=lambda s: s.latency_ms["artifact"].p50)
    final = ctx.out / f"model.{key}.onnx"
    with atomic_path(final) as tmp:
        shutil.copyfile(best.artifact, tmp)  # type: ignore[arg-type]
    ctx.report.selection[key] = {"route": best.details.get("route"), "stage": best.name, "artifact": str(final), "tried": tried}
    ctx.report.notes.append(
        f"selected {best.name} as {final.name}: fastest route meeting the int8 tolerance "
        f"({best.speedup_vs_eager:.2f}x vs eager, cosine {best.accuracy.cosine:.6f})"  # type: ignore[union-attr]
    )
    return best
