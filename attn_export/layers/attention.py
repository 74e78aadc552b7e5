"""Scaled dot-product attention: the explicit math path and the forms it exports to.

``attend`` is the single place where attention is computed. Eager PyTorch always runs the
explicit math below (the ground truth, nanoGPT-style); during ``torch.onnx.export`` the
module's ``attention_form`` decides what lands in the graph:

* ``decomposed``    MatMul(q*scale, k^T) -> Cast fp32 -> Add(mask bias) -> Softmax -> Cast -> MatMul
* ``onnx-attention`` the standard ONNX ``Attention`` op (opset >= 23), mask expanded to [B,1,Lq,Lk]
* ``ort-contrib``   ``com.microsoft.MultiHeadAttention`` for ONNX Runtime

Fully masked query rows (no key to attend to) return zeros in every form, never NaN.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

from attn_export.layers.masks import keep_to_bias

__all__ = ["ATTENTION_FORMS", "AttentionForm", "attend", "split_heads", "merge_heads"]

AttentionForm = Literal["decomposed", "onnx-attention", "ort-contrib"]
ATTENTION_FORMS: tuple[str, ...] = ("decomposed", "onnx-attention", "ort-contrib")


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, D) -> (B, H, L, Dh)."""
    b, length, d = x.shape
    return x.view(b, length, heads, d // heads).transpose(1, 2)  # (B, H, L, Dh)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, Dh) -> (B, L, D)."""
    b, h, length, dh = x.shape
    return x.transpose(1, 2).reshape(b, length, h * dh)  # (B, L, D)


def _as_4d(keep: torch.Tensor) -> torch.Tensor:
    while keep.dim() < 4:
        keep = keep.unsqueeze(0)
    return keep


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    keep: torch.Tensor | None = None,
    *,
    form: str = "decomposed",
    need_weights: bool = False,
    fast: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Multi-head attention on projected inputs.

    Args:
        q: (B, Lq, D) projected queries; k, v: (B, Lk, D).
        heads: number of heads H; head size Dh = D / H.
        keep: boolean mask broadcastable to (B, H, Lq, Lk), True = attend.
        form: the ONNX form used while exporting (eager always runs the math path).
        need_weights: also return the (B, H, Lq, Lk) attention probabilities.
        fast: use ``F.scaled_dot_product_attention`` in eager (no weights).

    Returns:
        (output (B, Lq, D), weights or None)
    """
    keep4 = None if keep is None else _as_4d(keep)
    row_valid = None if keep4 is None else keep4.any(dim=-1, keepdim=True)  # (B?, H?, Lq, 1)
    exporting = torch.onnx.is_in_onnx_export()

    if exporting and form == "ort-contrib":
        return _ort_contrib(q, k, v, heads, keep4, row_valid), None

    qh, kh, vh = split_heads(q, heads), split_heads(k, heads), split_heads(v, heads)  # (B, H, L, Dh)
    if exporting and form == "onnx-attention":
        out = _onnx_attention(qh, kh, vh, keep4)
        weights = None
    elif fast and not need_weights and not exporting:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=keep4)
        weights = None
    else:
        out, weights = _math(qh, kh, vh, keep4)
    if row_valid is not None:
        out = torch.where(row_valid, out, torch.zeros((), dtype=out.dtype))
        if weights is not None:
            weights = torch.where(row_valid, weights, torch.zeros((), dtype=weights.dtype))
    return merge_heads(out), (weights if need_weights else None)


def _math(
    qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, keep4: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit attention; scores, mask add and softmax run in float32 whatever the input dtype."""
    scale = 1.0 / math.sqrt(qh.shape[-1])
    scores = (qh * scale) @ kh.transpose(-2, -1)  # (B, H, Lq, Lk), Q scaled before BMM1
    scores = scores.float()  # fp32 island starts (a no-op Cast-free path for fp32 graphs)
    if keep4 is not None:
        scores = scores + keep_to_bias(keep4, torch.float32)
    probs = torch.softmax(scores, dim=-1).to(vh.dtype)  # fp32 island ends
    return probs @ vh, probs  # (B, H, Lq, Dh), (B, H, Lq, Lk)


def _expanded_bias(
    keep4: torch.Tensor, b: int, lq: int, lk: int, dtype: torch.dtype
) -> torch.Tensor:
    """ONNX Runtime's and TensorRT's kernels broadcast only batch and heads: expand Lq and Lk."""
    h = keep4.shape[1]
    keep_full = keep4.expand(b, h, lq, lk)
    return keep_to_bias(keep_full, dtype)


def _onnx_attention(
    qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, keep4: torch.Tensor | None
) -> torch.Tensor:
    b, _, lq, dh = qh.shape
    lk = kh.shape[2]
    bias = None if keep4 is None else _expanded_bias(keep4, b, lq, lk, qh.dtype)
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
) -> torch.Tensor:
    b, lq, d = q.shape
    lk = k.shape[1]
    bias = None if keep4 is None else _expanded_bias(keep4, b, lq, lk, q.dtype)
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
