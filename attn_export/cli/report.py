"""``attn-export report``: render report.md and a self-contained report.html from a report.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from attn_export.cli._common import (
    JsonFlag,
    QuietFlag,
    out_console,
    progress_bar,
)
from attn_export.errors import DataError

__all__ = ["register"]


def report(
    report_json: Annotated[Path, typer.Argument(help="report.json written by attn-export.")],
    out: Annotated[Path | None, typer.Option("--out", help="Output folder (default: the report's folder).")] = None,
    bench_json: Annotated[Path | None, typer.Option("--bench", help="bench.json to add latency/memory vs sequence length.")] = None,
    attention_maps: Annotated[bool, typer.Option("--attention-maps/--no-attention-maps", help="Rebuild the layer and draw eager vs ONNX attention maps.")] = True,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Render report.md and a self-contained report.html (plots embedded) from a report.json."""
    from attn_export.validate.render import write_reports

    if bench_json is not None and not bench_json.is_file():
        raise DataError(f"bench results {bench_json} do not exist; run attn-export bench --json {bench_json} first")
    with progress_bar(not (quiet or as_json), "report") as cb:
        files = write_reports(report_json, out or report_json.parent, bench_json, "auto" if attention_maps else None,
                              progress=lambda msg: cb(msg, 0, 0))  # fmt: skip
    if as_json:
        print(json.dumps({k: str(v) for k, v in files.items()}, indent=2))
    elif not quiet:
        for path in files.values():
            out_console.print(f"wrote {path}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
