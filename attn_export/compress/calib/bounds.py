"""What finite calibration data, and the int8 ranges calibrated from it, must stay within.

Finite is not enough: a layer computes in float32, ONNX Runtime's quantizer computes int8
scales in float32, and TensorRT's INT8+FP16 build runs the float parts between Q/DQ pairs in
fp16. 1e30-scale activations passed ``calib check`` and then failed inside calibration with
a different internal error per method (a NaN histogram index, an endless bin-merging loop).
Each bound is a one-line ``DataError`` naming the value and the fix:

* **data** (``check_data_scale``, at load, so ``calib check`` too): the sum of squares of one
  token's D features, what LayerNorm's variance and every attention dot product accumulate,
  must be finite in float32 (<= 3.4e38). Hidden states are O(1) after LayerNorm; 1e30 has
  squares of 1e60.
* **activations** (``check_finite_activation``, each probed tensor): a layer may still overflow
  on data that passes (attention scores grow with |x|^2).
* **ranges** (``check_threshold``): the clip threshold T of a symmetric int8 range gives the
  scale 2T / 254 computed in float32, so 2T must be finite there (T <= 1.7e38); where the float
  parts run in fp16 (``float_precision="fp16"``), T must be <= 65504, fp16's largest value, or
  the DequantizeLinear output overflows.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from attn_export.errors import DataError

__all__ = ["check_data_scale", "check_finite_activation", "check_threshold"]

log = logging.getLogger(__name__)

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FP16_MAX = float(np.finfo(np.float16).max)
_RESCALE = "rescale the data (LayerNorm-ed hidden states are O(1)) or regenerate it with attn-export calib generate"


def check_data_scale(path: Path | str, name: str, x: np.ndarray) -> None:
    """Refuse data whose per-token sum of squares overflows float32 (checked in float64, chunked)."""
    worst = 0.0
    flat = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    with np.errstate(over="ignore"):
        for start in range(0, len(flat), 65536):  # bounded float64 copies
            part = flat[start : start + 65536].astype(np.float64)
            worst = max(worst, float(np.einsum("ij,ij->i", part, part).max(initial=0.0)))
    if not worst <= _FLOAT32_MAX:
        absmax = float(np.abs(x).max())
        raise DataError(
            f"{path}: {name} reaches |x| = {absmax:.3g}; the sum of squares of a token's {x.shape[-1]} features is "
            f"{worst:.3g}, beyond float32's {_FLOAT32_MAX:.3g}, so the layer's LayerNorm and attention overflow: {_RESCALE}"
        )


def check_finite_activation(name: str, rows: np.ndarray, feed: Mapping[str, np.ndarray]) -> None:
    """Refuse an activation the calibration data (``feed``) drove to NaN/Inf inside the float32 graph."""
    if rows.size and not np.isfinite(rows).all():
        bad = int((~np.isfinite(rows)).sum())
        floats = [np.abs(np.asarray(v, dtype=np.float64)).max() for v in feed.values() if np.asarray(v).dtype.kind == "f" and np.asarray(v).size]
        given = f" (the calibration inputs reach |x| = {max(floats):.3g})" if floats else ""
        raise DataError(f"calibration data drives activation {name!r} to NaN/Inf in float32 ({bad} values){given}: the layer overflows on it; {_RESCALE}")


def check_threshold(name: str, threshold: float, float_precision: str = "fp32") -> None:
    """Refuse an int8 clip threshold whose scale overflows float32, or whose range fp16 cannot hold."""
    if not (np.isfinite(threshold) and 2.0 * threshold <= _FLOAT32_MAX):
        raise DataError(
            f"the int8 range of activation {name!r} is +-{threshold:.3g}: its scale (2T / 254) overflows float32 "
            f"(T must be <= {_FLOAT32_MAX / 2:.3g}); {_RESCALE}"
        )
    if float_precision == "fp16" and threshold > _FP16_MAX:
        raise DataError(
            f"the int8 range of activation {name!r} is +-{threshold:.3g}, beyond fp16's largest value {_FP16_MAX:.0f}: TensorRT's "
            f"INT8+FP16 build runs the float parts in fp16, where it overflows; {_RESCALE}, or deploy without fp16"
        )
