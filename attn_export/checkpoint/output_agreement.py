"""The arithmetic of output agreement: per-row cosine, top-1 neighbour and recall@10 agreement, label agreement.

Why a module of its own, with numpy and the standard library only: the same numbers judge an
artifact on the host (``checkpoint.metrics``, ``deploy.golden_judge``) and an engine on a Jetson,
where attn-export is not installed. A Jetson bundle ships this file as it is, beside
``golden_on_device.py``; so it imports nothing from attn-export and raises ``ValueError``
(the package's callers check their inputs first and raise their own errors).

``judge_rows`` is the golden verdict of one output (old stack vs new stack): a row (a text)
*moved* when its cosine with its golden row is below ``min_cosine``; embeddings must also keep
their top-1 neighbours and recall@10, logits their arg-max labels.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DEFAULT_THRESHOLDS", "KINDS", "RECALL_K", "label_agreement", "neighbour_agreement", "neighbour_order", "row_cosines", "unit_rows", "judge_rows"]

RECALL_K = 10
KINDS = ("embedding", "labels", "tensor")
# What a new stack must keep of the golden outputs of the same artifact: a rounding change passes, a miscompiled kernel does not.
DEFAULT_THRESHOLDS = {"min_cosine": 0.995, "min_top1": 0.95, "min_recall_at_10": 0.95, "min_label_agreement": 0.99}


def unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def row_cosines(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """Cosine of each row of ``candidate`` (N, D) with the same row of ``reference``: (N,)."""
    return np.sum(unit_rows(reference) * unit_rows(candidate), axis=-1)


def neighbour_order(embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(similarities with the diagonal at -inf, each row's other texts by decreasing similarity)."""
    unit = unit_rows(embeddings)
    sim = unit @ unit.T  # (N, N)
    np.fill_diagonal(sim, -np.inf)
    return sim, np.argsort(-sim, axis=-1, kind="stable")


def neighbour_agreement(reference: np.ndarray, candidate: np.ndarray) -> tuple[np.ndarray, float]:
    """(per text: is its nearest other text unchanged, mean overlap of the ``RECALL_K`` nearest) for (N >= 2, D) rows."""
    n = len(reference)
    if n < 2:
        raise ValueError(f"expected at least 2 texts to compare neighbours, got {n}")
    _, ref_order = neighbour_order(reference)
    _, out_order = neighbour_order(candidate)
    k = min(RECALL_K, n - 1)
    recall = float(np.mean([len(set(ref_order[i, :k]) & set(out_order[i, :k])) / k for i in range(n)]))
    return ref_order[:, 0] == out_order[:, 0], recall


def label_agreement(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Fraction of rows (N, L) whose arg-max label is unchanged."""
    return float(np.mean(np.asarray(reference).argmax(-1) == np.asarray(candidate).argmax(-1)))


def judge_rows(kind: str, old: np.ndarray, new: np.ndarray, thresholds: dict | None = None) -> tuple[dict, list, list]:
    """One output, rows = texts (N, features): (metrics, failures, moved rows as (index, cosine) lowest first)."""
    t = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    old, new = np.asarray(old, dtype=np.float64), np.asarray(new, dtype=np.float64)
    if kind not in KINDS:
        raise ValueError(f"judge kind {kind!r}; expected one of {list(KINDS)}")
    if old.shape != new.shape or old.ndim != 2:
        raise ValueError(f"expected two (texts, features) arrays of the same shape, got {old.shape} and {new.shape}")
    finite = np.isfinite(new).all(axis=-1)
    cos = np.where(finite, row_cosines(old, np.nan_to_num(new)), -1.0)  # a NaN/Inf row has moved as far as it can
    failures: list = []
    metrics = {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()), "texts": float(len(cos))}
    if kind == "embedding" and len(cos) >= 2:
        top1, recall = neighbour_agreement(old, new) if finite.all() else (np.zeros(len(cos), bool), 0.0)
        metrics |= {"top1_neighbor_agreement": float(top1.mean()), "recall_at_10": recall}
        if top1.mean() < t["min_top1"]:
            failures.append(f"top-1 neighbour agreement {top1.mean():.4f} < {t['min_top1']}")
        if recall < t["min_recall_at_10"]:
            failures.append(f"recall@10 agreement {recall:.4f} < {t['min_recall_at_10']}")
    elif kind == "labels":
        labels = label_agreement(old, new) if finite.all() else 0.0
        metrics["label_agreement"] = labels
        if labels < t["min_label_agreement"]:
            failures.append(f"label agreement {labels:.4f} < {t['min_label_agreement']}")
    moved = np.flatnonzero(cos < t["min_cosine"])
    metrics["texts_moved"] = float(len(moved))
    if len(moved):
        failures.append(f"{len(moved)} of {len(cos)} texts below cosine {t['min_cosine']}")
    return metrics, failures, sorted(((int(i), float(cos[i])) for i in moved), key=lambda p: p[1])
