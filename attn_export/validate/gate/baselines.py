"""Baselines for the CI gate: their default and maximum slack, reading them, and recording one.

A baseline stores, per CPU instruction-set class, stage and metric, the accepted value and how
far the metric may move in its bad direction: ``slack = abs + rel * |value|``, plus, when the
gate compares a report with another class's entry, the file's ``cross_class_slack``.

**Slack is bounded** (``MAX_SLACK``; docs/ci-gate.md). Infinite or negative slack was already
refused, but a finite 1e300 let a report at cosine 0.5 pass: a gate whose slack exceeds what
any stage is held to compares nothing. Each ``abs`` and ``rel`` (a metric's own and the
cross-class one alike) is at most:

* cosine: 0.01 each, the widest band a layer stage's own tolerance allows (low-rank: cosine
  >= 0.99), and over ten times the largest cross-ISA gap measured (int8: 0.999932 with VNNI,
  0.999141 on AVX2, 7.9e-4). So a cosine limit is never more than 0.04 below its baseline;
* sqnr_db: 20 dB abs (a 10x larger error amplitude; the measured cross-ISA gap was 11.1 dB),
  0.5 rel;
* rel_l2: 0.05 abs (the int8 stage tolerance itself), 4 rel (the limit at most 5x the
  baseline per slack, 9x with the cross-class one on top; the measured cross-ISA growth was
  3.6x); max_abs and mean_abs: 0.5 abs (half the unit scale of a LayerNorm-ed output), 4 rel.

Every default (``DEFAULT_GATE_TOLERANCES``, ``DEFAULT_CROSS_CLASS_SLACK``) is within them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from attn_export.errors import DataError
from attn_export.validate.gate.result import UNKNOWN_CLASS
from attn_export.validate.schema import (
    BASELINE_FORMAT_V1,
    BASELINE_FORMAT_V2,
    METRIC_DIRECTIONS,
    AccuracySchema,
    BaselineV1,
    BaselineV2,
    validate_baseline,
    validate_report,
)
from attn_export.vocab.precisions import PRECISIONS

__all__ = [
    "BASELINE_FORMAT",
    "DEFAULT_CROSS_CLASS_SLACK",
    "DEFAULT_GATE_TOLERANCES",
    "MAX_SLACK",
    "BaselineUpdate",
    "as_v2",
    "check_slack_bounds",
    "check_value_ranges",
    "cpu_class",
    "make_baseline",
    "read_baseline",
    "update_baseline",
]

BASELINE_FORMAT = BASELINE_FORMAT_V2  # what --update-baseline writes; format 1 is still read
_GATED = ("cosine", "sqnr_db", "rel_l2", "max_abs")  # mean_abs is reported, not gated by default

# One row per precision of the vocabulary (vocabulary.PRECISIONS says why each figure, fp8's included):
# plain dicts, as a baseline file writes them. slack = abs + rel * |baseline value|.
DEFAULT_GATE_TOLERANCES: dict[str, dict[str, dict[str, float]]] = {
    name: {metric: dict(slack) for metric, slack in p.gate_slack.items()} for name, p in PRECISIONS.items()
}
# Added to a metric's own slack when the report's CPU class has no entry of its own.
DEFAULT_CROSS_CLASS_SLACK: dict[str, dict[str, dict[str, float]]] = {
    name: {metric: dict(slack) for metric, slack in p.cross_class_slack.items()} for name, p in PRECISIONS.items()
}

# The most slack a baseline may give (the module docstring says why each figure).
MAX_SLACK: dict[str, dict[str, float]] = {
    "cosine": {"abs": 0.01, "rel": 0.01},
    "sqnr_db": {"abs": 20.0, "rel": 0.5},
    "rel_l2": {"abs": 0.05, "rel": 4.0},
    "max_abs": {"abs": 0.5, "rel": 4.0},
    "mean_abs": {"abs": 0.5, "rel": 4.0},
}


def cpu_class(report: Mapping[str, Any]) -> str:
    """The report's instruction-set class (``environment.cpu.isa_class``), or ``"unknown"``."""
    cpu = (report.get("environment") or {}).get("cpu") or {}
    return str(cpu.get("isa_class") or UNKNOWN_CLASS) if isinstance(cpu, Mapping) else UNKNOWN_CLASS


def as_v2(raw: Mapping[str, Any], parsed: BaselineV1 | BaselineV2) -> dict[str, Any]:
    """A format-1 baseline as a format-2 dict with one entry of class ``unknown``."""
    if isinstance(parsed, BaselineV2):
        return copy.deepcopy(dict(raw))
    out: dict[str, Any] = {"format": BASELINE_FORMAT_V2, "model": copy.deepcopy(raw.get("model") or {})}
    if raw.get("latency_margin") is not None:
        out["latency_margin"] = raw["latency_margin"]
    out["classes"] = {UNKNOWN_CLASS: {"recorded": {"from_format": BASELINE_FORMAT_V1}, "stages": copy.deepcopy(raw["stages"])}}
    return out


def check_slack_bounds(baseline: Mapping[str, Any], name: str = "baseline") -> None:
    """Refuse (one DataError line naming the field) any slack above ``MAX_SLACK``."""
    fix = "a gate that wide compares nothing: lower it (docs/ci-gate.md lists the maxima)"
    items = _metric_specs(baseline)
    items += [(f"cross_class_slack.{p}.{m}", m, spec) for p, metrics in (baseline.get("cross_class_slack") or {}).items() for m, spec in metrics.items()]
    for where, metric, spec in items:
        bound = MAX_SLACK.get(metric)
        for key in ("abs", "rel"):
            value = spec.get(key)
            if bound is not None and value is not None and float(value) > bound[key]:
                raise DataError(f"{name}: {where}.{key}: expected at most {bound[key]:g} (the gate's bound on {metric} slack), got {float(value):g}; {fix}")


def _metric_specs(baseline: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(where, metric, spec) of every metric entry of a schema-checked baseline, format 1 or 2."""
    if baseline.get("format") == BASELINE_FORMAT_V1:
        return [(f"stages.{s}.metrics.{m}", m, spec) for s, st in (baseline.get("stages") or {}).items() for m, spec in (st.get("metrics") or {}).items()]
    return [(f"classes.{c}.stages.{s}.metrics.{m}", m, spec) for c, entry in (baseline.get("classes") or {}).items()
            for s, st in (entry.get("stages") or {}).items() for m, spec in (st.get("metrics") or {}).items()]  # fmt: skip


def check_value_ranges(baseline: Mapping[str, Any], name: str = "baseline") -> None:
    """Refuse (one DataError line naming the field) a baseline value its metric cannot take: the ranges a
    report's accuracy figures are held to (``schema.AccuracySchema``: cosine in [-1, 1], errors >= 0).
    A cosine of 1.5 is no figure any run can reach: every report would be "a regression" against it."""
    from pydantic import ValidationError

    for where, metric, spec in _metric_specs(baseline):
        try:
            AccuracySchema.model_validate({metric: spec["value"]}, strict=True, context={"finite": True})
        except ValidationError as err:
            expected = err.errors()[0]["msg"]
            raise DataError(f"{name}: {where}.value: expected {expected} (the range of {metric}), got {spec['value']!r}; "
                            "correct that value, or record a fresh baseline with attn-export check REPORT --baseline NEW.json --update-baseline") from None  # fmt: skip


def read_baseline(raw: Mapping[str, Any], name: str = "baseline") -> dict[str, Any]:
    """Validate a baseline (schema, value ranges, then slack bounds) and return it as a format-2 dict."""
    parsed = validate_baseline(raw, name)
    check_value_ranges(raw, name)
    check_slack_bounds(raw, name)
    return as_v2(raw, parsed)


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
    base = read_baseline(previous, baseline_name) if previous is not None else {
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
