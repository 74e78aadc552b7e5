"""What the CI gate found: one ``GateCheck`` per comparison, and the ``GateResult`` that prints them.

Kept apart from the comparison (``gate``), the baselines (``gate_baselines``) and the artifact
hashes (``gate_hashes``) so each can build checks without importing the others.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["UNKNOWN_CLASS", "GateCheck", "GateResult"]

UNKNOWN_CLASS = "unknown"  # a report without environment.cpu.isa_class, or a format-1 baseline


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
