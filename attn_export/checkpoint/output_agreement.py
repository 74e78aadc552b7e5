"""The arithmetic of output agreement: per-row cosine, top-1 neighbour and recall@10 agreement, label agreement.

Why a module of its own, with numpy and the standard library only: the same numbers judge an
artifact on the host (``checkpoint.metrics``, ``deploy.golden_judge``) and an engine on a Jetson,
where attn-export is not installed. A Jetson bundle ships this file as it is, beside
``golden_on_device.py``; so it imports nothing from attn-export and raises ``ValueError``
(the package's callers check their inputs first and raise their own errors).

``judge_rows`` is the golden verdict of one output (old stack vs new stack): a row (a text)
*moved* when its cosine with its golden row is below ``min_cosine`` or its relative error
``|new - old| / |old|`` (L2, per row) is above ``max_rel_error``: the cosine sees a turn, only
the scale sees outputs grown 1000-fold; embeddings must also keep their top-1 neighbours and
recall@10, logits their arg-max labels. A NaN or inf, in the golden or in the new outputs, fails
the output by name and count: nothing non-finite ever compares as equal.

Why a row's relative error and not Polygraphy's element check (``CompareFunc.simple``: an element
fails when ``|a - b| > atol`` and ``|a - b| > rtol * |b|``, defaults 1e-5): its ``atol`` depends on
the output's scale and its ``rtol`` fails near-zero elements, while a row's error is scale-free and
one number per text, like its cosine; ``polygraphy run --load-outputs golden.json`` still gives
the element check on the same files.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DEFAULT_THRESHOLDS", "KINDS", "RECALL_K", "describe_row", "failure_verb", "judge_rows", "label_agreement",
           "neighbour_agreement", "neighbour_order", "row_cosines", "row_relative_errors", "unit_rows"]

RECALL_K = 10
KINDS = ("embedding", "labels", "tensor")
# What a new stack must keep of the golden outputs of the same artifact: a rounding change passes, a miscompiled
# kernel does not. max_rel_error 0.1 is what cosine 0.995 allows at an unchanged norm (sqrt(2 * (1 - 0.995))):
# a turn the cosine passes passes the scale too, and a norm off by more than about 10% fails.
DEFAULT_THRESHOLDS = {"min_cosine": 0.995, "min_top1": 0.95, "min_recall_at_10": 0.95, "min_label_agreement": 0.99,
                      "max_rel_error": 0.1}


def unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def row_cosines(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """Cosine of each row of ``candidate`` (N, D) with the same row of ``reference``: (N,)."""
    return np.sum(unit_rows(reference) * unit_rows(candidate), axis=-1)


def row_relative_errors(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """``|candidate - reference| / |reference|`` (L2) of each row (N, D): (N,); 0 where both rows are zero."""
    reference, candidate = np.asarray(reference, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    return np.linalg.norm(candidate - reference, axis=-1) / np.maximum(np.linalg.norm(reference, axis=-1), 1e-12)


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


def _thresholds(given: dict | None) -> dict:
    """The defaults overridden by ``given`` (a golden's stack.json, unchecked on the device): each a finite number."""
    t = {**DEFAULT_THRESHOLDS, **(given or {})}
    for key, value in t.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            raise ValueError(f"threshold {key} must be a finite number, got {value!r}")
    return t


def _nonfinite(where: str, bad: np.ndarray) -> list:
    """The failure naming the NaN/inf values of one side (the golden or the new outputs), if any."""
    if not bad.any():
        return []
    verb, count, rows = "holds" if where == "the golden" else "hold", int(bad.sum()), int(bad.any(axis=-1).sum())
    values = f"{count} non-finite value{'s' if count != 1 else ''} (NaN or inf)"
    return [f"{where} {verb} {values} in {rows} of {len(bad)} texts"]


def failure_verb(metrics: dict) -> str:
    """How a failed output reads: 'moved' when its numbers are finite, 'is not finite' when a side holds NaN/inf."""
    return "is not finite" if metrics.get("nonfinite_golden") or metrics.get("nonfinite_outputs") else "moved"


def judge_rows(kind: str, old: np.ndarray, new: np.ndarray, thresholds: dict | None = None) -> tuple[dict, list, list]:
    """One output, rows = texts (N, features): (metrics, failures, moved rows), the moved rows as
    (index, cosine, relative error), lowest cosine first.

    Every metric is a finite number (the report is strict JSON); a row holding NaN or inf on either
    side counts as moved with cosine -1 and is left out of ``max_rel_error`` (its relative error in the
    moved list is inf: ``describe_row`` says "not finite").
    """
    t = _thresholds(thresholds)
    old, new = np.asarray(old, dtype=np.float64), np.asarray(new, dtype=np.float64)
    if kind not in KINDS:
        raise ValueError(f"judge kind {kind!r}; expected one of {list(KINDS)}")
    if old.shape != new.shape or old.ndim != 2 or not len(old):
        raise ValueError(f"expected two (texts, features) arrays of the same shape with a text or more, "
                         f"got {old.shape} and {new.shape}")
    bad_old, bad_new = ~np.isfinite(old), ~np.isfinite(new)
    finite = ~(bad_old.any(axis=-1) | bad_new.any(axis=-1))  # rows whose numbers can be compared at all
    failures: list = _nonfinite("the golden", bad_old) + _nonfinite("the model's outputs", bad_new)
    a, b = np.where(finite[:, None], old, 0.0), np.where(finite[:, None], new, 0.0)
    zero = (np.linalg.norm(a, axis=-1) == 0) & (np.linalg.norm(b, axis=-1) == 0)  # all-zero, kept all-zero: not turned
    cos = np.where(finite, np.where(zero, 1.0, row_cosines(a, b)), -1.0)
    rel = np.where(finite, row_relative_errors(a, b), 0.0)
    metrics = {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()), "max_rel_error": float(rel.max()),
               "texts": float(len(cos)), "nonfinite_golden": float(bad_old.sum()),
               "nonfinite_outputs": float(bad_new.sum())}
    if kind == "embedding" and len(cos) >= 2 and finite.all():  # NaN has no neighbours: the failure above says so
        top1, recall = neighbour_agreement(old, new)
        metrics |= {"top1_neighbor_agreement": float(top1.mean()), "recall_at_10": recall}
        if top1.mean() < t["min_top1"]:
            failures.append(f"top-1 neighbour agreement {top1.mean():.4f} < {t['min_top1']}")
        if recall < t["min_recall_at_10"]:
            failures.append(f"recall@10 agreement {recall:.4f} < {t['min_recall_at_10']}")
    elif kind == "labels" and finite.all():
        labels = label_agreement(old, new)
        metrics["label_agreement"] = labels
        if labels < t["min_label_agreement"]:
            failures.append(f"label agreement {labels:.4f} < {t['min_label_agreement']}")
    turned, scaled = finite & (cos < t["min_cosine"]), rel > t["max_rel_error"]
    if turned.any():
        failures.append(f"{int(turned.sum())} of {len(cos)} texts below cosine {t['min_cosine']}")
    if scaled.any():
        failures.append(f"{int(scaled.sum())} of {len(cos)} texts off the golden by relative error "
                        f"> {t['max_rel_error']} (largest {rel.max():.4g})")
    moved = np.flatnonzero(~finite | turned | scaled)
    metrics["texts_moved"] = float(len(moved))
    worst = ((int(i), float(cos[i]), float(rel[i]) if finite[i] else float("inf")) for i in moved)
    return metrics, failures, sorted(worst, key=lambda p: (p[1], -p[2]))


def describe_row(cosine: float, rel_error: float) -> str:
    """A moved text's numbers, as both the host and the device print them; a row holding NaN/inf says so."""
    return "not finite" if rel_error == float("inf") else f"cosine {cosine:.4f} relative error {rel_error:.4g}"
