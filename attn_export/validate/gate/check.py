"""The CI accuracy-regression gate: compare a report.json against a committed baseline.

A baseline stores, per stage and per metric, the accepted value and how far the metric may
move in its bad direction (cosine and SQNR may only drop so much; rel_l2 and max_abs may
only grow so much). Tolerances live in the baseline file itself, so a reviewer sees the
figure and its slack side by side in one diff, and ``--update-baseline`` keeps hand-edited
slack while accepting new values. Latency is checked only as a *ratio* to eager measured in
the same run (absolute milliseconds differ between machines), and only with a noise margin.

int8 accuracy depends on the CPU's instruction set (ONNX Runtime's U8S8 kernels saturate on
AVX2 / AVX-512 without VNNI, and not with VNNI), so a format-2 baseline holds one entry per
instruction-set class (``report["environment"]["cpu"]["isa_class"]``). The gate compares like
with like and says which class it compared; with no entry for the report's class it compares
against the closest recorded class with the baseline's wider ``cross_class_slack`` and says so
(never a silent pass, never a spurious fail). Format-1 files are read as one entry of class
``unknown``. Both files are validated by ``attn_export.validate.schema`` first: non-finite
figures, an unknown direction, an infinite, negative or over-bound slack (``MAX_SLACK``) and
an empty baseline are refused with one line. Nothing passes on nothing: a check in which no
metric was compared fails. The run's own verdict rule holds here too (``validate.verdict``): a
shipped model that fails a data set it was judged on (a PARTIAL run) is a regression unless the
run recorded ``--accept-partial``. The file format is documented in ``docs/ci-gate.md``.

The parts live in sibling modules, re-exported here: ``gate_result`` (the checks and the
table), ``gate_baselines`` (defaults, bounds, reading and recording baselines) and
``gate_hashes`` (the artifacts beside the report and its run's ``run.json``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from attn_export.errors import DataError
from attn_export.validate.gate.baselines import (
    BASELINE_FORMAT,
    DEFAULT_CROSS_CLASS_SLACK,
    DEFAULT_GATE_TOLERANCES,
    MAX_SLACK,
    BaselineUpdate,
    check_slack_bounds,
    cpu_class,
    make_baseline,
    read_baseline,
    update_baseline,
)
from attn_export.validate.gate.hashes import check_run_folder, verify_artifact_hashes
from attn_export.validate.gate.result import UNKNOWN_CLASS, GateCheck, GateResult
from attn_export.validate.schema import BASELINE_FORMAT_V1, METRIC_DIRECTIONS, validate_report
from attn_export.validate.verdict import shipped, verdict_of

__all__ = [
    "BASELINE_FORMAT",
    "BASELINE_FORMAT_V1",
    "DEFAULT_CROSS_CLASS_SLACK",
    "DEFAULT_GATE_TOLERANCES",
    "MAX_SLACK",
    "METRIC_DIRECTIONS",
    "UNKNOWN_CLASS",
    "BaselineUpdate",
    "GateCheck",
    "GateResult",
    "check_report",
    "check_run_folder",
    "check_slack_bounds",
    "cpu_class",
    "make_baseline",
    "update_baseline",
    "verify_artifact_hashes",
]

log = logging.getLogger(__name__)


def _slack(tol: Mapping[str, Any], value: float) -> float:
    return float(tol.get("abs") or 0.0) + float(tol.get("rel") or 0.0) * abs(value)


def _pick_class(report: Mapping[str, Any], classes: Mapping[str, Any]) -> tuple[str, bool]:
    """(baseline class to compare with, whether it is another class than the report's).

    The same class when recorded (and known); otherwise, in order: same U8S8 saturation
    behaviour (what moves int8 accuracy), same architecture family (x86/arm), a known class
    over ``unknown``, then by name, so the choice is the same on every run.
    """
    rc = cpu_class(report)
    if rc != UNKNOWN_CLASS and rc in classes:
        return rc, False
    cpu = (report.get("environment") or {}).get("cpu") or {}
    sat = cpu.get("u8s8_saturates")

    def key(name: str) -> tuple[int, int, int, str]:
        rec_sat = (classes[name].get("recorded") or {}).get("u8s8_saturates")
        same_sat = sat is not None and rec_sat is not None and bool(sat) == bool(rec_sat)
        return (0 if same_sat else 1, 0 if name.split("-")[0] == rc.split("-")[0] else 1, int(name == UNKNOWN_CLASS), name)

    return min(classes, key=key), True


def _cross_slack(baseline: Mapping[str, Any], precision: str, metric: str) -> dict[str, float]:
    table = {p: dict(m) for p, m in DEFAULT_CROSS_CLASS_SLACK.items()}
    for p, metrics in (baseline.get("cross_class_slack") or {}).items():
        table.setdefault(p, {}).update(metrics)
    per = table.get(precision) or table["fp32"]
    return dict(per.get(metric) or {})


def _check_metric(name: str, metric: str, spec: Mapping[str, Any], value: Any, extra: Mapping[str, float] | None) -> GateCheck:
    base = float(spec["value"])
    direction = spec.get("direction") or METRIC_DIRECTIONS[metric]
    slack = _slack(spec, base) + (_slack(extra, base) if extra else 0.0)
    limit = base - slack if direction == "higher" else base + slack
    if value is None:
        return GateCheck(name, metric, base, None, limit, False, "metric missing from the report")
    v = float(value)
    ok = v >= limit if direction == "higher" else v <= limit
    msg = "" if ok else f"{'below' if direction == 'higher' else 'above'} limit by {abs(v - limit):.3g}"
    return GateCheck(name, metric, base, v, limit, ok, msg)


def _skipped(report: Mapping[str, Any]) -> dict[str, str]:
    """``selection.skipped_stages``: stages the run chose not to produce, with the reason."""
    raw = (report.get("selection") or {}).get("skipped_stages") or {}
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}


def check_report(
    report: Mapping[str, Any],
    baseline: Mapping[str, Any],
    latency_margin: float | None = None,
    *,
    allow_empty: bool = False,
    report_name: str = "report",
    baseline_name: str = "baseline",
) -> GateResult:
    """Check every stage of the baseline's matching class in ``report``.

    A missing stage or metric is a regression (unless the report lists the stage in
    ``selection.skipped_stages`` with a reason). ``latency_margin`` (e.g. 0.2) also requires
    speedup_vs_eager >= baseline * (1 - margin) within one class; None uses the baseline
    file's ``latency_margin`` and, if it has none, skips latency. Raises DataError for a
    malformed or non-finite report, a malformed baseline, or an empty one (unless ``allow_empty``).
    """
    validate_report(report, report_name, finite=True)
    base = read_baseline(baseline, baseline_name)
    if latency_margin is None:
        latency_margin = base.get("latency_margin")
    elif not (math.isfinite(latency_margin) and 0.0 <= latency_margin < 1.0):
        raise DataError(f"--latency-margin: expected a fraction in [0, 1), got {latency_margin}; use e.g. 0.2 for 20%")
    classes = base["classes"]
    result = GateResult(report_class=cpu_class(report))
    stages = {s["name"]: s for s in report["stages"]}
    empty_fix = "record one with attn-export check REPORT --baseline FILE --update-baseline, or pass --allow-empty"
    if not classes:
        if not allow_empty:
            raise DataError(f"{baseline_name}: classes: expected at least one CPU class entry, got {{}} (a baseline that checks nothing); {empty_fix}")
        result.notices.append("the baseline is empty (--allow-empty): nothing was compared")
        result.new_stages = list(stages)
        return result
    bc, cross = _pick_class(report, classes)
    result.baseline_class, result.cross_class = bc, cross
    entry = classes[bc]["stages"]
    if not entry and not allow_empty:
        where = "stages" if baseline.get("format") == BASELINE_FORMAT_V1 else f"classes.{bc}.stages"
        raise DataError(f"{baseline_name}: {where}: expected at least one stage, got {{}} (a baseline that checks nothing); {empty_fix}")
    if not entry:
        result.notices.append(f"the baseline's {bc} entry is empty (--allow-empty): nothing was compared")
    if cross:
        result.notices.append(_cross_notice(result.report_class, bc, list(classes)))
    if cross and latency_margin is not None:
        result.notices.append("latency ratios are not compared across CPU classes (int8 speedups depend on the instruction set)")
    skipped = _skipped(report)
    result.new_stages = [n for n in stages if n not in entry]
    for name, spec in entry.items():
        stage = stages.get(name)
        if stage is None:
            if name in skipped:
                result.checks.append(GateCheck(name, "stage", None, None, None, True, f"skipped by the run: {skipped[name]}"))
                result.notices.append(f"stage {name} was not produced by this run ({skipped[name]}); its metrics were not compared")
            else:
                result.checks.append(GateCheck(name, "stage", None, None, None, False, "stage missing from the report"))
            continue
        acc = stage.get("accuracy") or {}
        metrics = spec.get("metrics") or {}
        if not metrics:  # a stage tracked for presence only (e.g. no accuracy figures)
            result.checks.append(GateCheck(name, "stage", None, None, None, True, "present"))
        precision = str(spec.get("precision") or "fp32")
        for metric, mspec in metrics.items():
            extra = _cross_slack(base, precision, metric) if cross else None
            result.checks.append(_check_metric(name, metric, mspec, acc.get(metric), extra))
        if spec.get("passed") and stage.get("passed") is False:
            result.checks.append(GateCheck(name, "passed", 1.0, 0.0, 1.0, False, "stage now fails its own tolerance"))
        base_speed = spec.get("speedup_vs_eager")
        if latency_margin is not None and base_speed is not None and not cross:
            limit = float(base_speed) * (1.0 - float(latency_margin))
            got = stage.get("speedup_vs_eager")
            ok = got is not None and float(got) >= limit
            msg = "" if ok else ("speedup missing" if got is None else f"slower than baseline beyond the {latency_margin:.0%} margin")
            result.checks.append(GateCheck(name, "speedup_vs_eager", float(base_speed), got, limit, ok, msg))
    if entry and result and not any(c.metric != "stage" for c in result.checks):  # nothing passes on nothing
        why = "every baseline stage was skipped" if all(c.message.startswith("skipped") for c in result.checks) else (
            "the baseline stages present in the report have no metrics to compare")  # fmt: skip
        result.checks.append(GateCheck("(all)", "comparisons", None, None, None, False,
                                       f"{why}: nothing compared; record metrics with --update-baseline"))  # fmt: skip
    result.checks.extend(_verdict_checks(report))
    result.checks.extend(_invariance_checks(report))
    log.info("gate: %s", result.summary())
    return result


def _verdict_checks(report: Mapping[str, Any]) -> list[GateCheck]:
    """The run's own rule (``validate.verdict``): what ships fails a data set it was judged on -> a regression, unless
    the run was told to ship it anyway (``verdict.accept_partial``, ``--accept-partial``), which the table then says."""
    verdict = verdict_of(report)
    if not verdict.misses:
        return []
    stage = str((shipped(report).stage or {}).get("name") or "(shipped)")
    if verdict.accepted:
        return [GateCheck(stage, "judged data sets", None, None, None, True, f"accepted with --accept-partial: {'; '.join(verdict.misses)}")]
    return [GateCheck(stage, "judged data sets", None, None, None, False,
                      f"PARTIAL: {'; '.join(verdict.misses)}; rerun with --accept-partial to ship it anyway")]  # fmt: skip


def _invariance_checks(report: Mapping[str, Any]) -> list[GateCheck]:
    """Every selected model of a text subject gives a text the same answer alone and in a batch
    (``validate.batch_invariance``): measured by the run on the report split, checked against its own bar."""
    stages = {s["name"]: s for s in report["stages"]}
    checks = []
    for entry in (report.get("selection") or {}).values():
        stage = stages.get(str(entry.get("stage"))) if isinstance(entry, Mapping) else None
        figure = ((stage or {}).get("details") or {}).get("batch_invariance")
        if not isinstance(figure, Mapping):
            continue
        value, bar = float(figure.get("min_cosine", float("nan"))), float(figure.get("bar", 0.99999))
        ok = math.isfinite(value) and value >= bar
        msg = "" if ok else f"text {figure.get('worst_text')!r} alone vs in {figure.get('worst_batching')}: its answer moves with its batch mates"
        checks.append(GateCheck(str(stage["name"]), "batch invariance", bar, value, bar, ok, msg))  # type: ignore[index]
    return checks


def _cross_notice(report_class: str, baseline_class: str, recorded: list[str]) -> str:
    fix = "record this class with attn-export check REPORT --baseline FILE --update-baseline"
    if report_class == UNKNOWN_CLASS:
        why = "this report records no CPU class (environment.cpu.isa_class)"
    elif baseline_class == UNKNOWN_CLASS and recorded == [UNKNOWN_CLASS]:
        why = f"the baseline was recorded on an unknown CPU class (format 1), this report on {report_class}"
    else:
        why = f"the baseline has no entry for this report's CPU class {report_class} (it has {', '.join(sorted(recorded))})"
    return f"{why}; compared with the {baseline_class} entry using the wider cross-class slack, not like with like; {fix}"
