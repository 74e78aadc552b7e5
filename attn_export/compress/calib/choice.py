"""Per-tensor calibration: each activation gets the range method that quantizes *it* best.

One global ``--calib-method`` is a compromise: MiniLM's LayerNorm outputs want their
outlier channels kept (minmax), its GELU outputs lose less when the rare large values are
clipped (a percentile), and which percentile depends on the tail. ``--calib-method
per-tensor`` computes every candidate threshold of every activation from one |x|
histogram (``probe.RunningHistogram``) and keeps, per tensor, the one with the smallest
quantization error on the calibration data:

* ``minmax``: the largest |x|;
* ``percentile-P`` for P in ``PERCENTILE_POINTS``: the P-th percentile of |x|;
* ``entropy``: the KL-optimal threshold of TensorRT's calibrator (the |x| histogram folded
  into 128 levels, "8-bit Inference with TensorRT", Migacz 2017), searched on a stride.

The error of a threshold T (scale s = T / 127, symmetric int8) is estimated from the
histogram: values beyond T cost (|x| - T)^2 (clipping), values below s/2 round to 0 and
cost x^2, the rest cost the uniform rounding noise s^2 / 12. This is the mean squared
error TensorRT's and ModelOpt's "mse" calibrators minimise, evaluated for the candidates
only, so that every chosen range is one a named method would also give.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from attn_export.compress.calib.bounds import check_threshold
from attn_export.compress.probe import RunningHistogram, TensorStats
from attn_export.vocab.choices import PER_TENSOR  # the --calib-method value that chooses per activation

__all__ = [
    "PERCENTILE_POINTS",
    "RangeChoice",
    "candidate_thresholds",
    "choose_ranges",
    "entropy_threshold",
    "method_candidate",
    "quantization_mse",
]

log = logging.getLogger(__name__)

PERCENTILE_POINTS: tuple[float, ...] = (99.9, 99.99, 99.999)
_QMAX = 127  # symmetric int8: [-127, 127]
_KL_LEVELS = 128  # TensorRT's entropy calibrator folds |x| into 128 levels


@dataclass
class RangeChoice:
    """The range one activation got, and what every candidate would have cost."""

    tensor: str
    method: str
    threshold: float
    mse: dict[str, float] = field(default_factory=dict)
    candidates: dict[str, float] = field(default_factory=dict)

    @property
    def range(self) -> tuple[float, float]:
        return (-self.threshold, self.threshold)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def quantization_mse(hist: RunningHistogram, threshold: float) -> float:
    """Estimated mean squared error of symmetric int8 with clip ``threshold`` on the histogram's values."""
    if hist.counts is None or hist.total == 0 or threshold <= 0:
        return float("inf")
    c, n = hist.centers, hist.counts.astype(np.float64)
    s = threshold / _QMAX
    err = np.where(c > threshold, (c - threshold) ** 2, np.where(c < s / 2, c**2 + hist.width**2 / 12, s * s / 12))
    return float((err * n).sum() / hist.total)


def entropy_threshold(hist: RunningHistogram, levels: int = _KL_LEVELS, steps: int = 128) -> float:
    """TensorRT's KL-divergence threshold on the |x| histogram (about ``steps`` thresholds tried)."""
    if hist.counts is None or hist.total == 0:
        return 0.0
    counts = hist.counts.astype(np.float64)
    last = int(np.flatnonzero(counts)[-1]) + 1
    if last <= levels:
        return float(hist.edges[last])
    stride = max(1, (last - levels) // steps)
    best_kl, best_i = np.inf, last
    for i in range(levels, last + 1, stride):
        p = counts[:i].copy()
        p[-1] += counts[i:].sum()  # outliers clipped into the last bin
        nonzero = counts[:i] != 0
        starts = (np.arange(levels) * i) // levels
        merged = np.add.reduceat(counts[:i], starts)  # (levels,) the bins folded into int8 levels
        used = np.add.reduceat(nonzero.astype(np.float64), starts)
        level_of = np.repeat(np.arange(levels), np.diff(np.append(starts, i)))
        q = np.where(nonzero, merged[level_of] / np.maximum(used[level_of], 1.0), 0.0)
        p, q = _smooth(p), _smooth(q)
        kl = float(np.sum(np.where(p > 0, p * np.log(p / q), 0.0)))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return float(min(hist.edges[best_i], hist.absmax))


def _smooth(d: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    """Normalise, moving ``eps`` of mass onto empty bins so the KL stays finite (MXNet's smoothing)."""
    total = d.sum()
    d = d / total if total > 0 else d
    zero = d == 0
    nz = int((~zero).sum())
    if nz == 0 or not zero.any():
        return d
    take = eps * zero.sum() / nz
    return np.where(zero, eps, d - take).clip(min=1e-12)


def candidate_thresholds(hist: RunningHistogram) -> dict[str, float]:
    """Every method's threshold for one histogram."""
    out = {"minmax": float(hist.absmax)}
    out.update({f"percentile-{p:g}": hist.percentile(p) for p in PERCENTILE_POINTS})
    out["entropy"] = entropy_threshold(hist)
    return out


def method_candidate(method: str, percentile: float = 99.999) -> str:
    """The candidate name a global ``--calib-method`` stands for."""
    return f"percentile-{percentile:g}" if method == "percentile" else method


def choose_ranges(
    stats: Mapping[str, TensorStats], method: str = PER_TENSOR, percentile: float = 99.999, float_precision: str = "fp32"
) -> dict[str, RangeChoice]:
    """Every tensor's range from its histogram.

    ``per-tensor``: the candidate with the smallest estimated quantization error; a global
    ``method`` (minmax | percentile | entropy): that method's threshold for every tensor,
    from the same real-token histograms. Each range is checked against what its scale and
    the float parts (``float_precision``: fp16 on TensorRT's INT8+FP16 build) can hold
    (``calib_bounds.check_threshold``).
    """
    out: dict[str, RangeChoice] = {}
    for name, s in stats.items():
        if method == PER_TENSOR:
            cands = candidate_thresholds(s.hist)
            mse = {m: quantization_mse(s.hist, t) for m, t in cands.items()}
            chosen = min(mse, key=lambda m: (mse[m], -cands[m]))  # ties: the wider range
        else:
            chosen = method_candidate(method, percentile)
            t = entropy_threshold(s.hist) if method == "entropy" else (s.hist.absmax if method == "minmax" else s.hist.percentile(percentile))
            cands, mse = {chosen: float(t)}, {chosen: quantization_mse(s.hist, float(t))}
        out[name] = RangeChoice(name, chosen, max(cands[chosen], 1e-12), mse, cands)
        check_threshold(name, out[name].threshold, float_precision)
    if out and method == PER_TENSOR:
        picked: dict[str, int] = {}
        for c in out.values():
            picked[c.method] = picked.get(c.method, 0) + 1
        log.info("per-tensor calibration: %s", ", ".join(f"{m} x{n}" for m, n in sorted(picked.items())))
    return out
