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
figures, an unknown direction, an infinite or negative slack and an empty baseline are
refused with one line. The file format is documented in ``docs/ci-gate.md``.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePath
from typing import Any

from attn_export.errors import DataError
from attn_export.validate.schema import (
    BASELINE_FORMAT_V1,
    BASELINE_FORMAT_V2,
    METRIC_DIRECTIONS,
    BaselineV1,
    BaselineV2,
    validate_baseline,
    validate_report,
)

__all__ = [
    "BASELINE_FORMAT",
    "BASELINE_FORMAT_V1",
    "DEFAULT_CROSS_CLASS_SLACK",
    "DEFAULT_GATE_TOLERANCES",
    "METRIC_DIRECTIONS",
    "UNKNOWN_CLASS",
    "BaselineUpdate",
    "GateCheck",
    "GateResult",
    "check_report",
    "cpu_class",
    "make_baseline",
    "update_baseline",
    "verify_artifact_hashes",
]

log = logging.getLogger(__name__)

BASELINE_FORMAT = BASELINE_FORMAT_V2  # what --update-baseline writes; format 1 is still read
UNKNOWN_CLASS = "unknown"  # a report without environment.cpu.isa_class, or a format-1 baseline
_GATED = ("cosine", "sqnr_db", "rel_l2", "max_abs")  # mean_abs is reported, not gated by default

# slack = abs + rel * |baseline value|. fp32 figures are summation-order noise (they move a
# little between CPUs), int8 figures move with the quantizer's kernel choice, so their
# slack is wide in relative terms but tight on cosine, the figure users read.
DEFAULT_GATE_TOLERANCES: dict[str, dict[str, dict[str, float]]] = {
    "fp32": {
        "cosine": {"abs": 1e-6},
        "sqnr_db": {"abs": 10.0},
        "rel_l2": {"abs": 1e-6, "rel": 1.0},
        "max_abs": {"abs": 1e-5, "rel": 1.0},
    },
    "fp16": {
        "cosine": {"abs": 2e-5},
        "sqnr_db": {"abs": 3.0},
        "rel_l2": {"abs": 1e-4, "rel": 0.5},
        "max_abs": {"abs": 1e-3, "rel": 1.0},
    },
    "int8": {
        "cosine": {"abs": 2e-4},
        "sqnr_db": {"abs": 1.5},
        "rel_l2": {"abs": 1e-3, "rel": 0.25},
        "max_abs": {"abs": 1e-2, "rel": 0.5},
    },
}

# Added to a metric's own slack when the report's CPU class has no entry of its own. Sized
# from issue 9's measurement: static int8 on the default layer gave cosine 0.999932 with VNNI
# and 0.999141 on AVX2 (U8S8 saturation), i.e. rel_l2 0.0117 -> 0.0415 (3.6x) and SQNR
# 38.7 -> 27.6 dB. fp32/fp16 move only by summation order between classes.
DEFAULT_CROSS_CLASS_SLACK: dict[str, dict[str, dict[str, float]]] = {
    "fp32": {"cosine": {"abs": 1e-6}, "sqnr_db": {"abs": 10.0}, "rel_l2": {"abs": 1e-6, "rel": 1.0}, "max_abs": {"abs": 1e-5, "rel": 1.0}},
    "fp16": {"cosine": {"abs": 5e-5}, "sqnr_db": {"abs": 3.0}, "rel_l2": {"abs": 1e-4, "rel": 0.5}, "max_abs": {"abs": 1e-3, "rel": 1.0}},
    "int8": {"cosine": {"abs": 1e-3}, "sqnr_db": {"abs": 12.0}, "rel_l2": {"abs": 1e-2, "rel": 3.0}, "max_abs": {"abs": 5e-2, "rel": 3.0}},
}  # fmt: skip


@dataclass
class GateCheck:
    """One (stage, metric) comparison; ``limit`` is the worst value still accepted."""

    stage: str
    metric: str
    baseline: float | None
    value: float | None
    limit: float | None
    ok: bool
    message: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass
class GateResult:
    """All checks of one report against one baseline class; falsy when anything regressed."""

    checks: list[GateCheck] = field(default_factory=list)
    new_stages: list[str] = field(default_factory=list)
    report_class: str = UNKNOWN_CLASS  # the report's CPU instruction-set class
    baseline_class: str | None = None  # the baseline entry it was compared with
    cross_class: bool = False  # compared across classes, with the cross-class slack
    notices: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def regressions(self) -> list[GateCheck]:
        return [c for c in self.checks if not c.ok]

    @property
    def compared(self) -> str:
        """Which class was compared with which, in words."""
        if self.baseline_class is None:
            return f"CPU class {self.report_class}, empty baseline"
        if not self.cross_class:
            return f"CPU class {self.report_class}"
        return f"CPU class {self.report_class} vs baseline class {self.baseline_class}, cross-class slack"

    def summary(self) -> str:
        n_bad = len(self.regressions)
        verdict = "PASS" if self else f"FAIL: {n_bad} regression{'s' if n_bad != 1 else ''}"
        n_stages = len({c.stage for c in self.checks})
        return f"{verdict} ({len(self.checks)} checks, {n_stages} stage{'s' if n_stages != 1 else ''}; {self.compared})"

    def __str__(self) -> str:
        if self.baseline_class is None:
            lines = ["baseline: empty"]
        elif self.cross_class:
            lines = [f"baseline: class {self.baseline_class} (this report: {self.report_class}; cross-class slack)"]
        else:
            lines = [f"baseline: class {self.baseline_class} (same class as this report)"]
        rows = [("stage", "metric", "baseline", "value", "limit", "status")]
        for c in self.checks:
            status = ("ok" + (f" ({c.message})" if c.message else "")) if c.ok else "REGRESSION" + (f": {c.message}" if c.message else "")
            rows.append((c.stage, c.metric, _fmt(c.baseline), _fmt(c.value), _fmt(c.limit), status))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        table = ["  ".join(r[i].ljust(widths[i]) for i in range(5)) + "  " + r[5] for r in rows]
        table.insert(1, "-" * (sum(widths) + 2 * 5 + 6))
        lines += table + [f"notice: {n}" for n in self.notices]
        if self.new_stages:
            lines.append(f"new stages not in the baseline (not checked): {', '.join(self.new_stages)}")
        lines.append(self.summary())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": bool(self),
            "report_class": self.report_class,
            "baseline_class": self.baseline_class,
            "cross_class": self.cross_class,
            "notices": self.notices,
            "checks": [asdict(c) for c in self.checks],
            "new_stages": self.new_stages,
        }


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return f"{v:.6g}"


def _slack(tol: Mapping[str, Any], value: float) -> float:
    return float(tol.get("abs") or 0.0) + float(tol.get("rel") or 0.0) * abs(value)


def cpu_class(report: Mapping[str, Any]) -> str:
    """The report's instruction-set class (``environment.cpu.isa_class``), or ``"unknown"``."""
    cpu = (report.get("environment") or {}).get("cpu") or {}
    return str(cpu.get("isa_class") or UNKNOWN_CLASS) if isinstance(cpu, Mapping) else UNKNOWN_CLASS


def _as_v2(raw: Mapping[str, Any], parsed: BaselineV1 | BaselineV2) -> dict[str, Any]:
    """A format-1 baseline as a format-2 dict with one entry of class ``unknown``."""
    if isinstance(parsed, BaselineV2):
        return copy.deepcopy(dict(raw))
    out: dict[str, Any] = {"format": BASELINE_FORMAT_V2, "model": copy.deepcopy(raw.get("model") or {})}
    if raw.get("latency_margin") is not None:
        out["latency_margin"] = raw["latency_margin"]
    out["classes"] = {UNKNOWN_CLASS: {"recorded": {"from_format": BASELINE_FORMAT_V1}, "stages": copy.deepcopy(raw["stages"])}}
    return out


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
    base = _as_v2(baseline, validate_baseline(baseline, baseline_name))
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
    if result.checks and all(c.metric == "stage" and c.message.startswith("skipped") for c in result.checks):
        result.checks.append(GateCheck("(all)", "stage", None, None, None, False, "every baseline stage was skipped: nothing compared"))
    log.info("gate: %s", result.summary())
    return result


def _cross_notice(report_class: str, baseline_class: str, recorded: list[str]) -> str:
    fix = "record this class with attn-export check REPORT --baseline FILE --update-baseline"
    if report_class == UNKNOWN_CLASS:
        why = "this report records no CPU class (environment.cpu.isa_class)"
    elif baseline_class == UNKNOWN_CLASS and recorded == [UNKNOWN_CLASS]:
        why = f"the baseline was recorded on an unknown CPU class (format 1), this report on {report_class}"
    else:
        why = f"the baseline has no entry for this report's CPU class {report_class} (it has {', '.join(sorted(recorded))})"
    return f"{why}; compared with the {baseline_class} entry using the wider cross-class slack, not like with like; {fix}"


# --- recording -----------------------------------------------------------------------------------
@dataclass
class BaselineUpdate:
    """A baseline after ``--update-baseline``: what was written, and what was kept or pruned."""

    baseline: dict[str, Any]
    cpu_class: str
    kept: list[str] = field(default_factory=list)  # "stage" or "stage/metric" not in the report, kept
    removed: list[str] = field(default_factory=list)  # the same, removed by prune=True

    def describe(self) -> str:
        out = [f"recorded CPU class {self.cpu_class}"]
        if self.kept:
            out.append(f"kept from the previous baseline (not in this report; --prune removes them): {', '.join(self.kept)}")
        if self.removed:
            out.append(f"removed (--prune): {', '.join(self.removed)}")
        return "; ".join(out)


def _previous_slack(prev_classes: Mapping[str, Any], cls: str, stage: str, metric: str) -> dict[str, Any] | None:
    """Hand-edited slack for (stage, metric): this class's entry first, then any other class's."""
    order = [cls] + sorted((c for c in prev_classes if c != cls), key=lambda c: (c == UNKNOWN_CLASS, c))
    for c in order:
        spec = (((prev_classes.get(c) or {}).get("stages") or {}).get(stage) or {}).get("metrics", {}).get(metric)
        if spec and any(k in spec for k in ("abs", "rel")):
            return {k: spec[k] for k in ("abs", "rel") if k in spec}
    return None


def update_baseline(
    report: Mapping[str, Any],
    previous: Mapping[str, Any] | None = None,
    tolerances: Mapping[str, Any] | None = None,
    *,
    prune: bool = False,
    allow_empty: bool = False,
    report_name: str = "report",
    baseline_name: str = "baseline",
) -> BaselineUpdate:
    """Record the report's figures as its CPU class's entry; other classes are left untouched.

    Stages and metrics of that entry that the report lacks (e.g. a report without accuracy)
    are kept unless ``prune``; hand-edited slack, ``latency_margin`` and ``cross_class_slack``
    are kept. ``tolerances`` maps precision -> metric -> {"abs": a, "rel": r} for metrics
    without previous slack (default ``DEFAULT_GATE_TOLERANCES``, fp32's entry for others).
    """
    validate_report(report, report_name, finite=True)
    tolerances = tolerances or DEFAULT_GATE_TOLERANCES
    if not report["stages"] and not allow_empty:
        raise DataError(f"{report_name}: stages: expected at least one stage to record, got []; run attn-export first, or pass --allow-empty")
    base = _as_v2(previous, validate_baseline(previous, baseline_name)) if previous is not None else {
        "format": BASELINE_FORMAT_V2, "model": copy.deepcopy(report.get("model") or {}),
    }  # fmt: skip
    base["format"] = BASELINE_FORMAT_V2
    base.setdefault("cross_class_slack", copy.deepcopy(DEFAULT_CROSS_CLASS_SLACK))
    classes: dict[str, Any] = base.setdefault("classes", {})
    cls = cpu_class(report)
    update = BaselineUpdate(base, cls)
    old_stages: dict[str, Any] = (classes.get(cls) or {}).get("stages") or {}
    stages: dict[str, Any] = {}
    for s in report["stages"]:
        old = old_stages.get(s["name"]) or {}
        stages[s["name"]] = _stage_entry(s, tolerances, classes, cls, old, prune, update)
    for name, old in old_stages.items():
        if name not in stages:
            (update.removed if prune else update.kept).append(name)
            if not prune:
                stages[name] = old
    if prune and cls != UNKNOWN_CLASS and UNKNOWN_CLASS in classes:
        update.removed.append(f"class {UNKNOWN_CLASS} (the format-1 entry)")
        del classes[UNKNOWN_CLASS]
    cpu = (report.get("environment") or {}).get("cpu") or {}
    recorded = {k: cpu[k] for k in ("isa_class", "u8s8_saturates", "flags") if k in cpu}
    if (report.get("environment") or {}).get("processor"):
        recorded["processor"] = report["environment"]["processor"]
    classes[cls] = {"recorded": recorded, "stages": stages}
    base["classes"] = dict(sorted(classes.items()))
    return update


def _stage_entry(
    stage: Mapping[str, Any], tolerances: Mapping[str, Any], classes: Mapping[str, Any], cls: str,
    old: Mapping[str, Any], prune: bool, update: BaselineUpdate,
) -> dict[str, Any]:  # fmt: skip
    name = stage["name"]
    precision = str(stage.get("precision") or "fp32")
    defaults = tolerances.get(precision) or tolerances.get("fp32") or {}
    acc = stage.get("accuracy") or {}
    metrics: dict[str, Any] = {}
    for metric in _GATED:
        if acc.get(metric) is None:
            continue
        tol = _previous_slack(classes, cls, name, metric) or dict(defaults.get(metric, {}))
        metrics[metric] = {"value": float(acc[metric]), "direction": METRIC_DIRECTIONS[metric], **tol}
    for metric, spec in (old.get("metrics") or {}).items():
        if metric not in metrics:
            (update.removed if prune else update.kept).append(f"{name}/{metric}")
            if not prune:
                metrics[metric] = spec
    entry: dict[str, Any] = {"precision": precision, "metrics": metrics}
    for key in ("speedup_vs_eager", "passed"):
        if stage.get(key) is not None:
            entry[key] = float(stage[key]) if key == "speedup_vs_eager" else bool(stage[key])
        elif old.get(key) is not None:
            (update.removed if prune else update.kept).append(f"{name}/{key}")
            if not prune:
                entry[key] = old[key]
    return entry


def make_baseline(
    report: Mapping[str, Any],
    tolerances: Mapping[str, Any] | None = None,
    previous: Mapping[str, Any] | None = None,
    *,
    prune: bool = False,
) -> dict[str, Any]:
    """``update_baseline(report, previous, tolerances, prune=prune).baseline``."""
    return update_baseline(report, previous, tolerances, prune=prune).baseline


# --- artifact hashes ------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_artifact_hashes(report: Mapping[str, Any], folder: str | os.PathLike[str]) -> list[GateCheck]:
    """One check per artifact the report judged (``details.sha256``, ``selection[*].sha256``) whose
    file is present in ``folder`` (the report's folder): a different file means the outputs of two
    runs are mixed, and the report's figures are not about the model beside it."""
    entries: list[tuple[str, Any, Any]] = [(str(s.get("name")), s.get("artifact"), (s.get("details") or {}).get("sha256")) for s in report.get("stages") or []]
    entries += [(f"selection.{k}", v.get("artifact"), v.get("sha256")) for k, v in (report.get("selection") or {}).items() if isinstance(v, Mapping)]
    checks: list[GateCheck] = []
    for name, artifact, expected in entries:
        if not isinstance(artifact, str) or not isinstance(expected, str):
            continue
        path = Path(folder) / PurePath(artifact).name
        if not path.is_file():
            continue
        got = _sha256(path)
        ok = got == expected
        msg = "" if ok else (
            f"{path.name} is not the file this report judged (sha256 {got[:12]}..., the report has {expected[:12]}...): "
            "the outputs of two runs are mixed; rerun attn-export into its own --out"
        )
        checks.append(GateCheck(name, "sha256", None, None, None, ok, "matches the report" if ok else msg))
    return checks
