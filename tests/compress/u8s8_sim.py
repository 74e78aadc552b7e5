"""The x86 U8S8 int8 GEMM's saturating arithmetic in numpy (``compress/int8_encoding.py`` says why it matters).

Test-only: it lets the saturation and its fixes be tested on a CPU that does not saturate.
"""

from __future__ import annotations

import numpy as np

_INT16_MAX = 32767
_INT16_MIN = -32768


def quantize_weight_per_channel(weight: np.ndarray, reduce_range: bool) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel int8 of a (K, N) MatMul weight: (int8 (K, N), scale (N,))."""
    qmax = 64 if reduce_range else 127
    amax = np.maximum(np.abs(weight).max(axis=0), 1e-12)
    scale = (amax / qmax).astype(np.float32)
    q = np.clip(np.rint(weight / scale), -qmax, qmax).astype(np.int8)
    return q, scale


def simulate_u8s8_matmul(a_u8: np.ndarray, b_s8: np.ndarray, saturate: bool = True) -> np.ndarray:
    """``a_u8 @ b_s8`` in int32 the way an x86 U8S8 kernel computes it.

    With ``saturate`` (AVX2 / AVX-512 without VNNI): the products of adjacent K pairs
    (k = 2i, 2i+1; MLAS packs B so VPMADDUBSW multiplies neighbouring K bytes) are summed into
    int16 with saturation, then accumulated in int32 (VPMADDWD). Without it (VNNI / AMX), the
    exact int32 product.
    """
    a = np.asarray(a_u8)
    b = np.asarray(b_s8)
    if a.dtype != np.uint8 or b.dtype != np.int8:
        raise ValueError(f"expected uint8 activations and int8 weights, got {a.dtype} and {b.dtype}")
    a32 = a.astype(np.int32)
    b32 = b.astype(np.int32)
    if not saturate:
        return a32 @ b32
    lead, k = a32.shape[:-1], a32.shape[-1]
    a2 = a32.reshape(-1, k)
    if k % 2:  # MLAS zero-pads K to its packing width
        a2 = np.concatenate([a2, np.zeros((a2.shape[0], 1), np.int32)], axis=1)
        b32 = np.concatenate([b32, np.zeros((1, b32.shape[1]), np.int32)], axis=0)
    # (M, K/2, N): a[m, 2i] * b[2i, n] + a[m, 2i+1] * b[2i+1, n], saturated to int16
    pairs = a2[:, 0::2, None] * b32[None, 0::2, :] + a2[:, 1::2, None] * b32[None, 1::2, :]
    pairs = np.clip(pairs, _INT16_MIN, _INT16_MAX)
    return pairs.sum(axis=1).astype(np.int32).reshape(*lead, b32.shape[1])
