"""Accuracy-vs-latency points and their Pareto front (lower latency, higher accuracy).

Shared by the report plots and the sweep, and free of matplotlib so the sweep's table can be
computed where plotting is not wanted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ParetoPoint", "pareto_front", "points_from_report"]


@dataclass
class ParetoPoint:
    """One configuration: its latency (ms, or relative to eager; lower is better) and accuracy (higher is better)."""

    label: str
    latency: float
    accuracy: float
    info: dict[str, Any] = field(default_factory=dict)


def pareto_front(points: Sequence[ParetoPoint]) -> list[int]:
    """Indices of the non-dominated points, sorted by latency.

    A point is dominated when another is at least as fast and at least as accurate and
    strictly better in one of the two. Ties (identical figures) all stay on the front.
    """
    front = []
    for i, p in enumerate(points):
        dominated = any(
            q.latency <= p.latency
            and q.accuracy >= p.accuracy
            and (q.latency < p.latency or q.accuracy > p.accuracy)
            for j, q in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i].latency, -points[i].accuracy))


def points_from_report(
    report: Mapping[str, Any], metric: str = "sqnr_db", include_eager: bool = True, relative: bool = True
) -> list[ParetoPoint]:
    """One point per stage with an accuracy and an artifact latency, plus eager itself.

    ``relative=True`` places each stage at artifact p50 / eager p50 of the *same* stage (timed
    round-robin together), which survives machine load drifting between stages; eager is 1.0.
    Stages without an eager timing fall back to nothing (relative) or to their p50 in ms.
    """
    points: list[ParetoPoint] = []
    eager_ms: list[float] = []
    for s in report.get("stages", []):
        lat = (s.get("latency_ms") or {}).get("artifact") or {}
        acc = (s.get("accuracy") or {}).get(metric)
        eager = ((s.get("latency_ms") or {}).get("eager") or {}).get("p50")
        if eager:
            eager_ms.append(float(eager))
        if lat.get("p50") is None or acc is None or (relative and not eager):
            continue
        x = float(lat["p50"]) / float(eager) if relative else float(lat["p50"])
        points.append(ParetoPoint(s["name"], x, float(acc), {"precision": s.get("precision")}))
    if include_eager and eager_ms and points:
        best = max(p.accuracy for p in points)
        exact = 300.0 if metric == "sqnr_db" else (1.0 if metric == "cosine" else best)
        eager_ms.sort()
        x = 1.0 if relative else eager_ms[len(eager_ms) // 2]
        points.append(ParetoPoint("eager", x, exact, {"precision": "fp32", "reference": True}))
    return points
