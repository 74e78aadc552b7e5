"""CLI subcommands for checking and showing results: ``check``, ``bench``, ``sweep``, ``report``.

Wired into the main app with ``register(app)``. Conventions follow ``attn_export.cli``:
user errors are ``AttnExportError``s (one line, exit 2 from ``main``), a regression exits 1,
progress goes to stderr and is silenced by ``--quiet``/``--json``, results go to stdout.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from attn_export.errors import ConfigError

__all__ = ["register"]

# Logs and CI capture are not terminals: rich would wrap the wide tables at 80 columns there.
_out = Console(width=None if sys.stdout.isatty() else 200)
_err = Console(stderr=True)

QuietFlag = Annotated[bool, typer.Option("--quiet", "-q", help="No progress output; print only the result.")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
ThreadsFlag = Annotated[int | None, typer.Option("--threads", help="Threads for eager and ONNX Runtime (default: all cores).")]


@contextmanager
def _progress(enabled: bool, label: str) -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress bar on stderr fed by ``callback(message, done, total)``."""
    if not enabled:
        yield lambda msg, done, total: None
        return
    if not _err.is_terminal:  # CI logs: one plain line per step instead of a redrawn bar
        yield lambda msg, done, total: _err.print(f"{label} [{done}/{total or '?'}] {msg}", highlight=False)
        return
    cols = (TextColumn(f"[bold]{label}[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"))
    with Progress(*cols, console=_err, transient=True) as bar:
        task = bar.add_task("", total=None)
        yield lambda msg, done, total: bar.update(task, description=msg, completed=done, total=total if total > 0 else None)


def _ints(text: str | None, flag: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise ConfigError(f"expected {flag} as comma-separated integers like 128,512, got {text!r}") from None


def _floats(text: str | None, flag: str) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        return tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise ConfigError(f"expected {flag} as comma-separated numbers like 1,0.5, got {text!r}") from None


def _strs(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(t.strip() for t in text.split(",") if t.strip())


def _passive_thread_pools() -> None:
    """OMP_WAIT_POLICY=PASSIVE (unless the user set it) before torch loads libgomp.

    Timed side by side in one process, torch's spinning OpenMP workers and ONNX Runtime's
    pools steal each other's cores; on a loaded 2-core machine eager ran 20x slower with
    2 threads than with 1. The variable is read once, when torch is first imported.
    """
    if "torch" in sys.modules:
        if "OMP_WAIT_POLICY" not in os.environ:
            _err.print(
                "note: torch was imported before OMP_WAIT_POLICY could be set; for fair side-by-side timing on a busy "
                "machine run OMP_WAIT_POLICY=PASSIVE attn-export ...",
                highlight=False,
            )
        return
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _output_file(path: Path, flag: str) -> None:
    """Refuse, before any work, an output file that is a directory or in an unwritable folder."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: expected a file path, got a directory; pass a file name such as {path / 'out.json'}")
    parent = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
    if parent is not None and (not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK)):
        raise ConfigError(f"{flag} {path}: expected a writable folder, got {parent} ({'not a folder' if not parent.is_dir() else 'not writable'}); pass a writable path")


@contextmanager
def _writing(path: Path, flag: str) -> Iterator[None]:
    """An OSError while writing an output (read-only folder, /proc, a full disk) as one line."""
    try:
        yield
    except OSError as err:
        raise ConfigError(f"{flag} {path}: expected a writable path, got {err.strerror or err}; pass a writable path") from None


def run_check(
    report: Path,
    baseline: Path,
    *,
    update_baseline: bool = False,
    prune: bool = False,
    allow_empty: bool = False,
    junit: Path | None = None,
    latency_margin: float | None = None,
    quiet: bool = False,
    as_json: bool = False,
) -> int:
    """The ``check`` command: gate ``report`` against ``baseline`` (or update it); returns the exit code."""
    from attn_export.validate.gate import check_report
    from attn_export.validate.gate import update_baseline as record
    from attn_export.validate.junit import write_junit
    from attn_export.validate.report import atomic_write_text, load_report
    from attn_export.validate.schema import read_json

    if prune and not update_baseline:
        raise ConfigError("--prune only applies with --update-baseline; add --update-baseline or drop --prune")
    if junit is not None:
        _output_file(junit, "--junit")
    if update_baseline:
        _output_file(baseline, "--baseline")
    data = load_report(report)
    if update_baseline:
        previous = read_json(baseline, "a baseline", "fix it or move it aside") if baseline.exists() else None
        if previous is not None and not quiet and not as_json:  # the old-vs-new diff, before it is overwritten
            old = check_report(data, previous, latency_margin, allow_empty=True, report_name=str(report), baseline_name=str(baseline))
            _out.print(str(old), highlight=False, soft_wrap=True, markup=False)
        update = record(data, previous, prune=prune, allow_empty=allow_empty, report_name=str(report), baseline_name=str(baseline))
        with _writing(baseline, "--baseline"):
            atomic_write_text(baseline, json.dumps(update.baseline, indent=2) + "\n")
        if as_json:
            print(json.dumps({"updated": str(baseline), "cpu_class": update.cpu_class, "kept": update.kept, "removed": update.removed}))
        else:
            _out.print(f"updated baseline {baseline} from {report}: {update.describe()}", highlight=False, soft_wrap=True, markup=False)
        return 0
    fix = f"create it with attn-export check {report} --baseline {baseline} --update-baseline"
    result = check_report(data, read_json(baseline, "a baseline", fix), latency_margin, allow_empty=allow_empty,
                          report_name=str(report), baseline_name=str(baseline))  # fmt: skip
    if junit is not None:
        with _writing(junit, "--junit"):
            write_junit(result, junit)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    elif quiet:
        print(result.summary())
    else:
        _out.print(str(result), highlight=False, soft_wrap=True, markup=False)  # CI logs: one table row per line, never wrapped
    return 0 if result else 1


def check(
    report: Annotated[Path, typer.Argument(help="report.json written by attn-export.")],
    baseline: Annotated[Path, typer.Option("--baseline", help="Committed baseline JSON (see docs/ci-gate.md).")],
    update_baseline: Annotated[bool, typer.Option("--update-baseline", help="Record this report's figures as its CPU class's entry (keeps tolerances and other classes).")] = False,
    prune: Annotated[bool, typer.Option("--prune", help="With --update-baseline: also remove stages/metrics this report lacks (listed).")] = False,
    allow_empty: Annotated[bool, typer.Option("--allow-empty", help="Accept a baseline with no stages (normally an error: it checks nothing).")] = False,
    junit: Annotated[Path | None, typer.Option("--junit", help="Also write JUnit XML here (one test case per stage/metric).")] = None,
    latency_margin: Annotated[float | None, typer.Option("--latency-margin", help="Also fail if speedup_vs_eager drops below baseline*(1-margin), e.g. 0.2.")] = None,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Compare a report against a baseline; exit 1 on an accuracy (or latency-ratio) regression."""
    code = run_check(report, baseline, update_baseline=update_baseline, prune=prune, allow_empty=allow_empty, junit=junit,
                     latency_margin=latency_margin, quiet=quiet, as_json=as_json)  # fmt: skip
    if code:
        raise typer.Exit(code=code)


def bench(
    quick: Annotated[bool, typer.Option("--quick", help="Small grid (L 128,512 x B 1,8), fewer repeats: under 3 minutes on 2 cores.")] = False,
    json_path: Annotated[Path | None, typer.Option("--json", help="Where to write the results JSON (default: OUT/bench.json).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Output folder for bench.json, bench.md and seq_scaling.png.")] = Path("attn-export-bench"),
    seqs: Annotated[str | None, typer.Option("--seqs", help="Sequence lengths, e.g. 128,512,1024,2048,4096.")] = None,
    batches: Annotated[str | None, typer.Option("--batches", help="Batch sizes, e.g. 1,8.")] = None,
    variants: Annotated[str | None, typer.Option("--variants", help="Comma-separated subset of the variants (default: all).")] = None,
    d_model: Annotated[int, typer.Option("--d-model", help="Model width of the default TransformerLayer.")] = 512,
    heads: Annotated[int, typer.Option("--heads", help="Attention heads.")] = 8,
    ceiling_size: Annotated[int | None, typer.Option("--ceiling-size", help="N of the NxN GEMMs that measure the ceilings (default 2048, quick 1024).")] = None,
    threads: ThreadsFlag = None,
    quiet: QuietFlag = False,
) -> None:
    """Every variant side by side: latency, ratio to eager, memory, efficiency vs measured GEMM ceilings."""
    _passive_thread_pools()
    from attn_export.benchmark import (
        BenchConfig,
        markdown_tables,
        results_table,
        run_bench,
        variants_table,
    )
    from attn_export.validate.plots import plot_seq_scaling
    from attn_export.validate.report import atomic_write_text

    overrides: dict[str, Any] = {"d_model": d_model, "heads": heads, "threads": threads}
    for key, val in (("seqs", _ints(seqs, "--seqs")), ("batches", _ints(batches, "--batches")), ("variants", _strs(variants)), ("ceiling_size", ceiling_size)):
        if val is not None:
            overrides[key] = val
    cfg = BenchConfig.quick(**overrides) if quick else BenchConfig(**overrides)
    out.mkdir(parents=True, exist_ok=True)
    with _progress(not quiet, "bench") as cb:
        result = run_bench(cfg, progress=cb)
    target = json_path or out / "bench.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, json.dumps(result, indent=2) + "\n")
    atomic_write_text(out / "bench.md", "# attn-export bench\n\n" + markdown_tables(result))
    plot_seq_scaling(result, out / "seq_scaling.png")
    if not quiet:
        _out.print(results_table(result))
        _out.print(variants_table(result))
        for s in result["skipped"]:
            _out.print(f"skipped batch {s['batch']}, seq {s['seq']}: {s['reason']}", highlight=False)
    _out.print(f"wrote {target}, {out / 'bench.md'}, {out / 'seq_scaling.png'}", highlight=False)


def sweep(
    quick: Annotated[bool, typer.Option("--quick", help="Small grid: rank 1,0.5 x distill 0,40 x int8 none,dynamic,static(minmax) x fp32,fp16.")] = False,
    out: Annotated[Path, typer.Option("--out", help="Output folder for sweep.json, pareto.md and pareto.png.")] = Path("attn-export-sweep"),
    rank_ratios: Annotated[str | None, typer.Option("--rank-ratios", help="Low-rank ratios, 1 = none (default 1,0.75,0.5,0.25).")] = None,
    distill_steps: Annotated[str | None, typer.Option("--distill-steps", help="Distillation steps (default 0,100,300).")] = None,
    int8_modes: Annotated[str | None, typer.Option("--int8-modes", help="none|dynamic|static (default all).")] = None,
    calib_methods: Annotated[str | None, typer.Option("--calib-methods", help="Static int8 calibration: minmax|percentile|entropy (default all).")] = None,
    precisions: Annotated[str | None, typer.Option("--precisions", help="fp32|fp16 (default both).")] = None,
    low_rank_targets: Annotated[str | None, typer.Option("--low-rank-targets", help="Linears to factorize (default q,k,v,o,ffn).")] = None,
    d_model: Annotated[int, typer.Option("--d-model", help="Model width.")] = 512,
    heads: Annotated[int, typer.Option("--heads", help="Attention heads.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Seed for weights, data and distillation.")] = 0,
    batch: Annotated[int, typer.Option("--batch", help="Batch size of the latency input.")] = 8,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Sequence length of the latency input.")] = 128,
    repeats: Annotated[int | None, typer.Option("--repeats", help="Timed runs per configuration (default 10, quick 5).")] = None,
    calibration: Annotated[Path | None, typer.Option("--calibration", help="Calibration data (.npz/.safetensors); default: the shipped set.")] = None,
    threads: ThreadsFlag = None,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Grid over compression choices; prints the Pareto front with a reproducible recipe per row."""
    _passive_thread_pools()
    from attn_export.sweep import (
        PARETO_COLUMNS,
        SweepConfig,
        pareto_rows,
        run_sweep,
        write_sweep,
    )

    grid = {
        "rank_ratios": _floats(rank_ratios, "--rank-ratios"), "distill_steps": _ints(distill_steps, "--distill-steps"),
        "int8_modes": _strs(int8_modes), "calib_methods": _strs(calib_methods), "precisions": _strs(precisions),
        "low_rank_targets": _strs(low_rank_targets), "repeats": repeats,
    }  # fmt: skip
    overrides: dict[str, Any] = {k: v for k, v in grid.items() if v is not None}
    overrides.update(d_model=d_model, heads=heads, seed=seed, batch=batch, seq_len=seq_len, threads=threads,
                     calibration=str(calibration) if calibration else None)  # fmt: skip
    cfg = SweepConfig.quick(**overrides) if quick else SweepConfig(**overrides)
    with _progress(not (quiet or as_json), f"sweep ({len(cfg.points())} configs)") as cb:
        result = run_sweep(cfg, progress=cb)
    files = write_sweep(result, out)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    table = Table(title=f"Pareto front: {len(result['pareto'])} of {len(result['points'])} configurations (SQNR vs p50 latency)")
    for col in PARETO_COLUMNS:
        table.add_column(col, justify="left" if col in ("config", "recipe") else "right", overflow="fold")
    for row in pareto_rows(result):
        table.add_row(*row)
    _out.print(table)
    if not quiet:
        _out.print(f"wrote {', '.join(str(p) for p in files.values())}", highlight=False)


def run_report(
    report_json: Path,
    out: Path | None = None,
    bench_json: Path | None = None,
    attention_maps: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """The ``report`` command: render report.md, report.html and the plots; returns name -> path."""
    from attn_export.validate.render import write_reports

    target = out or report_json.parent
    if target.exists() and not target.is_dir():
        raise ConfigError(f"--out {target}: expected a folder, got a file; pass a folder for report.md and report.html")
    _output_file(target / "report.html", "--out")
    with _writing(target, "--out"):
        return write_reports(report_json, target, bench_json, "auto" if attention_maps else None, progress=progress)


def report(
    report_json: Annotated[Path, typer.Argument(help="report.json written by attn-export.")],
    out: Annotated[Path | None, typer.Option("--out", help="Output folder (default: the report's folder).")] = None,
    bench_json: Annotated[Path | None, typer.Option("--bench", help="bench.json to add latency/memory vs sequence length.")] = None,
    attention_maps: Annotated[bool, typer.Option("--attention-maps/--no-attention-maps", help="Rebuild the layer and draw eager vs ONNX attention maps.")] = True,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Render report.md and a self-contained report.html (plots embedded) from a report.json."""
    with _progress(not (quiet or as_json), "report") as cb:
        files = run_report(report_json, out, bench_json, attention_maps, progress=lambda msg: cb(msg, 0, 0))
    if as_json:
        print(json.dumps({k: str(v) for k, v in files.items()}, indent=2))
    elif not quiet:
        for path in files.values():
            _out.print(f"wrote {path}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``check``, ``bench``, ``sweep`` and ``report`` to the ``attn-export`` app."""
    app.command("check")(check)
    app.command("bench")(bench)
    app.command("sweep")(sweep)
    app.command("report")(report)
