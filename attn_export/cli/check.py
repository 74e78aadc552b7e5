"""``attn-export check``: the CI accuracy-regression gate, a report against a committed baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from attn_export.cli._common import (
    JsonFlag,
    QuietFlag,
    out_console,
)
from attn_export.errors import DataError

__all__ = ["register"]


def _read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise DataError(f"{what} {path} does not exist; create it with attn-export check REPORT --baseline {path} --update-baseline")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{what} {path} is not valid JSON ({err.msg} at line {err.lineno}); fix or regenerate it") from None



def check(
    report: Annotated[Path, typer.Argument(help="report.json written by attn-export.")],
    baseline: Annotated[Path, typer.Option("--baseline", help="Committed baseline JSON (see docs/ci-gate.md).")],
    update_baseline: Annotated[bool, typer.Option("--update-baseline", help="Accept this report's figures into the baseline (keeps its tolerances).")] = False,
    junit: Annotated[Path | None, typer.Option("--junit", help="Also write JUnit XML here (one test case per stage/metric).")] = None,
    latency_margin: Annotated[float | None, typer.Option("--latency-margin", help="Also fail if speedup_vs_eager drops below baseline*(1-margin), e.g. 0.2.")] = None,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Compare a report against a baseline; exit 1 on an accuracy (or latency-ratio) regression."""
    from attn_export.validate.gate import check_report, make_baseline
    from attn_export.validate.junit import write_junit
    from attn_export.validate.report import atomic_write_text, load_report

    data = load_report(report)
    if update_baseline:
        previous = _read_json(baseline, "baseline") if baseline.is_file() else None
        if previous is not None and not quiet and not as_json:
            out_console.print(str(check_report(data, previous, latency_margin)), highlight=False)
        baseline.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(baseline, json.dumps(make_baseline(data, previous=previous), indent=2) + "\n")
        if as_json:
            print(json.dumps({"updated": str(baseline)}))
        else:
            out_console.print(f"updated baseline {baseline} from {report}", highlight=False)
        return
    result = check_report(data, _read_json(baseline, "baseline"), latency_margin)
    if junit is not None:
        write_junit(result, junit)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    elif quiet:
        print(result.summary())
    else:
        out_console.print(str(result), highlight=False)
    if not result:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    app.command("check")(check)
