"""Deploy steps of the plan: the static TensorRT check, an engine, the Jetson bundle, the session options, the Triton repository.

Each takes the ONNX model the run deploys (the selected int8 route, the distilled student or
the plain export) and works for every subject: the reference inputs and outputs a bundle
checks on the device are the subject's own report-split inputs and eager outputs. The
static check runs before every build and bundle, so nothing is built from a graph the
target's parser would reject.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attn_export.errors import CompatibilityError

__all__ = ["check_for_target", "session_options_for", "write_bundle", "write_triton"]

log = logging.getLogger(__name__)


def check_for_target(onnx_path: Path, target: Any, spec: Any, trt_version: str, notes: list[str], say: Callable[[str], None]) -> dict[str, Any]:
    """Static TensorRT check of ``onnx_path``; raises CompatibilityError listing the errors."""
    from attn_export.checks.trt_compat import check_trt_compat, report_dict

    say(f"static TensorRT {trt_version} check of {onnx_path.name} for target {target.name}")
    report = check_trt_compat(onnx_path, trt_version, spec.profiles, spec.precision, gpu_arch=spec.gpu_arch)
    data = report_dict(report)
    for finding in report.warnings:
        notes.append(f"trt-check {trt_version}: {finding}")
    if not report:
        errors = "; ".join(str(f) for f in report.errors)
        raise CompatibilityError(f"{onnx_path.name} fails the TensorRT {trt_version} check: {errors}")
    return data


def session_options_for(onnx_path: Path, target: Any, spec: Any, say: Callable[[str], None]) -> dict[str, Any]:
    """The session and provider options a deployment of ``onnx_path`` on ``target`` must set, from the runtime module its
    ``session_options`` names (``module:function(onnx_path, spec) -> dict``): written into the report, not guessed by the user."""
    import importlib

    module, _, name = target.session_options.partition(":")
    say(f"session options for target {target.name} ({spec.precision})")
    return dict(getattr(importlib.import_module(module), name)(onnx_path, spec))


def write_bundle(subject: Any, onnx_path: Path, bundle_dir: Path, spec: Any, precision: str, trt_version: str, say: Callable[[str], None],
                 gemms: tuple[Any, ...] = ()) -> Path:  # fmt: skip
    """The Jetson bundle of ``onnx_path``, checked on the device against the subject's own reference outputs.

    Every output the subject returns is compared on the device, each with the tolerance the
    subject gives it (``Subject.bundle_reference``), not the first output's for all.
    """
    from attn_export.deploy.jetson_bundle import write_jetson_bundle

    say(f"writing Jetson bundle {bundle_dir}")
    feed, reference, tolerances = subject.bundle_reference(precision)
    return write_jetson_bundle(onnx_path, bundle_dir, spec, feed, reference, tolerances, trt_version=trt_version, gemms=gemms)


def write_triton(onnx_path: Path, repo_dir: Path, spec: Any, engine_path: Path | None, model_name: str, say: Callable[[str], None],
                 hand_config: Path | None = None) -> Path:  # fmt: skip
    from attn_export.deploy.triton_repo import write_triton_repo

    say(f"writing Triton model repository {repo_dir}")
    profiles = spec.optimization_profiles
    max_batch = min(p.max[0] for p in profiles) if profiles else None  # the largest batch every profile holds
    return write_triton_repo(repo_dir, model_name, onnx_path, engine_path, max_batch_size=max_batch, profiles=spec.profiles, hand_config=hand_config)
