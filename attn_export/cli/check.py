"""``attn-export check``: the CI accuracy-regression gate, a report against a committed baseline.

Baselines hold one entry per CPU instruction-set class; the gate compares like with like
and says which class it compared (docs/ci-gate.md). A report whose run did not complete (its
``run.json`` says "running") is refused, for ``--update-baseline`` too: it may be half-written.
The artifacts beside the report must be the ones it judged, each with its recorded sha256.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from attn_export.cli._common import JsonFlag, QuietFlag, out_console, writing
from attn_export.errors import ConfigError
from attn_export.host.paths import check_output_file

__all__ = ["register", "run_check"]


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
    force: bool = False,
) -> int:
    """The ``check`` command: gate ``report`` against ``baseline`` (or update it); returns the exit code."""
    from attn_export.validate.gate.check import check_report, check_run_folder, verify_artifact_hashes
    from attn_export.validate.gate.check import update_baseline as record
    from attn_export.validate.junit import check_junit_target, write_junit
    from attn_export.validate.report import atomic_write_text, load_report
    from attn_export.validate.schema import read_json

    if prune and not update_baseline:
        raise ConfigError("--prune only applies with --update-baseline; add --update-baseline or drop --prune")
    if junit is not None:
        check_output_file(junit, "--junit")
        inputs = {"report": report, "--baseline": baseline, "run manifest": report.parent / "run.json"}
        check_junit_target(junit, inputs, force)  # never over an input or a user's file
    if update_baseline:
        check_output_file(baseline, "--baseline")
    data = load_report(report)
    run_checks, run_notices = check_run_folder(report)  # refuses a report whose run did not complete
    if update_baseline:
        previous = read_json(baseline, "a baseline", "fix it or move it aside") if baseline.exists() else None
        if previous is not None and not quiet and not as_json:  # the old-vs-new diff, before it is overwritten
            old = check_report(data, previous, latency_margin, allow_empty=True, report_name=str(report), baseline_name=str(baseline))
            out_console.print(str(old), highlight=False, soft_wrap=True, markup=False)
        update = record(data, previous, prune=prune, allow_empty=allow_empty, report_name=str(report), baseline_name=str(baseline))
        with writing(baseline, "--baseline"):
            atomic_write_text(baseline, json.dumps(update.baseline, indent=2) + "\n")
        if as_json:
            print(json.dumps({"updated": str(baseline), "cpu_class": update.cpu_class, "kept": update.kept, "removed": update.removed}))
        else:
            out_console.print(f"updated baseline {baseline} from {report}: {update.describe()}", highlight=False, soft_wrap=True, markup=False)
        return 0
    fix = f"create it with attn-export check {report} --baseline {baseline} --update-baseline"
    result = check_report(data, read_json(baseline, "a baseline", fix), latency_margin, allow_empty=allow_empty,
                          report_name=str(report), baseline_name=str(baseline))  # fmt: skip
    result.checks.extend(run_checks)  # the report is the one its run wrote
    result.checks.extend(verify_artifact_hashes(data, report.parent))  # the artifacts beside the report are the ones it judged
    result.notices.extend(run_notices)
    if junit is not None:
        with writing(junit, "--junit"):
            write_junit(result, junit)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    elif quiet:
        print(result.summary())
    else:
        out_console.print(str(result), highlight=False, soft_wrap=True, markup=False)  # CI logs: one table row per line, never wrapped
    return 0 if result else 1


def check(
    report: Annotated[Path, typer.Argument(help="report.json written by attn-export (with --golden: the model/engine).")],
    baseline: Annotated[Path | None, typer.Option("--baseline", help="Committed baseline JSON (see docs/ci-gate.md).", show_default="none")] = None,
    update_baseline: Annotated[bool, typer.Option("--update-baseline", metavar="", help="Record this report's figures as its CPU class's entry (keeps tolerances and other classes).")] = False,
    prune: Annotated[bool, typer.Option("--prune", metavar="", help="With --update-baseline: also remove stages/metrics this report lacks (listed).")] = False,
    allow_empty: Annotated[bool, typer.Option("--allow-empty", metavar="", help="Accept a baseline with no stages (normally an error: it checks nothing).")] = False,
    junit: Annotated[Path | None, typer.Option("--junit", help="Also write JUnit XML here (one test case per stage/metric).", show_default="none")] = None,
    latency_margin: Annotated[float | None, typer.Option("--latency-margin", help="Also fail if speedup_vs_eager drops below baseline*(1-margin), e.g. 0.2.", show_default="none: latency not checked")] = None,
    force: Annotated[bool, typer.Option("--force", metavar="", help="Replace an existing --junit file that attn-export did not write.")] = False,
    golden: Annotated[Path | None, typer.Option("--golden", help="Judge the model/engine against golden outputs (golden record).", show_default="none")] = None,
    provider: Annotated[str | None, typer.Option("--provider", help="With --golden, for .onnx: ONNX Runtime provider cpu or cuda.", show_default="cpu")] = None,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Compare a report against a baseline (or an artifact against golden outputs); exit 1 on a regression."""
    if golden is not None:
        from attn_export.cli.golden import run_golden_check

        if baseline is not None or update_baseline:
            raise ConfigError("--golden checks a model against golden outputs; drop --baseline/--update-baseline, or run them apart")
        code = run_golden_check(report, golden, provider, as_json=as_json, quiet=quiet)
        if code:
            raise typer.Exit(code=code)
        return
    if baseline is None:
        raise ConfigError("missing --baseline (the committed baseline JSON); or pass --golden DIR to check against golden outputs")
    code = run_check(report, baseline, update_baseline=update_baseline, prune=prune, allow_empty=allow_empty, junit=junit,
                     latency_margin=latency_margin, quiet=quiet, as_json=as_json, force=force)  # fmt: skip
    if code:
        raise typer.Exit(code=code)


def register(app: typer.Typer) -> None:
    app.command("check")(check)
