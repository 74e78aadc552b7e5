"""``attn-export``: the command-line entry point.

With no subcommand it runs the main job (export the default TransformerLayer, validate it
on ONNX Runtime CPU, write model.onnx + report.json, print a summary). Subcommands are
registered from their own modules. Every user error is one line on stderr and exit 2.
"""

from __future__ import annotations

import os

# torch's OpenMP threads spin-wait by default; on a shared CI box that makes eager latency
# swing 10x and skews every ratio to eager. Set before torch is imported; users may override.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import json
import logging
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from attn_export.cli_options import (
    AttentionOpt,
    BatchOpt,
    BuildEngineOpt,
    BundleOpt,
    CalibMethodOpt,
    CalibOpt,
    CheckpointMainOpt,
    DistillOpt,
    DlaCoreOpt,
    DModelOpt,
    HeadsOpt,
    HwCompatOpt,
    Int8ModeOpt,
    JsonOpt,
    LayerOpt,
    LayersMainOpt,
    LowRankMethodOpt,
    LowRankOpt,
    LowRankTargetsOpt,
    MaskOpt,
    MaxShapeOpt,
    MinShapeOpt,
    OpsetOpt,
    OptLevelOpt,
    OptShapeOpt,
    OutOpt,
    PrecisionOpt,
    QuantizeOpt,
    QuietOpt,
    RepeatsOpt,
    SeedOpt,
    SeqLenOpt,
    SmoothQuantOpt,
    TargetOpt,
    ThreadsOpt,
    TimingCacheOpt,
    TritonOpt,
    TrtVersionOpt,
    VersionCompatOpt,
    WarmupOpt,
    WorkspaceOpt,
)
from attn_export.errors import AttnExportError

__all__ = ["app", "finish", "main", "print_summary"]

app = typer.Typer(
    name="attn-export",
    help="Compress, export and verify attention layers for ONNX Runtime and TensorRT.",
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=False,
)
err_console = Console(stderr=True)
# A pipe or CI log has no terminal width; rich would wrap the table at 80 columns.
out_console = Console(width=None if sys.stdout.isatty() else 160)


@app.callback(invoke_without_command=True)
def run(
    ctx: typer.Context,
    layer: LayerOpt = "transformer",
    d_model: DModelOpt = 512,
    heads: HeadsOpt = 8,
    seq_len: SeqLenOpt = 128,
    batch: BatchOpt = 8,
    mask: MaskOpt = "padding",
    seed: SeedOpt = 0,
    opset: OpsetOpt = None,
    attention: AttentionOpt = None,
    precision: PrecisionOpt = "fp32",
    out: OutOpt = Path("attn-export-out"),
    threads: ThreadsOpt = None,
    warmup: WarmupOpt = 3,
    repeats: RepeatsOpt = 20,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    low_rank: LowRankOpt = None,
    low_rank_method: LowRankMethodOpt = "activation",
    low_rank_targets: LowRankTargetsOpt = None,
    distill: DistillOpt = None,
    quantize: QuantizeOpt = None,
    int8_mode: Int8ModeOpt = "auto",
    calib: CalibOpt = None,
    calib_method: CalibMethodOpt = "minmax",
    smoothquant: SmoothQuantOpt = None,
    target: TargetOpt = "ort-cpu",
    trt_version: TrtVersionOpt = None,
    min_shape: MinShapeOpt = None,
    opt_shape: OptShapeOpt = None,
    max_shape: MaxShapeOpt = None,
    workspace: WorkspaceOpt = None,
    timing_cache: TimingCacheOpt = None,
    hardware_compatibility: HwCompatOpt = "none",
    version_compatible: VersionCompatOpt = False,
    builder_optimization_level: OptLevelOpt = 3,
    dla_core: DlaCoreOpt = None,
    build_engine: BuildEngineOpt = False,
    bundle: BundleOpt = None,
    triton: TritonOpt = None,
    checkpoint: CheckpointMainOpt = None,
    layers: LayersMainOpt = "all",
) -> None:
    """Export a layer to ONNX, validate it against eager PyTorch and write a report."""
    if ctx.invoked_subcommand is not None:
        return
    progress = None if quiet or as_json else (lambda msg: err_console.print(f"[dim]•[/dim] {msg}"))
    if checkpoint is not None:
        from attn_export.checkpoint.cli import encoder_config_from_main

        cfg_enc = encoder_config_from_main(
            checkpoint=checkpoint, layers=layers, out=out, precision=precision, quantize=quantize, int8_mode=int8_mode,
            low_rank=low_rank, low_rank_method=low_rank_method, low_rank_targets=low_rank_targets, distill=distill,
            calib_method=calib_method, attention=attention, opset=opset, batch=batch, seq_len=seq_len, threads=threads,
            warmup=warmup, repeats=repeats, target=target,
        )  # fmt: skip
        from attn_export.checkpoint.pipeline import run_encoder_pipeline

        with err_console.status("working…", spinner="dots") if progress else _nullcontext():
            report = run_encoder_pipeline(cfg_enc, progress)
        finish(report, cfg_enc.out, as_json)
        return
    from attn_export.cli_trt import engine_spec_from_options
    from attn_export.pipeline import PipelineConfig, run_pipeline

    engine = engine_spec_from_options(
        precision="int8" if quantize else precision, min_shape=min_shape, opt_shape=opt_shape, max_shape=max_shape,
        workspace=workspace, timing_cache=timing_cache, hardware_compatibility=hardware_compatibility,
        version_compatible=version_compatible, optimization_level=builder_optimization_level, dla_core=dla_core,
    )  # fmt: skip
    cfg = PipelineConfig(
        layer=layer, d_model=d_model, heads=heads, mask=mask, seq_len=seq_len, batch=batch, opset=opset,
        attention=attention, precision=precision, out=out, seed=seed, threads=threads, warmup=warmup,
        repeats=repeats, low_rank=low_rank, low_rank_method=low_rank_method, low_rank_targets=low_rank_targets or "q,k,v,o",
        distill=distill, quantize=quantize, int8_mode=int8_mode, calib=calib, calib_method=calib_method,
        smoothquant=smoothquant, target=target, trt_version=trt_version, engine=engine, build_engine=build_engine,
        bundle=bundle, triton=triton,
    )  # fmt: skip
    with err_console.status("working…", spinner="dots") if progress else _nullcontext():
        report = run_pipeline(cfg, progress=progress)
    finish(report, cfg.out, as_json)


def finish(report, out: Path, as_json: bool) -> None:  # type: ignore[no-untyped-def]
    """Print the report (table or JSON); exit 1 when any stage missed its tolerance."""
    if as_json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print_summary(report, out)
    if any(s.passed is False for s in report.stages):
        raise typer.Exit(code=1)


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def print_summary(report, out_dir: Path) -> None:  # type: ignore[no-untyped-def]
    """A readable table of every stage: accuracy, latency, speedup, size."""
    m = report.model
    table = Table(title=f"attn-export: {m.get('layer')} d_model={m.get('d_model')} heads={m.get('heads')}")
    for col in ("stage", "precision", "max_abs", "rel_l2", "cosine", "sqnr dB", "p50 ms", "eager p50 ms", "speedup", "size", "ok"):
        table.add_column(col, justify="left" if col in ("stage", "precision") else "right")
    for s in report.stages:
        a = s.accuracy
        lat = s.latency_ms.get("artifact")
        eag = s.latency_ms.get("eager")
        table.add_row(
            s.name,
            s.precision,
            f"{a.max_abs:.2e}" if a else "-",
            f"{a.rel_l2:.2e}" if a else "-",
            f"{a.cosine:.6f}" if a else "-",
            f"{a.sqnr_db:.1f}" if a else "-",
            f"{lat.p50:.2f}" if lat else "-",
            f"{eag.p50:.2f}" if eag else "-",
            f"{s.speedup_vs_eager:.2f}x" if s.speedup_vs_eager else "-",
            _human_bytes(s.size_bytes),
            {True: "[green]PASS[/green]", False: "[red]FAIL[/red]", None: "-"}[s.passed],
        )
    out_console.print(table)
    for note in report.notes:
        out_console.print(f"note: {note}")
    out_console.print(f"wrote {out_dir / 'report.json'}")


def _human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _register_subcommands() -> None:
    """Subcommands live in their own modules; each exposes ``register(app)``."""
    import importlib

    for module in ("attn_export.cli_trt", "attn_export.cli_calib", "attn_export.cli_report", "attn_export.checkpoint.cli"):
        importlib.import_module(module).register(app)


_register_subcommands()


# Options whose value may be omitted (``--low-rank`` alone = ``--low-rank 0.5``). typer's
# bundled click has no optional-value options, so the default is filled in before parsing.
OPTIONAL_VALUE_DEFAULTS: dict[str, str] = {"--low-rank": "0.5", "--distill": "200"}


def fill_optional_values(argv: list[str], defaults: dict[str, str] | None = None) -> list[str]:
    """Insert the default after an optional-value flag that is followed by no value."""
    defaults = OPTIONAL_VALUE_DEFAULTS if defaults is None else defaults
    out: list[str] = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg in defaults:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is None or (nxt.startswith("-") and not _is_number(nxt)):
                out.append(defaults[arg])
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """Console entry point: one-line errors on stderr, exit 2 for usage/config errors."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # torchao's enum registration notice
    argv = fill_optional_values(list(sys.argv[1:] if argv is None else argv))
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="attn-export")
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        print("attn-export: aborted", file=sys.stderr)
        return 130
    except typer.TyperException as e:  # usage errors (bad option, bad value): typer's click
        text = e.format_message() if hasattr(e, "format_message") else str(e)
        print(f"attn-export: error: {' '.join(text.split())}", file=sys.stderr)
        return 2
    except AttnExportError as e:
        msg = " ".join(str(e).split())
        print(f"attn-export: error: {msg}", file=sys.stderr)
        return 2
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
