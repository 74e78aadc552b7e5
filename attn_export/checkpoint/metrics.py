"""Sentence-embedding metrics: per-text cosine to the reference and nearest-neighbour agreement.

A flattened-tensor cosine can hide a few badly damaged sentences among many good ones,
and what users do with sentence embeddings is retrieval. So an encoder artifact is judged
per text (mean and worst cosine to the eager fp32 embedding) and by whether each text's
nearest neighbour among the others is still the same text.
"""

from __future__ import annotations

import numpy as np

from attn_export.errors import DataError

__all__ = ["embedding_agreement", "row_cosines", "top1_neighbors"]


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def row_cosines(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """Cosine of each row of ``candidate`` (N, D) with the same row of ``reference``: (N,)."""
    return np.sum(_unit_rows(reference) * _unit_rows(candidate), axis=-1)


def top1_neighbors(embeddings: np.ndarray) -> np.ndarray:
    """Index of each row's most cosine-similar other row (N,); ties go to the lower index."""
    unit = _unit_rows(embeddings)
    sim = unit @ unit.T  # (N, N)
    np.fill_diagonal(sim, -np.inf)  # a text is not its own neighbour
    return np.argmax(sim, axis=-1)


def embedding_agreement(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """Compare sentence embeddings (N, D) of the same N texts.

    Returns ``mean_cosine``, ``min_cosine`` (per text, vs the reference),
    ``top1_neighbor_agreement`` (fraction of texts whose nearest other text is unchanged)
    and ``num_texts``.
    """
    ref = np.asarray(reference)
    out = np.asarray(candidate)
    if ref.ndim != 2 or ref.shape != out.shape:
        raise DataError(f"expected two (N, D) embedding arrays of the same shape, got {ref.shape} and {out.shape}")
    if ref.shape[0] < 2:
        raise DataError(f"expected at least 2 texts to compare neighbours, got {ref.shape[0]}")
    if not np.all(np.isfinite(out)):
        nan = float("nan")
        return {"mean_cosine": nan, "min_cosine": nan, "top1_neighbor_agreement": 0.0, "num_texts": float(ref.shape[0])}
    cos = row_cosines(ref, out)
    agree = top1_neighbors(ref) == top1_neighbors(out)
    return {
        "mean_cosine": float(cos.mean()),
        "min_cosine": float(cos.min()),
        "top1_neighbor_agreement": float(agree.mean()),
        "num_texts": float(ref.shape[0]),
    }
