"""fleet-out/: one report (fleet.json + fleet.md: every point's accuracy, latency on its own hardware, size,
node; a Pareto view per target), every point's own report folder, and a Triton repository of engines per
compute capability where a point built one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from attn_export.campaigns.fleet.entry import entry_check
from attn_export.campaigns.fleet.matrix import FleetPoint
from attn_export.errors import ConfigError
from attn_export.validate.pareto import ParetoPoint, pareto_front

__all__ = ["FLEET_KIND", "check_fleet_out", "fleet_result", "write_fleet"]

FLEET_KIND = "fleet"  # the kind in fleet-out's manifest (.attn-export-deploy.json)


def fleet_result(points: list[FleetPoint], records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The JSON-ready result: one row per point, and the Pareto front (SQNR vs p50) per target."""
    rows = [{"key": p.key, "model": p.model, "recipe": p.recipe, "target": p.target, "labels": p.labels, "command": p.command,
             **{k: v for k, v in records.get(p.key, {"status": "not-run"}).items() if k != "labels"}} for p in points]  # fmt: skip
    fronts: dict[str, list[str]] = {}
    for target in dict.fromkeys(p.target for p in points):
        judged = [r for r in rows if r["target"] == target and "accuracy" in r]
        pts = [ParetoPoint(r["key"], r["latency_ms"], r["accuracy"]["sqnr_db"]) for r in judged]
        fronts[target] = [judged[i]["key"] for i in pareto_front(pts)]
    return {"kind": "fleet", "points": rows, "pareto": fronts, "counts": _counts(rows)}


def _counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}


def _table(rows: list[dict[str, Any]], front: list[str]) -> list[str]:
    lines = ["| point | status | built on | cosine | SQNR dB | p50 ms | MiB | Pareto | note |", "|" + "---|" * 9]
    for r in rows:
        a = r.get("accuracy") or {}
        cos = f"{a['cosine']:.6f}" if a else "-"
        sqnr = f"{a['sqnr_db']:.1f}" if a else "-"
        p50 = f"{r['latency_ms']:.3f}" if "latency_ms" in r else "-"
        mib = f"{r['size_bytes'] / 2**20:.2f}" if r.get("size_bytes") else "-"
        note = r.get("reason") or (f"stand-in: {r['stand_in']}" if r.get("stand_in") else "")
        node = r.get("built_on") or r.get("node", "-")  # a cache hit's figures were measured where it was built
        lines.append(f"| {r['key']} | {r['status']} | {node} | {cos} | {sqnr} | {p50} | {mib} | {'yes' if r['key'] in front else ''} | {note} |")
    return lines


def write_fleet(result: dict[str, Any], out: Path) -> list[Path]:
    """Write fleet-out: staged inside ``out``, then published over attn-export's own earlier files only.

    ``out`` holds only what a fleet wrote (``deploy/folder.py``'s manifest): a file of the user's there
    is refused in one line (``check_fleet_out``, before any work), never overwritten or deleted.
    """
    from attn_export.deploy.folder import publish, staging
    from attn_export.deploy.triton_cc import write_cc_repository

    with staging(out) as tmp:
        engines: dict[str, dict[str, Path]] = {}
        for r in result["points"]:
            if r.get("folder"):
                dest = tmp / "points" / r["key"]
                shutil.copytree(r["folder"], dest, symlinks=True, ignore=shutil.ignore_patterns(".last-used"))
                why = entry_check(dest, r["cache_key"]) if r.get("cache_key") else None
                if why is not None:  # the copy is checked, not only the entry: nothing changed between the two
                    shutil.rmtree(dest)
                    r.update(status="failed", reason=f"its cache entry changed after it was verified ({why}); rerun")
                    for figure in ("accuracy", "latency_ms", "folder"):
                        r.pop(figure, None)
                    result["pareto"][r["target"]] = [k for k in result["pareto"].get(r["target"], []) if k != r["key"]]
                    continue
                r["report"] = str(out / "points" / r["key"] / "report.md")
                sm = (r.get("labels") or {}).get("sm")
                for plan in dest.glob("*.engine"):  # an engine is for one compute capability: Triton picks it per GPU
                    if sm:
                        engines.setdefault(r["model"] + "-" + r["recipe"], {})[sm] = plan
        result["counts"] = _counts(result["points"])
        (tmp / "fleet.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        lines = [f"# Fleet: {len(result['points'])} points", "", ", ".join(f"{n} {s}" for s, n in result["counts"].items()), ""]
        for target, front in result["pareto"].items():
            lines += [f"## {target}", "", *_table([r for r in result["points"] if r["target"] == target], front), ""]
        (tmp / "fleet.md").write_text("\n".join(lines))
        for name, by_cc in engines.items():
            write_cc_repository(tmp / "triton", name, by_cc)
        written = [out / p.relative_to(tmp) for p in sorted(tmp.rglob("*")) if p.is_file()]
        publish(tmp, out, "--out", FLEET_KIND)
    return written


def check_fleet_out(out: Path) -> None:
    """Before any work: ``out`` is new, or holds only what an earlier fleet wrote (one line naming a foreign file)."""
    from attn_export.deploy.folder import refuse_foreign

    if out.exists() and (out.is_symlink() or not out.is_dir()):
        raise ConfigError(f"--out {out} is not a folder; pass a new folder or an earlier fleet-out")
    refuse_foreign(out, "--out")
