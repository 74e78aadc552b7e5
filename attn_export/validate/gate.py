"""The CI accuracy-regression gate: compare a report.json against a committed baseline.

A baseline stores, per stage and per metric, the accepted value and how far the metric may
move in its bad direction (cosine and SQNR may only drop so much; rel_l2 and max_abs may
only grow so much). Tolerances live in the baseline file itself, so a reviewer sees the
figure and its slack side by side in one diff, and ``--update-baseline`` keeps hand-edited
slack while accepting new values. Latency is checked only as a *ratio* to eager measured in
the same run (absolute milliseconds differ between machines), and only with a noise margin.

The file format is documented in ``docs/ci-gate.md``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from attn_export.errors import DataError

__all__ = [
    "BASELINE_FORMAT",
    "DEFAULT_GATE_TOLERANCES",
    "METRIC_DIRECTIONS",
    "GateCheck",
    "GateResult",
    "check_report",
    "make_baseline",
]

log = logging.getLogger(__name__)

BASELINE_FORMAT = "attn-export-baseline/1"
# "higher": bigger is better, may drop by the slack; "lower": smaller is better, may grow by it.
METRIC_DIRECTIONS: dict[str, str] = {"cosine": "higher", "sqnr_db": "higher", "rel_l2": "lower", "max_abs": "lower"}

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
    """All checks of one report against one baseline; falsy when anything regressed."""

    checks: list[GateCheck] = field(default_factory=list)
    new_stages: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def regressions(self) -> list[GateCheck]:
        return [c for c in self.checks if not c.ok]

    def summary(self) -> str:
        n_bad = len(self.regressions)
        verdict = "PASS" if self else f"FAIL: {n_bad} regression{'s' if n_bad != 1 else ''}"
        n_stages = len({c.stage for c in self.checks})
        return f"{verdict} ({len(self.checks)} checks, {n_stages} stage{'s' if n_stages != 1 else ''})"

    def __str__(self) -> str:
        rows = [("stage", "metric", "baseline", "value", "limit", "status")]
        for c in self.checks:
            status = "ok" if c.ok else "REGRESSION" + (f": {c.message}" if c.message else "")
            rows.append((c.stage, c.metric, _fmt(c.baseline), _fmt(c.value), _fmt(c.limit), status))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = ["  ".join(r[i].ljust(widths[i]) for i in range(5)) + "  " + r[5] for r in rows]
        lines.insert(1, "-" * (sum(widths) + 2 * 5 + 6))
        if self.new_stages:
            lines.append(f"new stages not in the baseline (not checked): {', '.join(self.new_stages)}")
        lines.append(self.summary())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": bool(self), "checks": [asdict(c) for c in self.checks], "new_stages": self.new_stages}


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return f"{v:.6g}"


def _slack(tol: Mapping[str, float], value: float) -> float:
    return float(tol.get("abs", 0.0)) + float(tol.get("rel", 0.0)) * abs(value)


def _stage_entry(stage: Mapping[str, Any], tolerances: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    precision = str(stage.get("precision") or "fp32")
    defaults = tolerances.get(precision) or tolerances.get("fp32") or {}
    acc = stage.get("accuracy") or {}
    metrics: dict[str, Any] = {}
    for metric, direction in METRIC_DIRECTIONS.items():
        if acc.get(metric) is None:
            continue
        old = ((previous or {}).get("metrics") or {}).get(metric) or {}
        tol = {k: old[k] for k in ("abs", "rel") if k in old} or dict(defaults.get(metric, {}))
        metrics[metric] = {"value": float(acc[metric]), "direction": direction, **tol}
    entry: dict[str, Any] = {"precision": precision, "metrics": metrics}
    if stage.get("speedup_vs_eager") is not None:
        entry["speedup_vs_eager"] = float(stage["speedup_vs_eager"])
    if stage.get("passed") is not None:
        entry["passed"] = bool(stage["passed"])
    return entry


def make_baseline(
    report: Mapping[str, Any],
    tolerances: Mapping[str, Any] | None = None,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A baseline from a report's figures; ``previous`` keeps its hand-edited slack per metric.

    ``tolerances`` maps precision -> metric -> {"abs": a, "rel": r} (default
    ``DEFAULT_GATE_TOLERANCES``); a precision it lacks falls back to its fp32 entry.
    """
    tolerances = tolerances or DEFAULT_GATE_TOLERANCES
    prev_stages = (previous or {}).get("stages") or {}
    stages = {
        s["name"]: _stage_entry(s, tolerances, prev_stages.get(s["name"])) for s in report.get("stages", [])
    }
    out: dict[str, Any] = {"format": BASELINE_FORMAT, "model": report.get("model", {}), "stages": stages}
    if previous and previous.get("latency_margin") is not None:
        out["latency_margin"] = previous["latency_margin"]
    return out


def _check_metric(name: str, metric: str, spec: Mapping[str, Any], value: Any) -> GateCheck:
    base = float(spec["value"])
    direction = spec.get("direction") or METRIC_DIRECTIONS.get(metric, "higher")
    slack = _slack(spec, base)
    limit = base - slack if direction == "higher" else base + slack
    if value is None:
        return GateCheck(name, metric, base, None, limit, False, "metric missing from the report")
    v = float(value)
    if math.isnan(v):
        return GateCheck(name, metric, base, v, limit, False, "NaN")
    ok = v >= limit if direction == "higher" else v <= limit
    msg = "" if ok else f"{'below' if direction == 'higher' else 'above'} limit by {abs(v - limit):.3g}"
    return GateCheck(name, metric, base, v, limit, ok, msg)


def check_report(
    report: Mapping[str, Any], baseline: Mapping[str, Any], latency_margin: float | None = None
) -> GateResult:
    """Check every baseline stage in ``report``; a missing stage or metric is a regression.

    ``latency_margin`` (e.g. 0.2) also requires speedup_vs_eager >= baseline * (1 - margin);
    None uses the baseline file's ``latency_margin`` and, if it has none, skips latency.
    """
    if baseline.get("format") != BASELINE_FORMAT:
        raise DataError(
            f"expected a baseline with format {BASELINE_FORMAT!r}, got {baseline.get('format')!r}; "
            "create one with attn-export check REPORT --baseline FILE --update-baseline"
        )
    if latency_margin is None:
        latency_margin = baseline.get("latency_margin")
    if latency_margin is not None and not 0.0 <= float(latency_margin) < 1.0:
        raise DataError(f"expected a latency margin in [0, 1), got {latency_margin}; use e.g. 0.2 for 20%")
    stages = {s.get("name"): s for s in report.get("stages", [])}
    result = GateResult(new_stages=[n for n in stages if n not in baseline.get("stages", {})])
    for name, spec in baseline.get("stages", {}).items():
        stage = stages.get(name)
        if stage is None:
            result.checks.append(GateCheck(name, "stage", None, None, None, False, "stage missing from the report"))
            continue
        acc = stage.get("accuracy") or {}
        if not spec.get("metrics"):  # a stage tracked for presence only (e.g. no accuracy figures)
            result.checks.append(GateCheck(name, "stage", None, None, None, True, "present"))
        for metric, mspec in spec.get("metrics", {}).items():
            result.checks.append(_check_metric(name, metric, mspec, acc.get(metric)))
        if spec.get("passed") and stage.get("passed") is False:
            result.checks.append(GateCheck(name, "passed", 1.0, 0.0, 1.0, False, "stage now fails its own tolerance"))
        base_speed = spec.get("speedup_vs_eager")
        if latency_margin is not None and base_speed is not None:
            limit = float(base_speed) * (1.0 - float(latency_margin))
            got = stage.get("speedup_vs_eager")
            ok = got is not None and float(got) >= limit
            msg = "" if ok else ("speedup missing" if got is None else f"slower than baseline beyond the {latency_margin:.0%} margin")
            result.checks.append(GateCheck(name, "speedup_vs_eager", float(base_speed), got, limit, ok, msg))
    log.info("gate: %s", result.summary())
    return result
