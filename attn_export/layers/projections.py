"""Shared Q/K/V/O projections for every attention layer, with an optional fused-QKV form.

Separate ``w_q``/``w_k``/``w_v``/``w_o`` Linears as in the design note. ``fuse_qkv_``
replaces the three input projections by one ``w_qkv`` Linear (one GEMM instead of three)
with bit-identical maths, which is what the exporter ships.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_export.errors import ConfigError
from attn_export.vocab.choices import ATTENTION_FORMS, ATTENTION_IMPLS, PACKED_ATTENTION_FORMS, check_heads

__all__ = ["AttentionProjections", "fuse_qkv_", "set_attention_form_", "set_attention_impl_"]


class AttentionProjections(nn.Module):
    """Holds the projections, the head count, the eager ``attention_impl`` and the export-time form.

    ``attention_impl``: ``"math"`` (explicit formula, the default and ground truth) or
    ``"sdpa"`` (``F.scaled_dot_product_attention`` with the same mask; calls that return
    attention weights still run math). ``attention_form``: what ``torch.onnx.export`` emits.
    """

    def __init__(self, d_model: int = 512, heads: int = 8, bias: bool = True) -> None:
        super().__init__()
        check_heads(d_model, heads)
        self.d_model = d_model
        self.heads = heads
        self.head_dim = d_model // heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.attention_form = "decomposed"
        self.attention_impl = "math"  # eager only; "sdpa" = F.scaled_dot_product_attention

    @property
    def fast(self) -> bool:
        """Older spelling of ``attention_impl == "sdpa"``, kept for existing scripts."""
        return self.attention_impl == "sdpa"

    @fast.setter
    def fast(self, value: bool) -> None:
        self.attention_impl = "sdpa" if value else "math"

    @property
    def is_qkv_fused(self) -> bool:
        return hasattr(self, "w_qkv")

    def project(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, L, D) inputs -> projected q, k, v (B, L, D)."""
        if not self.is_qkv_fused:
            return self.w_q(query), self.w_k(key), self.w_v(value)
        if query is key and key is value:  # self-attention: one GEMM
            q, k, v = self.w_qkv(query).chunk(3, dim=-1)
            return q, k, v
        wq, wk, wv = self.w_qkv.weight.chunk(3, dim=0)
        bq, bk, bv = (None, None, None) if self.w_qkv.bias is None else self.w_qkv.bias.chunk(3)
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)


@torch.no_grad()
def fuse_qkv_(model: nn.Module) -> int:
    """Fuse Q/K/V of every ``AttentionProjections`` in ``model`` in place; returns how many.

    Projections already replaced by other modules (low-rank factors, quantized Linears)
    are left alone: their weights cannot be concatenated.
    """
    fused = 0
    for mod in model.modules():
        if not isinstance(mod, AttentionProjections) or mod.is_qkv_fused:
            continue
        parts = (mod.w_q, mod.w_k, mod.w_v)
        if not all(type(p) is nn.Linear for p in parts):
            continue
        has_bias = mod.w_q.bias is not None
        w_qkv = nn.Linear(mod.d_model, 3 * mod.d_model, bias=has_bias)
        w_qkv = w_qkv.to(device=mod.w_q.weight.device, dtype=mod.w_q.weight.dtype)
        w_qkv.weight.copy_(torch.cat([p.weight for p in parts], dim=0))
        if has_bias:
            w_qkv.bias.copy_(torch.cat([p.bias for p in parts], dim=0))
        mod.w_qkv = w_qkv
        del mod.w_q, mod.w_k, mod.w_v
        fused += 1
    return fused


def set_attention_form_(model: nn.Module, form: str) -> int:
    """Choose the exported attention form for every attention block; returns how many."""
    if form not in (*ATTENTION_FORMS, *PACKED_ATTENTION_FORMS):  # the packed encoder's own forms: layers.packed_forms
        raise ConfigError(f"attention form must be one of {', '.join(dict.fromkeys((*ATTENTION_FORMS, *PACKED_ATTENTION_FORMS)))}, got {form!r}")
    count = 0
    for mod in model.modules():
        if hasattr(mod, "attention_form"):
            mod.attention_form = form
            count += 1
    return count


def set_attention_impl_(model: nn.Module, impl: str) -> int:
    """Choose the eager attention computation (``math`` or ``sdpa``) for every block; returns how many."""
    if impl not in ATTENTION_IMPLS:
        raise ConfigError(f"expected --attention-impl in {', '.join(ATTENTION_IMPLS)}, got {impl!r}")
    count = 0
    for mod in model.modules():
        if hasattr(mod, "attention_impl"):
            mod.attention_impl = impl
            count += 1
    return count
