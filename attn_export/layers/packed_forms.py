"""How the packed encoder writes its per-sequence attention into ONNX: one object per form, in one registry.

``layers.packed.packed_attention`` looks the layer's ``attention_form`` up here instead of
branching on names. Each form says what it attends over and what it cannot take:

* ``decomposed``: the rows gathered into the compact (B, W, D) batch, explicit math (every runtime).
* ``ort-contrib``: the same compact batch into ``com.microsoft.MultiHeadAttention`` with each
  sequence's key count as ``key_padding_mask`` (ONNX Runtime).
* ``trt-packed``: the (T+1) rows themselves, no gather and no padding at all, into the TensorRT ONNX
  parser's ``trt.TRT_Attention`` custom op with ``query_form``/``kv_form`` ``"packed_nhd"``, which it
  imports as one ``IAttention`` with ``AttentionIOForm.PACKED_NHD`` query and key/value layouts and the
  cumulative token counts as its ``query_lengths``/``key_value_lengths`` (onnx-tensorrt
  docs/TRT_custom_ops.md, ``TRT_Attention``: Q/K/V [T, H, Dh], inputs 6 and 7 INT32 [batch + 1]; the op
  arrived in 11.0 and "support raggedness" in 11.1, onnx/onnx-tensorrt#1054 and #1057; the 11.x bindings'
  ``IAttention.query_form``/``key_value_form``/``query_lengths``/``key_value_lengths``,
  tests/fixtures/trt/trt-11.4.0.106.json). A later revision of that schema "mirrors IAttention directly",
  with the lengths at inputs 4 and 5 and no scaling; no release note of 11.2-11.4 mentions a change, so the
  export follows the 11.1 schema and pre-scales Q (``scale`` 1), which is right under both. ``attn_mask`` "is not supported when query_form is
  packed_nhd", so this form takes no score bias and no window. The spare row (``layers.packed``) is a
  one-token sequence of its own, so every row of Q lies inside ``query_lengths`` and none reads memory
  the kernel never wrote. ``query_lengths`` and ``kv_lengths`` are two tensors: TensorRT-Edge-LLM
  (tensorrt_edgellm/models/ops.py, ``trt_ragged_attention``) notes TensorRT requires distinct inputs
  for these positions. ``TRT_decomposable=1``: "decomposable=True can allow IAttention to be decomposed
  to use multiple kernels if no fused kernel support found" (IAttention docs), so a fp32 graph builds.
  Eager (and ONNX Runtime, through ``export.forms.trt_packed``'s decomposed twin) computes the same
  attention with the compact math.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["PACKED_FORMS", "PackedForm", "TRT_ATTENTION", "TRT_DOMAIN", "cumulative_lengths"]

TRT_DOMAIN = "trt"  # the TensorRT ONNX parser's custom-op domain (onnx-tensorrt docs/TRT_custom_ops.md)
TRT_ATTENTION = "TRT_Attention"


@dataclass(frozen=True)
class PackedForm:
    """One attention form of the packed encoder.

    ``export``: writes the attention node while exporting, ``(q, k, v, index, heads, bias) -> (T+1, D)``;
    None exports the compact explicit math. ``score_bias``: the form takes an additive score bias or a
    window (False: the export is refused for models that need one).
    """

    name: str
    export: Callable[..., torch.Tensor] | None
    score_bias: bool = True
    description: str = ""


def _ort_multihead(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index, heads: int, bias: torch.Tensor | None) -> torch.Tensor:  # noqa: ANN001 - a PackedIndex
    b, w = index.slot.shape
    d = q.shape[-1]
    qb, kb, vb = (torch.nn.functional.embedding(index.slot, x) for x in (q, k, v))  # (B, W, D)
    out = torch.onnx.ops.symbolic(
        "com.microsoft::MultiHeadAttention",
        # key_padding_mask (B,): keys [0, count) per sequence; attention_bias (B, H, W, W) when the model has one
        [qb, kb, vb, None, index.counts.to(torch.int32), *(() if bias is None else (bias.to(q.dtype),))],
        {"num_heads": heads, "scale": 1.0 / math.sqrt(d // heads)},
        dtype=q.dtype,
        shape=qb.shape,
        version=1,
    )  # (B, W, D)
    return out.reshape(b * w, d).index_select(0, index.back)  # (T+1, D)


def cumulative_lengths(counts: torch.Tensor) -> torch.Tensor:
    """(B,) real tokens per sequence -> (B+2,) int32 row offsets [0, c0, c0+c1, ..., T, T+1]: the B sequences, then the spare row.

    CumSum runs on float (exact below 2^24 tokens): the dtype TensorRT's CumSum takes (check-trt).
    """
    ends = torch.cumsum(counts.to(torch.float32), dim=0)  # (B,)
    total = ends[-1:]  # (1,) = T
    return torch.cat([ends.new_zeros(1), ends, total + 1]).to(torch.int32)  # (B+2,)


def _trt_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index, heads: int, bias: torch.Tensor | None) -> torch.Tensor:  # noqa: ANN001
    n, d = q.shape  # n = T + 1 rows
    dh = d // heads
    # Q pre-scaled and scale=1: right whether the importer scales by the attribute (TRT_custom_ops.md as of 11.1, "based on
    # Attention-23") or, as its later schema says, "does not use ... scale" (TensorRT-Edge-LLM pre-scales Q the same way)
    q3 = (q * (1.0 / math.sqrt(dh))).reshape(n, heads, dh)  # (T+1, H, Dh): PACKED_NHD
    k3, v3 = (x.reshape(n, heads, dh) for x in (k, v))  # (T+1, H, Dh)
    query_lengths = cumulative_lengths(index.counts)  # (B+2,)
    kv_lengths = cumulative_lengths(index.counts + 0)  # the same offsets as a second tensor (distinct inputs)
    out = torch.onnx.ops.symbolic(
        f"{TRT_DOMAIN}::{TRT_ATTENTION}",
        [q3, k3, v3, None, None, None, query_lengths, kv_lengths],  # attn_mask, past_key, past_value: absent
        {"query_form": "packed_nhd", "kv_form": "packed_nhd", "scale": 1.0, "TRT_decomposable": 1},
        dtype=q.dtype,
        shape=q3.shape,
        version=1,
    )  # (T+1, H, Dh)
    return out.reshape(n, d)  # (T+1, D)


PACKED_FORMS: dict[str, PackedForm] = {f.name: f for f in (
    PackedForm("decomposed", None, description="compact (B, W, D) batch, explicit math"),
    PackedForm("ort-contrib", _ort_multihead, description="compact batch into com.microsoft.MultiHeadAttention"),
    PackedForm("trt-packed", _trt_packed, score_bias=False,
               description="the rows themselves into trt.TRT_Attention: IAttention with packed query and key/value layouts"),
)}  # fmt: skip
