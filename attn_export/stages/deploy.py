"""Deployment stages for ``--target``: the static TensorRT check, an optional engine build
(validated like any other artifact), the Jetson bundle and the Triton model repository.

The static check runs before every build and bundle; its errors stop the run with the
findings, so nothing is built from a graph the target's parser would reject.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from attn_export.errors import CompatibilityError
from attn_export.export.jetson_bundle import write_jetson_bundle
from attn_export.export.targets import Target
from attn_export.export.triton_repo import write_triton_repo
from attn_export.export.trt_compat import check_trt_compat, report_dict
from attn_export.runtime.trt_spec import EngineSpec
from attn_export.stages.context import StageContext
from attn_export.validate.report import Stage
from attn_export.validate.tolerances import tolerance_for

__all__ = ["check_for_target", "build_and_validate_engine", "write_bundle", "write_triton"]


def check_for_target(ctx: StageContext, onnx_path: str | Path, target: Target, spec: EngineSpec, trt_version: str) -> dict:
    """Static TensorRT check of ``onnx_path``; raises CompatibilityError listing the errors."""
    ctx.say(f"static TensorRT {trt_version} check of {Path(onnx_path).name} for target {target.name}")
    report = check_trt_compat(onnx_path, trt_version, spec.profiles, spec.precision)
    data = report_dict(report)
    for finding in report.warnings:
        ctx.report.notes.append(f"trt-check {trt_version}: {finding}")
    if not report:
        errors = "; ".join(str(f) for f in report.errors)
        raise CompatibilityError(f"{Path(onnx_path).name} fails the TensorRT {trt_version} check: {errors}")
    return data


def build_and_validate_engine(ctx: StageContext, onnx_path: str | Path, spec: EngineSpec, name: str) -> Stage:
    """Build with the TensorRT Python API, then validate the engine beside eager."""
    from attn_export.runtime.tensorrt import EngineFromPath, TrtRunner, build_engine

    engine_path = ctx.out / f"{Path(onnx_path).stem}.engine"
    ctx.say(f"building TensorRT engine {engine_path.name} ({spec.precision})")
    result = build_engine(onnx_path, engine_path, spec)
    ctx.report.notes.extend(result.warnings)
    stage = ctx.evaluate(
        name,
        TrtRunner(EngineFromPath(engine_path)),
        precision=spec.precision,
        tolerance=tolerance_for("fp16" if spec.precision == "fp32" else spec.precision),
        artifact=engine_path,
        size_bytes=result.size_bytes,
        details={"engine": result.to_dict()},
    )
    return stage


def write_bundle(ctx: StageContext, onnx_path: str | Path, bundle_dir: Path, spec: EngineSpec, precision: str, trt_version: str) -> Path:
    ctx.say(f"writing Jetson bundle {bundle_dir}")
    feed = dict(ctx.feeds[0])
    path = write_jetson_bundle(onnx_path, bundle_dir, spec, feed, ctx.refs[0], tolerance_for(precision), trt_version=trt_version)
    ctx.report.selection.setdefault("deploy", {})["jetson_bundle"] = str(path)
    return path


def write_triton(ctx: StageContext, onnx_path: str | Path, repo_dir: Path, spec: EngineSpec, engine_path: str | None) -> Path:
    ctx.say(f"writing Triton model repository {repo_dir}")
    max_batch = spec.profiles.max[0] if spec.profiles else None
    path = write_triton_repo(repo_dir, "attn", onnx_path, engine_path, max_batch_size=max_batch, profiles=spec.profiles)
    ctx.report.selection.setdefault("deploy", {})["triton_repo"] = str(path)
    return path


def with_precision(spec: EngineSpec, precision: str) -> EngineSpec:
    return dataclasses.replace(spec, precision=precision)
