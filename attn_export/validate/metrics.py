"""Accuracy metrics of a candidate output against a reference, computed in float64."""

from __future__ import annotations

import math

import numpy as np

from attn_export.validate.report import Accuracy

__all__ = ["accuracy", "sqnr_db", "cosine", "SQNR_CAP_DB"]

SQNR_CAP_DB = 300.0  # identical outputs: report a finite number JSON can hold


def sqnr_db(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio, 10*log10(|ref|^2 / |ref - out|^2), as torchao reports it."""
    ref = np.asarray(reference, dtype=np.float64)
    err = ref - np.asarray(candidate, dtype=np.float64)
    noise = float(np.sum(err * err))
    signal = float(np.sum(ref * ref))
    if noise == 0.0:
        return SQNR_CAP_DB
    if signal == 0.0:
        return -SQNR_CAP_DB
    return float(min(SQNR_CAP_DB, 10.0 * math.log10(signal / noise)))


def cosine(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Cosine similarity of the flattened outputs (1.0 when both are all-zero)."""
    a = np.asarray(reference, dtype=np.float64).ravel()
    b = np.asarray(candidate, dtype=np.float64).ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def accuracy(reference: np.ndarray, candidate: np.ndarray) -> Accuracy:
    """max/mean abs error, relative L2, cosine and SQNR; shapes must match exactly."""
    ref = np.asarray(reference, dtype=np.float64)
    out = np.asarray(candidate, dtype=np.float64)
    if ref.shape != out.shape:
        raise ValueError(f"shape mismatch: reference {ref.shape} vs candidate {out.shape}")
    if not np.all(np.isfinite(out)):
        nan = float("nan")
        return Accuracy(max_abs=nan, mean_abs=nan, rel_l2=nan, cosine=nan, sqnr_db=-SQNR_CAP_DB)
    err = np.abs(ref - out)
    ref_norm = float(np.linalg.norm(ref))
    rel = float(np.linalg.norm(ref - out)) / ref_norm if ref_norm > 0 else float(np.linalg.norm(out))
    return Accuracy(
        max_abs=float(err.max(initial=0.0)),
        mean_abs=float(err.mean()) if err.size else 0.0,
        rel_l2=rel,
        cosine=cosine(ref, out),
        sqnr_db=sqnr_db(ref, out),
    )
