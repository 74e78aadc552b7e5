"""Encoder metrics: sentence embeddings (per-text cosine, nearest-neighbour agreement) and classifier logits.

A flattened-tensor cosine can hide a few badly damaged sentences among many good ones,
and what users do with sentence embeddings is retrieval. So an encoder artifact is judged
per text (mean and worst cosine to the eager fp32 embedding) and by whether each text's
nearest neighbour among the others is still the same text.

A classifier is used for its labels: ``classification_agreement`` reports the fraction of
texts (or real tokens, for token classification) whose arg-max label is unchanged, beside the
per-row logit cosine and the worst row, so a compression that keeps the cosine but flips close
calls shows. ``logit_rows`` lays a head's batches out as those rows (a token head's padding
left out), with the text and token position of each, so the report can name the worst token.
A reranker (a cross-encoder over query/candidate pairs) is used for the order of each query's
candidates: ``rank_agreement`` reports how much of that order survives.
"""

from __future__ import annotations

import numpy as np

from attn_export.checkpoint.output_agreement import RECALL_K, label_agreement, neighbour_agreement, neighbour_order, row_cosines
from attn_export.errors import DataError

__all__ = ["NEAR_TIE_COSINE", "RECALL_K", "classification_agreement", "embedding_agreement", "logit_rows", "rank_agreement", "row_cosines", "wilson_interval"]


# Two neighbours of the reference closer than this in cosine are a near-tie: a change of top-1 between
# them says little (rounding alone can swap them), so their count is reported beside the agreement.
NEAR_TIE_COSINE = 1e-3


def wilson_interval(successes: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion: honest for small ``n`` and for rates near 1."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def embedding_agreement(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """Compare sentence embeddings (N, D) of the same N texts.

    Returns ``mean_cosine`` and ``min_cosine`` (per text, vs the reference), and for retrieval:
    ``top1_neighbor_agreement`` (fraction of texts whose nearest other text is unchanged) with
    its 95% Wilson interval (``top1_ci_low``/``top1_ci_high``) and ``near_ties`` (texts whose two
    nearest reference neighbours are within ``NEAR_TIE_COSINE``), ``recall_at_10`` (mean overlap
    of each text's 10 nearest neighbours, reference vs candidate; fewer when N is small) and
    ``num_texts``.
    """
    ref = np.asarray(reference)
    out = np.asarray(candidate)
    if ref.ndim != 2 or ref.shape != out.shape:
        raise DataError(f"expected two (N, D) embedding arrays of the same shape, got {ref.shape} and {out.shape}")
    if ref.shape[0] < 2:
        raise DataError(f"expected at least 2 texts to compare neighbours, got {ref.shape[0]}")
    n = ref.shape[0]
    if not np.all(np.isfinite(out)):
        nan = float("nan")
        return {"mean_cosine": nan, "min_cosine": nan, "top1_neighbor_agreement": 0.0, "top1_ci_low": 0.0, "top1_ci_high": 0.0,
                "near_ties": 0.0, "recall_at_10": 0.0, "num_texts": float(n)}  # fmt: skip
    cos = row_cosines(ref, out)
    ref_sim, ref_order = neighbour_order(ref)
    agree, recall = neighbour_agreement(ref, out)  # the arithmetic a Jetson bundle ships (checkpoint.output_agreement)
    near = 0
    if n > 2:
        top2 = np.take_along_axis(ref_sim, ref_order[:, :2], axis=-1)
        near = int(np.sum(top2[:, 0] - top2[:, 1] < NEAR_TIE_COSINE))
    low, high = wilson_interval(float(agree.sum()), n)
    return {
        "mean_cosine": float(cos.mean()),
        "min_cosine": float(cos.min()),
        "top1_neighbor_agreement": float(agree.mean()),
        "top1_ci_low": low,
        "top1_ci_high": high,
        "near_ties": float(near),
        "recall_at_10": float(recall),
        "num_texts": float(n),
    }


def classification_agreement(reference: np.ndarray, candidate: np.ndarray, mask: np.ndarray | None = None) -> dict[str, float]:
    """Compare classifier logits: (N, L) per text, or (B, S, L) per token with ``mask`` (B, S), 1 = real token.

    Returns ``label_agreement`` (fraction of rows with the same arg-max label), ``mean_cosine``
    and ``min_cosine`` of the logit rows, ``worst_row`` (the index, among the rows compared, of the
    lowest cosine), ``max_abs``, ``rel_l2`` (||candidate - reference|| / ||reference||) and ``num_rows``.
    """
    ref = np.asarray(reference, dtype=np.float64)
    out = np.asarray(candidate, dtype=np.float64)
    if ref.shape != out.shape or ref.ndim not in (2, 3):
        raise DataError(f"expected two logit arrays of the same (N, L) or (B, S, L) shape, got {ref.shape} and {out.shape}")
    if ref.ndim == 3:
        if mask is None or np.asarray(mask).shape != ref.shape[:2]:
            raise DataError(f"expected a (B, S) mask for (B, S, L) token logits, got {None if mask is None else np.asarray(mask).shape}")
        keep = np.asarray(mask).astype(bool)
        ref, out = ref[keep], out[keep]  # (real tokens, L)
    if ref.shape[0] < 1:
        raise DataError("expected at least one row of logits to compare, got none")
    if not np.all(np.isfinite(out)):
        nan = float("nan")
        bad = int(np.flatnonzero(~np.isfinite(out).all(axis=-1))[0])
        return {"label_agreement": 0.0, "mean_cosine": nan, "min_cosine": nan, "worst_row": float(bad), "max_abs": nan, "rel_l2": nan,
                "num_rows": float(ref.shape[0])}  # fmt: skip
    cos = row_cosines(ref, out)
    return {
        "label_agreement": label_agreement(ref, out),
        "mean_cosine": float(cos.mean()),
        "min_cosine": float(cos.min()),
        "worst_row": float(np.argmin(cos)),
        "max_abs": float(np.abs(ref - out).max()),
        "rel_l2": float(np.linalg.norm(out - ref) / max(float(np.linalg.norm(ref)), 1e-30)),
        "num_rows": float(ref.shape[0]),
    }


def logit_rows(batches: list[np.ndarray], masks: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A head's logits batch by batch as the rows its users read: (B, L) per text as they are, (B, S, L) per real token.

    Returns (rows, where): ``where`` (rows, 2) holds each row's text index over all the batches and its
    token position (-1 for a text's own row). Padding is never a row: no user reads it.
    """
    rows, where, start = [], [], 0
    for logits, mask in zip(batches, masks, strict=True):
        logits = np.asarray(logits, dtype=np.float32)
        if logits.ndim == 3:
            texts, positions = np.nonzero(np.asarray(mask).astype(bool))  # row-major: text by text, tokens in order
            rows.append(logits[texts, positions])
            where.append(np.stack([texts + start, positions], axis=-1))
        else:
            rows.append(logits)
            where.append(np.stack([np.arange(len(logits)) + start, np.full(len(logits), -1)], axis=-1))
        start += len(logits)
    return np.concatenate(rows), np.concatenate(where)


def reranker_scores(logits: np.ndarray) -> np.ndarray:
    """What a cross-encoder ranks by: its one logit, or with several labels the log-probability of the last
    (sentence-transformers' ``CrossEncoder`` with two labels: label 1 is "relevant")."""
    x = np.asarray(logits, dtype=np.float64)
    if x.shape[-1] == 1:
        return x[:, 0]
    top = x.max(axis=-1, keepdims=True)
    return x[:, -1] - (top[:, 0] + np.log(np.exp(x - top).sum(axis=-1)))


def rank_agreement(reference: np.ndarray, candidate: np.ndarray, queries: list[str]) -> dict[str, float]:
    """Compare a reranker's logits (N, L) of N (query, candidate) pairs, ``queries`` naming each pair's query.

    Over the queries with at least two candidates: ``pair_order_agreement`` (the fraction of candidate pairs of a
    query that the scores order the same way: Kendall's tau as a rate, ties in the reference left out),
    ``top1_agreement`` (the fraction of queries whose best candidate is unchanged) and ``num_queries``.
    """
    ref, out = reranker_scores(reference), reranker_scores(candidate)
    if len(queries) != len(ref) or ref.shape != out.shape:
        raise DataError(f"expected one query per scored pair, got {len(queries)} queries for {len(ref)} and {len(out)} scores")
    groups: dict[str, list[int]] = {}
    for i, q in enumerate(queries):
        groups.setdefault(q, []).append(i)
    same = pairs = top1 = n = 0
    for members in groups.values():
        if len(members) < 2:
            continue
        idx = np.asarray(members)
        # hand-rolled: a query has a handful of candidates, so every pair is counted exactly (scipy is no dependency)
        dr = np.sign(ref[idx][:, None] - ref[idx][None, :])
        do = np.sign(out[idx][:, None] - out[idx][None, :])
        upper = np.triu(dr != 0, k=1)
        same += int(np.sum((dr == do) & upper))
        pairs += int(upper.sum())
        top1 += int(np.argmax(ref[idx]) == np.argmax(out[idx]))
        n += 1
    return {"pair_order_agreement": same / pairs if pairs else float("nan"), "top1_agreement": top1 / n if n else float("nan"), "num_queries": float(n)}
