"""The matrix on a Ray cluster: one task per point, placed by the target's node labels.

A task whose node dies is retried by Ray on another node the label selector allows (``max_retries``
counts system failures such as a dead worker or node, not a point's own failure: run_point returns
those as records), up to the fleet's ``max_retries``; a task out of retries is reported in one line and
the others' results are kept. Every finished point is in the cache, so a rerun resumes from there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from attn_export.campaigns.fleet.local import Update
from attn_export.campaigns.fleet.matrix import FleetPoint

__all__ = ["cluster_labels", "run_ray"]

# How often (seconds) the alive nodes are checked against the points still waiting.
STRANDED_CHECK_S = 5.0


def _marker(cache_root: str, key: str) -> Path:
    """Where a started task says which node runs it (read by the live table; seen when the cache is shared)."""
    return Path(cache_root) / ".running" / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def _on_node(config: Any, inputs: str, cache_root: str, cache_limit: int, key: str, sm: str | None) -> dict[str, Any]:
    import ray

    from attn_export.campaigns.fleet.point import run_point
    from attn_export.outdir.atomic import atomic_write_bytes

    ctx = ray.get_runtime_context()
    labels = {k: v for k, v in ctx.get_node_labels().items() if not k.startswith("ray.io/")}
    node = {"node": ctx.get_node_id()[:12], "labels": labels}
    atomic_write_bytes(_marker(cache_root, key), json.dumps(node).encode())
    return run_point(config, inputs, cache_root, cache_limit, node, sm)


def _report_started(pending: dict[Any, FleetPoint], seen: dict[str, str], cache_root: str, update: Update) -> None:
    """A row turns 'running on NODE' when its task starts, and again if a retry starts it on another node."""
    for p in pending.values():
        with contextlib.suppress(OSError, ValueError):
            node = json.loads(_marker(cache_root, p.key).read_text(encoding="utf-8"))
            if seen.get(p.key) != node["node"]:
                seen[p.key] = node["node"]
                update(p.key, "running", node)


def _report_stranded(pending: dict[Any, FleetPoint], records: dict[str, dict[str, Any]], update: Update) -> None:
    import ray

    from attn_export.campaigns.fleet.placement import matches

    alive = cluster_labels()
    for ref, p in list(pending.items()):
        if p.labels and not any(matches(p.labels, n) for n in alive):
            ray.cancel(ref, force=True)
            del pending[ref]
            shown = ", ".join(f"{k}={v}" for k, v in p.labels.items())
            records[p.key] = {"status": "failed", "labels": p.labels, "reason": f"no alive node with {shown} is left to run it; rerun when one is back"}
            update(p.key, "failed", records[p.key])


def cluster_labels() -> list[dict[str, str]]:
    """The labels of every alive node of the connected cluster."""
    import ray

    return [dict(n.get("Labels", {})) for n in ray.nodes() if n.get("Alive")]


def run_ray(points: list[FleetPoint], cache_root: str, cache_limit: int, max_retries: int, update: Update) -> dict[str, dict[str, Any]]:
    """Submit every point (label-selected), collect as they finish; a task lost for good becomes a failed record."""
    import ray

    task = ray.remote(num_cpus=1)(_on_node)
    pending: dict[Any, FleetPoint] = {}
    for p in points:
        ref = task.options(label_selector=dict(p.labels) or None, max_retries=max_retries, retry_exceptions=False).remote(
            p.config, p.inputs, cache_root, cache_limit, p.key, p.labels.get("sm"))
        pending[ref] = p
        update(p.key, "queued", None)
    records: dict[str, dict[str, Any]] = {}
    seen: dict[str, str] = {}
    waited = 0.0
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
        _report_started(pending, seen, cache_root, update)
        if not done:
            waited += 1.0
            if waited >= STRANDED_CHECK_S:  # a point whose every matching node died would wait for ever: report it instead
                waited = 0.0
                _report_stranded(pending, records, update)
            continue
        p = pending.pop(done[0])
        _marker(cache_root, p.key).unlink(missing_ok=True)
        try:
            records[p.key] = ray.get(done[0])
        except Exception as e:  # the node died more often than max_retries allows: one line, the rest go on
            line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            records[p.key] = {"status": "failed", "labels": p.labels, "reason": f"{type(e).__name__} after {max_retries} retries: {line}"}
        update(p.key, records[p.key]["status"], records[p.key])
    return records
