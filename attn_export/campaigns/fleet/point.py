"""Running one point where it was placed: from the cache if its key is there, else through the one pipeline.

The same function runs in-process (no Ray) and as a Ray task; it returns a small JSON-ready record
(the point's report folder stays in the cache, and is copied to fleet-out by ``result``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path
from typing import Any

from attn_export.campaigns.fleet.cache import Cache, canonical_config, point_key
from attn_export.outdir.manifest import MANIFEST_NAME

__all__ = ["BUILT_ON", "point_record", "run_point"]

# Beside a cached point's report: the node that built it (its latency was measured there).
BUILT_ON = "fleet-node.json"


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    """The deployed stage's accuracy, latency, size, and the stand-in note when the target's own runtime was not used."""
    stages = report["stages"]
    stage = next((s for s in reversed(stages) if s.get("passed")), stages[-1])
    runtime = stage.get("details", {}).get("runtime", {})
    return {"stage": stage["name"], "passed": bool(report["verdict"]["passed"]), "verdict": report["verdict"]["state"],
            "accuracy": stage["accuracy"], "latency_ms": stage["latency_ms"]["artifact"]["p50"],
            "speedup_vs_eager": stage.get("speedup_vs_eager"), "size_bytes": stage.get("size_bytes"),
            "stand_in": runtime.get("stand_in")}  # fmt: skip


def point_record(entry: Path) -> dict[str, Any]:
    return _summary(json.loads((entry / "report.json").read_text(encoding="utf-8")))


def _served(cache: Cache, key: str, config: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The record of a verified entry whose run was this point's RunConfig; or (None, why it cannot be served)."""
    hit, why = cache.lookup(key)
    if hit is None:
        return None, why
    try:  # verified byte for byte; what it says must still be this point and readable
        manifest = json.loads((hit / MANIFEST_NAME).read_text(encoding="utf-8"))
        if canonical_config(manifest.get("config", {})) != canonical_config(config.to_dict()):
            why = f"its {MANIFEST_NAME} is the run of another configuration"
        else:
            built_on = json.loads((hit / BUILT_ON).read_text(encoding="utf-8"))
            return {"status": "cached", "folder": str(hit), "built_on": built_on.get("node"), **point_record(hit)}, None
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        why = f"its report cannot be read ({type(e).__name__})"
    cache.discard(key)
    return None, why


def run_point(config: Any, inputs: str, cache_root: str, cache_limit: int, node: dict[str, Any] | None = None,
              compute_capability: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Run (or find) one point; ``config`` is its RunConfig, ``inputs`` the digest of what it reads
    (``inputs.InputDigests``). Never raises for a failed run: the record says why in one line.

    ``compute_capability``: the GPU the point's target asks for (its ``sm`` label), part of the key of what
    it builds there; a point without one (export, CPU judging) has the same key on every node. An entry that
    fails verification is rebuilt, and the record says why (``cache_rejected``)."""
    node = node or {"node": socket.gethostname(), "labels": {}}
    cache = Cache(cache_root, cache_limit)
    key = point_key(config.to_dict(), inputs, compute_capability)
    base = {"cache_key": key, "node": node["node"], "labels": node.get("labels", {}), "pid": os.getpid()}
    served, rejected = _served(cache, key, config)
    if served is not None:
        return {**base, **served}
    if rejected is not None:
        base["cache_rejected"] = rejected
    from attn_export.pipeline.runner import run

    try:
        with cache.writing(key) as tmp:
            run(dataclasses.replace(config, out=Path(tmp), render=True, force=False), None, quiet=True)
            record = point_record(Path(tmp))
            (Path(tmp) / BUILT_ON).write_text(json.dumps({"node": node["node"], "labels": node.get("labels", {})}) + "\n", encoding="utf-8")
    except Exception as e:  # a failed point is a result (one line), never the end of the fleet
        return {**base, "status": "failed", "reason": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    return {**base, "status": "passed" if record["passed"] else "failed", "folder": str(cache.entry(key)), **record}
