"""``attn-export check``: the CI accuracy-regression gate, a report against a committed baseline.

Baselines hold one entry per CPU instruction-set class; the gate compares like with like
and says which class it compared (docs/ci-gate.md). A report whose run did not complete (its
``run.json`` says "running") is refused, for ``--update-baseline`` too: it may be half-written.
The artifacts beside the report must be the ones it judged, each with its recorded sha256.
``--expect-precision P`` / ``--expect-fused-attention`` also assert the built engine's
attestation (``validate.gate.attestation``); with them ``--baseline`` may be left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from attn_export.cli._common import JsonFlag, QuietFlag, out_console, writing
from attn_export.errors import ConfigError
from attn_export.host.paths import check_output_file
from attn_export.vocab.precisions import PRECISIONS

__all__ = ["register", "run_check"]


def _expectation_checks(report: Path, expect_precision: str | None, expect_fused_attention: bool, as_json: bool, quiet: bool) -> int:
    """The engine attestation alone (no --baseline): one line per check, exit 1 when one fails."""
    from attn_export.validate.gate.attestation import attestation_checks
    from attn_export.validate.gate.check import check_run_folder
    from attn_export.validate.gate.result import GateResult
    from attn_export.validate.report import load_report

    data = load_report(report)
    run_checks, notices = check_run_folder(report)
    result = GateResult(checks=[*attestation_checks(data, expect_precision, expect_fused_attention), *run_checks], notices=notices)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0 if result else 1
    lines = [] if quiet else [f"{c.stage} {c.metric}: {'ok' if c.ok else 'FAIL'} ({c.message})" for c in result.checks]
    n_bad = len(result.regressions)
    lines.append(f"{'PASS' if result else f'FAIL: {n_bad} failed'} ({len(result.checks)} engine attestation checks)")
    out_console.print("\n".join(lines), highlight=False, soft_wrap=True, markup=False)
    return 0 if result else 1


def run_check(
    report: Path,
    baseline: Path | None,
    *,
    expect_precision: str | None = None,
    expect_fused_attention: bool = False,
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

    if expect_precision is not None and expect_precision not in PRECISIONS:
        raise ConfigError(f"--expect-precision expected one of {', '.join(PRECISIONS)}, got {expect_precision!r}")
    if baseline is None:
        if expect_precision is None and not expect_fused_attention:
            raise ConfigError("check needs --baseline FILE, --expect-precision/--expect-fused-attention (the engine's attestation) or --golden DIR")
        if update_baseline or junit is not None:
            raise ConfigError("--update-baseline and --junit need --baseline FILE")
        return _expectation_checks(report, expect_precision, expect_fused_attention, as_json, quiet)
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
    if expect_precision is not None or expect_fused_attention:
        from attn_export.validate.gate.attestation import attestation_checks

        result.checks.extend(attestation_checks(data, expect_precision, expect_fused_attention))
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
    baseline: Annotated[Optional[Path], typer.Option("--baseline", help="Committed baseline JSON (see docs/ci-gate.md).", show_default="none: only --expect-*/--golden")] = None,
    update_baseline: Annotated[bool, typer.Option("--update-baseline", metavar="", help="Record this report's figures as its CPU class's entry (keeps tolerances and other classes).")] = False,
    prune: Annotated[bool, typer.Option("--prune", metavar="", help="With --update-baseline: also remove stages/metrics this report lacks (listed).")] = False,
    allow_empty: Annotated[bool, typer.Option("--allow-empty", metavar="", help="Accept a baseline with no stages (normally an error: it checks nothing).")] = False,
    junit: Annotated[Path | None, typer.Option("--junit", help="Also write JUnit XML here (one test case per stage/metric).", show_default="none")] = None,
    latency_margin: Annotated[float | None, typer.Option("--latency-margin", help="Also fail if speedup_vs_eager drops below baseline*(1-margin), e.g. 0.2.", show_default="none: latency not checked")] = None,
    force: Annotated[bool, typer.Option("--force", metavar="", help="Replace an existing --junit file that attn-export did not write.")] = False,
    expect_precision: Annotated[Optional[str], typer.Option("--expect-precision", help="Fail unless the built engine runs every GEMM group planned in this precision in it (int8, fp8, fp16, bf16).", show_default="none")] = None,
    expect_fused_attention: Annotated[bool, typer.Option("--expect-fused-attention", metavar="", help="Fail unless the built engine runs one fused attention kernel per attention block.")] = False,
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
    code = run_check(report, baseline, update_baseline=update_baseline, prune=prune, allow_empty=allow_empty, junit=junit,
                     latency_margin=latency_margin, quiet=quiet, as_json=as_json, force=force, expect_precision=expect_precision,
                     expect_fused_attention=expect_fused_attention)  # fmt: skip
    if code:
        raise typer.Exit(code=code)


def register(app: typer.Typer) -> None:
    app.command("check")(check)
