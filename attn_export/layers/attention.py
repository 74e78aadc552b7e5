"""Scaled dot-product attention: the explicit math path, PyTorch's SDPA, and the forms it exports to.

``attend`` is the single place where attention is computed. In eager PyTorch the module's
``attention_impl`` picks the computation, nanoGPT-style, with both kept side by side:

* ``math``  the explicit formula below, the ground truth (and the only one that returns weights);
* ``sdpa``  ``F.scaled_dot_product_attention`` with the same mask: PyTorch's fused CPU/GPU
  kernels, whose memory grows as O(L) instead of O(L^2). Calls that need the attention
  weights keep the math path (SDPA does not return them).

During ``torch.onnx.export`` the module's ``attention_form`` decides what lands in the graph:

* ``decomposed``    MatMul(q*scale, k^T) -> Cast fp32 -> Add(mask bias) -> Softmax -> Cast -> MatMul
* ``onnx-attention`` the standard ONNX ``Attention`` op (opset >= 23), mask expanded to [B,1,Lq,Lk]
* ``ort-contrib``   ``com.microsoft.MultiHeadAttention`` for ONNX Runtime
* ``long-seq``      a placeholder node carrying the mask in parts (key padding, causal, window),
  lowered after export by ``attn_export.export.forms.long_seq`` to ONNX Runtime kernels whose memory
  grows as O(L) (see docs/long-sequences.md)

Fully masked query rows (no key to attend to) return zeros in every form, never NaN.

An additive ``bias`` (B or 1, H or 1, Lq, Lk), such as a relative position bias
(``layers.position_bias``), is added to the scaled scores before the mask, in float32, in
every form but ``long-seq`` (its kernels take no bias: refused with the form to use).
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F

from attn_export.errors import ExportError
from attn_export.layers.masks import AttentionMask, keep_to_bias

__all__ = [
    "LONG_SEQ_DOMAIN",
    "LONG_SEQ_OP",
    "attend",
    "split_heads",
    "merge_heads",
]

log = logging.getLogger(__name__)

# The placeholder the long-seq form exports; ``export.long_seq`` replaces every one of them.
LONG_SEQ_DOMAIN = "attn_export.long_seq"
LONG_SEQ_OP = "LongSeqAttention"


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, D) -> (B, H, L, Dh)."""
    b, length, d = x.shape
    return x.view(b, length, heads, d // heads).transpose(1, 2)  # (B, H, L, Dh)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, Dh) -> (B, L, D)."""
    b, h, length, dh = x.shape
    return x.transpose(1, 2).reshape(b, length, h * dh)  # (B, L, D)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    keep: torch.Tensor | AttentionMask | None = None,
    *,
    form: str = "decomposed",
    need_weights: bool = False,
    impl: str = "math",
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Multi-head attention on projected inputs.

    Args:
        q: (B, Lq, D) projected queries; k, v: (B, Lk, D).
        heads: number of heads H; head size Dh = D / H.
        keep: boolean mask broadcastable to (B, H, Lq, Lk), True = attend, or an
            ``AttentionMask`` holding the parts (key padding, causal, window).
        form: the ONNX form used while exporting (see the module docstring).
        need_weights: also return the (B, H, Lq, Lk) attention probabilities (math path).
        impl: eager computation, ``math`` or ``sdpa``; ``sdpa`` with ``need_weights`` runs math.
        bias: an additive score bias broadcastable to (B, H, Lq, Lk), float32 (None = none).

    Returns:
        (output (B, Lq, D), weights or None)
    """
    exporting = torch.onnx.is_in_onnx_export()
    lq, lk = q.shape[1], k.shape[1]
    if exporting and form == "long-seq":
        if bias is not None:
            raise ExportError("expected attention without a score bias for --attention long-seq (its kernels take none), "
                              "got a relative position bias; use --attention decomposed")
        return _long_seq(q, k, v, heads, _as_parts(keep)), None

    parts = keep if isinstance(keep, AttentionMask) else None
    dense = parts.dense(lq, lk, q.device) if parts is not None else keep
    keep4 = None if dense is None else _as_4d(dense)
    if parts is not None:
        row_valid = parts.row_valid(lq, lk, q.device)
    else:
        row_valid = None if keep4 is None else keep4.any(dim=-1, keepdim=True)  # (B?, H?, Lq, 1)

    if exporting and form == "ort-contrib":
        return _ort_contrib(q, k, v, heads, keep4, row_valid, bias), None

    qh, kh, vh = split_heads(q, heads), split_heads(k, heads), split_heads(v, heads)  # (B, H, L, Dh)
    if exporting and form == "onnx-attention":
        out = _onnx_attention(qh, kh, vh, keep4, bias)
        weights = None
    elif impl == "sdpa" and not exporting and not need_weights:
        out = _sdpa(qh, kh, vh, keep4, causal_only=bias is None and parts is not None and _causal_only(parts, lq, lk), bias=bias)
        weights = None
    else:
        if impl == "sdpa" and need_weights and not exporting:
            log.debug("attention weights requested: the sdpa impl runs the explicit math path")
        out, weights = _math(qh, kh, vh, keep4, bias)
    if row_valid is not None:
        out = torch.where(row_valid, out, torch.zeros((), dtype=out.dtype))
        if weights is not None:
            weights = torch.where(row_valid, weights, torch.zeros((), dtype=weights.dtype))
    return merge_heads(out), (weights if need_weights else None)


def _as_4d(keep: torch.Tensor) -> torch.Tensor:
    while keep.dim() < 4:
        keep = keep.unsqueeze(0)
    return keep


def _causal_only(parts: AttentionMask, lq: int, lk: int) -> bool:
    return parts.causal and parts.window is None and parts.key_keep is None and lq == lk


def _sdpa(
    qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, keep4: torch.Tensor | None, causal_only: bool,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """PyTorch's fused kernel with the same mask (a causal-only mask as ``is_causal``, no tensor); a bias joins the mask as floats."""
    if causal_only:
        return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)  # (B, H, Lq, Dh)
    if bias is not None:
        mask = bias.to(qh.dtype) if keep4 is None else bias.to(qh.dtype) + keep_to_bias(keep4, qh.dtype)
        return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)  # (B, H, Lq, Dh)
    return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=keep4)  # (B, H, Lq, Dh)


def _math(
    qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, keep4: torch.Tensor | None, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit attention; scores, bias and mask adds and softmax run in float32 whatever the input dtype."""
    scale = 1.0 / math.sqrt(qh.shape[-1])
    scores = (qh * scale) @ kh.transpose(-2, -1)  # (B, H, Lq, Lk), Q scaled before BMM1
    scores = scores.float()  # fp32 island starts (a no-op Cast-free path for fp32 graphs)
    if bias is not None:
        scores = scores + bias.float()  # (B or 1, H, Lq, Lk): e.g. a relative position bias
    if keep4 is not None:
        scores = scores + keep_to_bias(keep4, torch.float32)
    probs = torch.softmax(scores, dim=-1).to(vh.dtype)  # fp32 island ends
    return probs @ vh, probs  # (B, H, Lq, Dh), (B, H, Lq, Lk)


def _expanded_bias(
    keep4: torch.Tensor | None, b: int, lq: int, lk: int, dtype: torch.dtype, bias: torch.Tensor | None = None
) -> torch.Tensor | None:
    """The mask (and score bias) as one additive tensor; ONNX Runtime's and TensorRT's kernels broadcast only batch and heads: expand Lq and Lk."""
    if keep4 is None and bias is None:
        return None
    if bias is None:
        return keep_to_bias(keep4.expand(b, keep4.shape[1], lq, lk), dtype)  # type: ignore[union-attr]
    total = bias.to(dtype) if keep4 is None else bias.to(dtype) + keep_to_bias(keep4, dtype)  # mask_value(dtype) + a bias stays finite
    return total.expand(b, total.shape[1], lq, lk)


def _onnx_attention(
    qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, keep4: torch.Tensor | None, score_bias: torch.Tensor | None = None
) -> torch.Tensor:
    b, _, lq, dh = qh.shape
    lk = kh.shape[2]
    bias = _expanded_bias(keep4, b, lq, lk, qh.dtype, score_bias)
    out, _, _, _ = torch.onnx.ops.attention(
        qh, kh, vh, bias, scale=1.0 / math.sqrt(dh), softmax_precision=1  # 1 = FLOAT
    )
    return out  # (B, H, Lq, Dh)


def _ort_contrib(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    keep4: torch.Tensor | None,
    row_valid: torch.Tensor | None,
    score_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    b, lq, d = q.shape
    lk = k.shape[1]
    bias = _expanded_bias(keep4, b, lq, lk, q.dtype, score_bias)
    out = torch.onnx.ops.symbolic(
        "com.microsoft::MultiHeadAttention",
        [q, k, v, None, None, bias],
        {"num_heads": heads, "scale": 1.0 / math.sqrt(d // heads), "mask_filter_value": -10000.0},
        dtype=q.dtype,
        shape=q.shape,
        version=1,
    )  # (B, Lq, D)
    if row_valid is None:
        return out
    heads_view = out.view(b, lq, heads, d // heads).transpose(1, 2)  # (B, H, Lq, Dh)
    heads_view = torch.where(row_valid, heads_view, torch.zeros((), dtype=out.dtype))
    return merge_heads(heads_view)


def _as_parts(keep: torch.Tensor | AttentionMask | None) -> AttentionMask:
    """The mask in parts; a dense mask qualifies only when it masks keys alone (..., 1, Lk)."""
    if keep is None:
        return AttentionMask()
    if isinstance(keep, AttentionMask):
        return keep
    keep4 = _as_4d(keep)
    if keep4.shape[1] != 1 or keep4.shape[2] != 1:
        raise ExportError(
            f"expected a key-padding mask (B, 1, 1, Lk) or an AttentionMask for --attention long-seq, "
            f"got a dense mask of shape {tuple(keep4.shape)}; use --attention decomposed"
        )
    return AttentionMask(key_keep=keep4[:, 0, 0, :])


def _long_seq(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, parts: AttentionMask) -> torch.Tensor:
    """Placeholder ``attn_export.long_seq.LongSeqAttention(q, k, v[, key_keep])`` -> (B, Lq, D).

    ``attn_export.export.forms.long_seq.lower_long_seq`` replaces it after export by the ONNX
    Runtime kernels for its mask parts; it never reaches a runtime.
    """
    inputs = [q, k, v] + ([] if parts.key_keep is None else [parts.key_keep])
    attrs = {
        "num_heads": heads,
        "scale": 1.0 / math.sqrt(q.shape[-1] // heads),
        "causal": int(parts.causal),
        "window": -1 if parts.window is None else int(parts.window),
    }
    return torch.onnx.ops.symbolic(
        f"{LONG_SEQ_DOMAIN}::{LONG_SEQ_OP}", inputs, attrs, dtype=q.dtype, shape=q.shape, version=1
    )  # (B, Lq, D)
