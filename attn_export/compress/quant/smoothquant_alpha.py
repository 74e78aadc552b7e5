"""SmoothQuant's alpha, per activation: the smoothing scale and the fake-quantized GEMM error that picks it.

Numbers only (no graph): ``smoothquant.search_alphas`` finds each smoothable activation's
sample and weights in the graph and asks ``choose_alpha`` here, which scores every candidate
alpha with the route's own activation quantizer (symmetric per-tensor at the range the
calibration method will pick for static Q/DQ; ONNX Runtime's asymmetric per-batch uint8 for
dynamic) against per-channel int8 weights. QAT (``qat.py``) uses the same choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["AlphaChoice", "MIN_GAIN", "MIN_GAIN_MUL", "SEARCH_ALPHAS", "choose_alpha", "smoothing_scale", "smoothing_scale_from_max"]


_SCALE_RANGE = (1e-4, 1e4)  # keep s finite when a channel is (almost) silent
SEARCH_ALPHAS: tuple[float, ...] = (0.5, 0.65, 0.8, 0.9, 0.95)
# Smooth only where it pays: a scale folded into the value projection is free, so 10% less
# GEMM error is enough; a Mul costs a pass over the activation (MiniLM dynamic int8: ~0.3%
# of the model's time each), so it must remove half the error. Measured on MiniLM's dynamic
# route: all 24 smoothed 0.99724 mean cosine, 1.037x the peer's speed; Muls at >= 50%:
# 16 Muls, 0.99723; >= 85%: 6 Muls, 0.99365, 1.074x; none: 0.99131, 1.08x.
MIN_GAIN = 0.10
MIN_GAIN_MUL = 0.50


@dataclass
class AlphaChoice:
    """The alpha one activation got (None: left alone) and each candidate's relative GEMM error."""

    activation: str
    alpha: float | None
    error: dict[str, float] = field(default_factory=dict)  # "none" and each alpha -> relative squared error
    folded: bool = False  # the scale folds into the value projection (no Mul); set by search_alphas

    @property
    def gain(self) -> float:
        """Share of the unsmoothed error the chosen alpha removes (0 when left alone)."""
        if self.alpha is None or not self.error.get("none"):
            return 0.0
        return 1.0 - self.error[f"{self.alpha:g}"] / self.error["none"]

    def to_dict(self) -> dict[str, Any]:
        return {"activation": self.activation, "alpha": self.alpha, "gain": self.gain, "folded": self.folded, "error": dict(self.error)}


def smoothing_scale_from_max(x_max: np.ndarray, w_max: np.ndarray, alpha: float) -> np.ndarray:
    s = np.power(np.maximum(x_max.astype(np.float64), 1e-8), alpha) / np.power(np.maximum(w_max.astype(np.float64), 1e-8), 1.0 - alpha)
    return np.clip(s, *_SCALE_RANGE).astype(np.float32)  # (K,)


def _static_threshold(x: np.ndarray, method: str) -> float:
    """The clip threshold ``method`` would calibrate for the values ``x`` (calib_choice's candidates)."""
    from attn_export.compress.calib.choice import candidate_thresholds, entropy_threshold, quantization_mse
    from attn_export.compress.probe import RunningHistogram

    if method == "minmax":
        return float(np.abs(x).max())
    hist = RunningHistogram()
    hist.add(x)
    if method == "percentile":
        return hist.percentile(99.999)
    if method == "entropy":
        return entropy_threshold(hist)
    return min(candidate_thresholds(hist).values(), key=lambda t: quantization_mse(hist, t))  # per-tensor


def _fake_quant_gemm_error(x: np.ndarray, w: np.ndarray, route: str, calib_method: str = "minmax") -> float:
    """||x @ w - Q(x) @ Q(w)||^2 / ||x @ w||^2 with the route's activation quantizer and per-channel int8 weights."""
    w_scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / 127.0  # (M,)
    wq = np.clip(np.rint(w / w_scale), -127, 127) * w_scale
    if route == "static":  # symmetric per-tensor int8, zero point 0, the range the calibration will pick
        a_scale = max(_static_threshold(x, calib_method), 1e-12) / 127.0
        xq = np.clip(np.rint(x / a_scale), -127, 127) * a_scale
    else:  # ONNX Runtime's DynamicQuantizeLinear: uint8, range [min(x, 0), max(x, 0)]
        lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        a_scale = max(hi - lo, 1e-12) / 255.0
        zp = np.clip(np.rint(-lo / a_scale), 0, 255)
        xq = (np.clip(np.rint(x / a_scale) + zp, 0, 255) - zp) * a_scale
    y = x @ w
    return float(np.sum((y - xq.astype(np.float32) @ wq.astype(np.float32)) ** 2) / max(float(np.sum(y * y)), 1e-30))


def choose_alpha(
    name: str, x: np.ndarray, x_absmax: np.ndarray, w: np.ndarray, route: str = "static", calib_method: str = "minmax",
    alphas: tuple[float, ...] = SEARCH_ALPHAS, min_gain: float = MIN_GAIN,
) -> AlphaChoice:  # fmt: skip
    """The alpha for one activation: ``x`` (tokens, K) sampled, ``x_absmax`` (K,) over the calibration data,
    ``w`` (K, M) every weight that reads it; None when no alpha cuts the error by ``min_gain``."""
    x = np.asarray(x, dtype=np.float32)
    w = np.asarray(w, dtype=np.float32)
    errors = {"none": _fake_quant_gemm_error(x, w, route, calib_method)}
    w_max = np.abs(w).max(axis=1)
    for a in alphas:
        s = smoothing_scale_from_max(x_absmax, w_max, a)
        errors[f"{a:g}"] = _fake_quant_gemm_error(x / s, w * s[:, None], route, calib_method)
    best = min(alphas, key=lambda a: errors[f"{a:g}"])
    helps = errors[f"{best:g}"] <= (1.0 - min_gain) * errors["none"]
    return AlphaChoice(name, best if helps else None, errors)


def smoothing_scale(x_absmax: np.ndarray, w: np.ndarray, alpha: float) -> np.ndarray:
    """s (K,) for an activation with channel maxima ``x_absmax`` read by the (K, M) weights ``w``."""
    return smoothing_scale_from_max(np.asarray(x_absmax), np.abs(np.asarray(w)).max(axis=1), alpha)
