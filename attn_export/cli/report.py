"""``attn-export report``: render report.md and a self-contained report.html from a report.json."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer

from attn_export.cli._common import JsonFlag, QuietFlag, out_console, progress_bar, writing
from attn_export.errors import ConfigError
from attn_export.paths import check_output_file

__all__ = ["register", "run_report"]


# Every file ``write_reports`` may write (validate.render._plots and the two pages).
REPORT_FILES = ("report.md", "report.html", "latency.png", "pareto.png", "error_histograms.png", "sensitivity.png", "seq_scaling.png",
                "attention_maps.png")  # fmt: skip


def run_report(
    report_json: Path,
    out: Path | None = None,
    bench_json: Path | None = None,
    attention_maps: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """The ``report`` command: render report.md, report.html and the plots; returns name -> path.

    ``--out DIR`` is owned as the main command owns its ``--out`` (``run_dir.claim``: one writer,
    the earlier run's files kept until this one completes, run.json). The report's own folder
    (the default) belongs to the run that wrote it: the render holds that run's lock while it
    writes, and replaces only the report files its run.json lists.
    """
    from attn_export.run_dir import claim
    from attn_export.validate.render import write_reports
    from attn_export.validate.report import load_report

    target = out or report_json.parent
    if target.exists() and not target.is_dir():
        raise ConfigError(f"--out {target}: expected a folder, got a file; pass a folder for report.md and report.html")
    check_output_file(target / "report.html", "--out")
    load_report(report_json)  # a missing or malformed report is refused before any folder is created or locked
    own_folder = os.path.realpath(target) == os.path.realpath(report_json.parent)
    config = {"command": "report", "report": str(report_json), "bench": str(bench_json) if bench_json else None}
    with writing(target, "--out"), (_holding(target) if own_folder else claim(target, "--out", config=config)):
        return write_reports(report_json, target, bench_json, "auto" if attention_maps else None, progress=progress)


RENDERED_NAME = ".attn-export-report.json"  # in a run folder: the sha256 of each file `report` rendered there


@contextlib.contextmanager
def _holding(folder: Path) -> Iterator[None]:
    """The lock of the run folder ``folder`` for the block (a run in progress there is refused, naming its PID).

    A report file already there is replaced only if the folder's run.json lists it or an earlier
    ``report`` rendered it (``RENDERED_NAME``, with its sha256); anything else is refused."""
    from attn_export.run_dir import LOCK_NAME
    from attn_export.run_dir_aside import read_manifest
    from attn_export.run_dir_fs import OutDir, take_lock

    od = OutDir(folder, "--out")
    try:
        fd = take_lock(od, LOCK_NAME, {"pid": os.getpid(), "command": "report"})
        try:
            manifest, _ = read_manifest(od)
            listed = set((manifest or {}).get("artifacts") or {})
            try:
                rendered = json.loads((od.read(RENDERED_NAME, 1 << 20) or b"{}").decode("utf-8")).get("files") or {}
            except (ValueError, AttributeError):
                rendered = {}
            for name in REPORT_FILES:
                if od.lstat(name) is not None and name not in listed and (not isinstance(rendered, dict) or rendered.get(name) != od.sha256(name)):
                    raise ConfigError(f"--out {folder} holds {name}, which attn-export did not write (its run.json does not list it); "
                                      "pass another --out for the rendered report, or move that file away")  # fmt: skip
            yield
            files = {name: od.sha256(name) for name in REPORT_FILES if od.lstat(name) is not None}
            od.write_atomic(RENDERED_NAME, (json.dumps({"format": "attn-export-report/1", "files": files}, indent=2) + "\n").encode("utf-8"))
        finally:
            with contextlib.suppress(OSError):
                os.unlink(LOCK_NAME, dir_fd=od.fd)  # while still holding it, as a run does
            os.close(fd)
    finally:
        od.close()


def report(
    report_json: Annotated[Path, typer.Argument(help="report.json written by attn-export.")],
    out: Annotated[Path | None, typer.Option("--out", help="Output folder (default: the report's folder).", show_default="off")] = None,
    bench_json: Annotated[Path | None, typer.Option("--bench", help="bench.json to add latency/memory vs sequence length.", show_default="off")] = None,
    attention_maps: Annotated[bool, typer.Option("--attention-maps/--no-attention-maps", metavar="", help="Rebuild the layer and draw eager vs ONNX attention maps.", show_default="on")] = True,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Render report.md and a self-contained report.html (plots embedded) from a report.json."""
    with progress_bar(not (quiet or as_json), "report") as cb:
        files = run_report(report_json, out, bench_json, attention_maps, progress=lambda msg: cb(msg, 0, 0))
    if as_json:
        print(json.dumps({k: str(v) for k, v in files.items()}, indent=2))
    elif not quiet:
        for path in files.values():
            out_console.print(f"wrote {path}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
