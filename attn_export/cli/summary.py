"""What the terminal shows at the end of a run: the verdict line, the stage table, then where everything went.

The first line is the report's headline (``validate.headline``: PASS/PARTIAL/FAIL, the file
that ships and why, its accuracy on every judged data set, its speed-up and size), the same
line report.md and report.html open with; the other selections (the fp32 form's) follow it. Sizes are binary (MiB, ``resources.format_bytes``). The last lines name every artifact written (models, reports, plots, bundle, Triton
repository), the TensorRT check's verdict, the int8 selection and why, and the notes (e.g.
profitability), so a user never has to open report.json to find the result.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

__all__ = ["artifact_paths", "finish", "print_summary"]


def artifact_paths(report: Any, out: Path) -> list[str]:
    """Every file and folder the run wrote, in a stable order."""
    paths: list[str] = []
    for s in report.stages:
        if s.artifact:
            paths.append(str(s.artifact))
    for sel in report.selection.values():
        if isinstance(sel, dict) and sel.get("artifact"):
            paths.append(str(sel["artifact"]))
    for name in ("report.json", "report.md", "report.html"):
        if (out / name).is_file():
            paths.append(str(out / name))
    from attn_export.outdir.recovery import REPORT_FILES

    paths.extend(str(out / name) for name in REPORT_FILES if name.endswith(".png") and (out / name).is_file())  # not a user's own .png
    deploy = report.selection.get("deploy") or {}
    for key in ("jetson_bundle", "triton_repo"):
        if deploy.get(key):
            paths.append(str(deploy[key]))
    return list(dict.fromkeys(paths))


def print_summary(report: Any, out: Path, console: Any) -> None:
    """The verdict line, a table of every stage (accuracy, latency, speedup, size), then artifacts and verdicts."""
    from rich.table import Table

    from attn_export.host.memory import format_bytes
    from attn_export.validate.headline import headline
    from attn_export.validate.verdict import PARTIAL, PASS

    line = headline(report.to_dict())
    colour = {PASS: "green", PARTIAL: "yellow"}.get(line.verdict, "red")
    console.print(f"[bold {colour}]{line.verdict}[/bold {colour}]", end=" | ")
    console.print(" | ".join(line.parts()), highlight=False, markup=False, soft_wrap=True)
    for below in line.below:
        console.print(below, highlight=False, markup=False, soft_wrap=True)
    m = report.model
    embedding = any(s.details.get("embedding") for s in report.stages)  # a checkpoint: the figures docs/encoder.md judges by
    table = Table(title=f"attn-export: {m.get('layer')} d_model={m.get('d_model')} heads={m.get('heads')}")
    columns = ["stage", "precision", "max_abs", "rel_l2", "mean cos" if embedding else "cosine", *(("min cos", "top-1") if embedding else ()),
               "sqnr dB", "p50 ms", "eager p50 ms", "speedup", "size", "ok"]  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col in ("stage", "precision") else "right")
    for s in report.stages:
        a = s.accuracy
        lat, eag = s.latency_ms.get("artifact"), s.latency_ms.get("eager")
        emb = s.details.get("embedding")
        cosines = [f"{emb['mean_cosine']:.6f}", f"{emb['min_cosine']:.6f}", f"{100 * emb['top1_neighbor_agreement']:.1f}%"] if emb else (
            [f"{a.cosine:.6f}" if a else "-"] + (["-", "-"] if embedding else []))  # fmt: skip
        table.add_row(
            s.details.get("label") or s.name, s.precision,
            f"{a.max_abs:.2e}" if a else "-", f"{a.rel_l2:.2e}" if a else "-", *cosines, f"{a.sqnr_db:.1f}" if a else "-",
            f"{lat.p50:.2f}" if lat else "-", f"{eag.p50:.2f}" if eag else "-",
            f"{s.speedup_vs_eager:.2f}x" if s.speedup_vs_eager else "-", "-" if s.size_bytes is None else format_bytes(s.size_bytes),
            {True: "[green]PASS[/green]", False: "[red]FAIL[/red]", None: "-"}[s.passed],
        )  # fmt: skip
    console.print(table)
    for note in report.notes:
        console.print(f"note: {note}", highlight=False, markup=False)
    deploy = report.selection.get("deploy") or {}
    check = deploy.get("trt_check")
    if check:
        n_err = sum(1 for f in check.get("findings", []) if f.get("severity") == "error")
        n_warn = sum(1 for f in check.get("findings", []) if f.get("severity") == "warning")
        verdict = "PASS" if check.get("passed") else "FAIL"
        console.print(f"TensorRT {check.get('trt_version')} check: {verdict} ({n_err} errors, {n_warn} warnings)", highlight=False)
    sel = report.selection.get("int8")
    if sel:
        if sel.get("route"):
            console.print(f"int8 selection: {sel['stage']} -> {Path(sel['artifact']).name} ({sel.get('reason', '')})", highlight=False, markup=False)
        else:
            console.print(f"int8 selection: none ({sel.get('reason', '')})", highlight=False, markup=False)
    verdict = report.verdict
    if verdict.get("failures"):
        for failure in verdict["failures"]:
            console.print(f"FAILED: {failure}", highlight=False, markup=False)
    console.print("wrote:", highlight=False)
    for path in artifact_paths(report, out):
        console.print(f"  {path}", highlight=False, markup=False)


def finish(result: Any, cfg: Any, as_json: bool, quiet: bool, progress_console: Any = None) -> int:
    """Print the report (table or JSON); returns the verdict's exit code (``validate.verdict.EXIT_CODES``: 1 FAIL, 3 PARTIAL).

    The run is committed before this prints: a standard output that cannot be written (``>
    /dev/full``, a closed pipe) is refused in one line that names it and says where the run is,
    never blamed on --out."""
    from attn_export.cli._common import out_console
    from attn_export.cli.app import StdoutError, check_stdout_written
    from attn_export.errors import ConfigError

    report = result.report
    try:
        if as_json:
            print(json.dumps(report.to_dict(), indent=2, default=str))
        elif quiet:
            print(f"{result.verdict.state}: {cfg.out / 'report.json'}")
        else:
            print_summary(report, cfg.out, out_console)
        check_stdout_written()
    except (OSError, StdoutError) as err:
        if isinstance(err, OSError) and err.filename is not None:
            raise
        why = (err.strerror if isinstance(err, OSError) else None) or str(err)
        with contextlib.suppress(StdoutError):
            check_stdout_written()  # stdout to /dev/null: the interpreter's flush at exit cannot fail again
        raise ConfigError(f"cannot write to standard output: {why}; the run completed ({result.verdict.state}) and is in "
                          f"{cfg.out} (report.json); redirect standard output to a writable file to see its summary") from None
    return result.exit_code
