"""The matrix in this process, one point after another, on what this machine can run (no Ray)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attn_export.campaigns.fleet.matrix import FleetPoint
from attn_export.campaigns.fleet.placement import runs_here
from attn_export.campaigns.fleet.point import run_point

__all__ = ["Update", "run_local"]

# progress: (point key, status, record or None)
Update = Callable[[str, str, dict[str, Any] | None], None]


def run_local(points: list[FleetPoint], cache_root: str, cache_limit: int, update: Update) -> dict[str, dict[str, Any]]:
    """Run every point this machine can; a point that needs labels is recorded as such (the labels it needs)."""
    records: dict[str, dict[str, Any]] = {}
    for p in points:
        if not runs_here(p.labels):
            records[p.key] = {"status": "needs-node", "labels": p.labels,
                              "reason": "needs a node with " + ", ".join(f"{k}={v}" for k, v in p.labels.items()) + " (run with --ray)"}  # fmt: skip
            update(p.key, "needs-node", records[p.key])
            continue
        update(p.key, "running", {"node": "local"})
        here = {"node": "local", "labels": {}}
        records[p.key] = run_point(p.config, p.inputs, cache_root, cache_limit, here, p.labels.get("sm"))
        update(p.key, records[p.key]["status"], records[p.key])
    return records
