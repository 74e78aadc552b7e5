"""``attn-export report``: render report.md and a self-contained report.html from a report.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from attn_export.cli._common import JsonFlag, QuietFlag, out_console, progress_bar, writing
from attn_export.cli.options import ForceOpt
from attn_export.errors import ConfigError
from attn_export.host.paths import check_name_lengths, check_output_file

__all__ = ["register", "run_report"]


def run_report(
    report_json: Path,
    out: Path | None = None,
    bench_json: Path | None = None,
    attention_maps: bool = True,
    progress: Callable[[str], None] | None = None,
    force: bool = False,
) -> dict[str, Path]:
    """The ``report`` command: render report.md, report.html and the plots; returns name -> path.

    The folder is claimed for those names only (``run_dir.claim(names=...)``): a run's other
    files there stay, and stay listed in its run.json; a report.md attn-export did not write is
    refused, or moved beside the folder with ``force``."""
    from attn_export.outdir.claim import REPORT_FILES, check_owned, claim

    target = out or report_json.parent
    check_name_lengths(target, "--out")
    if target.exists() and not target.is_dir():
        raise ConfigError(f"--out {target}: expected a folder, got a file; pass a folder for report.md and report.html")
    check_output_file(target / "report.html", "--out")
    from attn_export.validate.report import load_report

    load_report(report_json)  # a missing or malformed report is refused before any folder is created or locked
    check_owned(target, "--out", force, names=REPORT_FILES)
    from attn_export.validate.render import write_reports

    with writing(target, "--out"), claim(target, "--out", config={"command": "report"}, force=force, names=REPORT_FILES):
        return write_reports(report_json, target, bench_json, "auto" if attention_maps else None, progress=progress)


def report(
    report_json: Annotated[Path, typer.Argument(help="report.json written by attn-export.")],
    out: Annotated[Path | None, typer.Option("--out", help="Output folder.", show_default="the report's folder")] = None,
    bench_json: Annotated[Path | None, typer.Option("--bench", help="bench.json to add latency/memory vs sequence length.", show_default="none")] = None,
    attention_maps: Annotated[bool, typer.Option("--attention-maps/--no-attention-maps", metavar="", help="Rebuild the layer and draw eager vs ONNX attention maps.", show_default="on")] = True,
    force: ForceOpt = False,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Render report.md and a self-contained report.html (plots embedded) from a report.json."""
    with progress_bar(not (quiet or as_json), "report") as cb:
        files = run_report(report_json, out, bench_json, attention_maps, progress=lambda msg: cb(msg, 0, 0), force=force)
    if as_json:
        print(json.dumps({k: str(v) for k, v in files.items()}, indent=2))
    elif not quiet:
        for path in files.values():
            out_console.print(f"wrote {path}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
