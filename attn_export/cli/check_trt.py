"""``attn-export check-trt``: the static TensorRT check from the command line.

    attn-export check-trt model.onnx --trt 10.3 --min-shape 1x16 --opt-shape 8x128 --max-shape 32x512

prints one finding per line (severity, node name, op, message) and exits 1 when any is an
error, 2 on bad input (missing file, malformed shape); no GPU or TensorRT needed.
``engine_spec_from_options`` turns the engine option group (shapes, workspace, timing
cache, compatibility, DLA) into an ``EngineSpec`` for the main command.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Optional

import typer

from attn_export.cli.help import one_of
from attn_export.errors import ConfigError
from attn_export.host.memory import parse_bytes
from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile
from attn_export.targets.length_buckets import parse_length_buckets
from attn_export.targets.trt_releases import known_releases
from attn_export.vocab.precisions import precision_names

__all__ = ["PRECISIONS", "register", "check_trt", "engine_default", "engine_spec_from_options"]

PRECISIONS = precision_names()

log = logging.getLogger(__name__)


def engine_default(name: str) -> Any:
    """``EngineSpec``'s default for its field ``name``: the engine options' defaults (here and in the main command) are its."""
    return next(f.default for f in dataclasses.fields(EngineSpec) if f.name == name)



def engine_spec_from_options(
    precision: str = engine_default("precision"),
    min_shape: str | None = None,
    opt_shape: str | None = None,
    max_shape: str | None = None,
    workspace: str | None = None,
    timing_cache: str | None = engine_default("timing_cache"),
    hardware_compatibility: str = engine_default("hardware_compatibility"),
    version_compatible: bool = engine_default("version_compatible"),
    optimization_level: int = engine_default("optimization_level"),
    dla_core: int | None = engine_default("dla_core"),
    gpu_fallback: bool = engine_default("gpu_fallback"),
    strongly_typed: bool | None = engine_default("strongly_typed"),
    length_buckets: str | None = None,
    sort_window: int | None = engine_default("sort_window"),
) -> EngineSpec:
    """The CLI's engine options as an ``EngineSpec`` (validated there)."""
    return EngineSpec(
        precision=precision,
        profiles=ShapeProfile.parse(min_shape, opt_shape, max_shape),
        workspace_bytes=parse_bytes(workspace, "--workspace"),
        timing_cache=timing_cache,
        hardware_compatibility=hardware_compatibility,
        version_compatible=version_compatible,
        optimization_level=optimization_level,
        dla_core=dla_core,
        gpu_fallback=gpu_fallback,
        strongly_typed=strongly_typed,
        length_buckets=parse_length_buckets(length_buckets) or None,
        sort_window=sort_window,
    )


def check_trt(
    model: Path = typer.Argument(..., help="ONNX model to check."),
    trt: str = typer.Option("10.3", "--trt", help=f"TensorRT release to check against ({known_releases()}; 10.3 = JetPack 6, 10.13 = JetPack 7.0 on Thor)."),
    min_shape: Optional[str] = typer.Option(None, "--min-shape", help="Profile min BATCHxSEQ, e.g. 1x16.", show_default="none: dynamic dims are flagged"),
    opt_shape: Optional[str] = typer.Option(None, "--opt-shape", help="Profile opt BATCHxSEQ, e.g. 8x128.", show_default="none"),
    max_shape: Optional[str] = typer.Option(None, "--max-shape", help="Profile max BATCHxSEQ, e.g. 32x512.", show_default="none"),
    precision: Optional[str] = typer.Option(None, "--precision", help=f"Engine precision: {one_of(PRECISIONS)}.", show_default="from the graph"),
    gpu_arch: Optional[str] = typer.Option(None, "--gpu-arch", help="GPU the engine is for (sm87 Orin, sm89 Ada, sm90 Hopper, sm100 Blackwell...): FP8 is checked against it.", show_default="unchecked"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the findings as JSON.", show_default="none"),
    errors_only: bool = typer.Option(False, "--errors-only", metavar="", help="Print errors only."),
) -> None:
    """Check an ONNX model against what TensorRT's parser and builder accept (no GPU needed)."""
    from attn_export.checks.trt_compat import check_trt_compat, report_dict
    from attn_export.cli._common import writing
    from attn_export.host.paths import check_input_file, check_output_file

    # the model, the --json path and every option before the check runs
    check_input_file(model, "MODEL")
    if json_out is not None:
        check_output_file(json_out, "--json")
    if precision is not None and precision not in PRECISIONS:
        raise ConfigError(f"expected --precision in {'|'.join(PRECISIONS)}, got {precision!r}")
    profiles = ShapeProfile.parse(min_shape, opt_shape, max_shape)
    if gpu_arch is not None:
        from attn_export.targets.gpu_arch import parse_gpu_arch

        gpu_arch = parse_gpu_arch(gpu_arch)
    report = check_trt_compat(model, trt, profiles, precision, gpu_arch=gpu_arch)
    shown = report.errors if errors_only else report.findings
    lines = str(report).splitlines()
    typer.echo(lines[0])
    for finding in shown:
        typer.echo(str(finding))
    if json_out is not None:
        from attn_export.validate.report import atomic_write_text

        with writing(json_out, "--json"):
            atomic_write_text(json_out, json.dumps(report_dict(report), indent=2) + "\n")
    raise typer.Exit(0 if report else 1)


def register(app: typer.Typer) -> None:
    """Add ``check-trt`` to the main ``attn-export`` app."""
    app.command("check-trt")(check_trt)
