"""Placement by node labels: which points this machine runs, which need another node, and whether a cluster has one.

A point whose target names labels (``{sm = "87", jetpack = "6.2"}``) runs its engine build, on-device timing
and judging on a node with those labels (Ray label selectors: ``.options(label_selector=...)``, beta since
Ray 2.49; Jetson has no ``ray.io/accelerator-type`` value, so custom labels name it). A point without labels
(export, compression, CPU judging) runs anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from attn_export.errors import ConfigError

__all__ = ["matches", "check_cluster_has", "runs_here"]


def matches(wanted: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(str(labels.get(k)) == str(v) for k, v in wanted.items())


def runs_here(wanted: Mapping[str, str]) -> bool:
    """Without Ray this machine has no labels: it runs the points that ask for none."""
    return not wanted


def check_cluster_has(points: Iterable[object], node_labels: list[Mapping[str, str]]) -> None:
    """Refuse (one line, before any work) a point whose labels no alive node has."""
    for p in points:
        wanted = getattr(p, "labels")
        if wanted and not any(matches(wanted, n) for n in node_labels):
            shown = ", ".join(f"{k}={v}" for k, v in wanted.items())
            raise ConfigError(f"target {getattr(p, 'target')!r} asks for labels {{{shown}}} that no node of the cluster has; "
                              "start a node with them (ray start --labels ...) or fix the target's labels")  # fmt: skip
