"""MultiHeadAttention as the design note describes it (separate W_q/W_k/W_v/W_o)."""

from __future__ import annotations

import torch
from torch import nn

from attn_export.layers.attention import attend
from attn_export.layers.masks import AttentionMask
from attn_export.layers.projections import AttentionProjections

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(AttentionProjections):
    """Scaled dot-product multi-head attention; q/k/v may differ in length (cross-attention).

    ``mask`` uses 0 = masked, and broadcasts to (B, H, Lq, Lk): (Lq, Lk), (B, Lq, Lk) and
    (B, 1|H, Lq, Lk) are accepted, or an ``AttentionMask`` (key padding / causal parts).

    ``need_weights=True`` (the default, as in ``nn.MultiheadAttention``) returns the attention
    weights, which only the explicit math computes: with ``attention_impl="sdpa"`` such calls
    still run math. Pass ``need_weights=False`` to get SDPA.
    """

    def __init__(self, d_model: int = 512, heads: int = 8, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__(d_model, heads, bias)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        mask: torch.Tensor | AttentionMask | None = None,
        need_weights: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        key = query if key is None else key
        value = key if value is None else value
        q, k, v = self.project(query, key, value)  # (B, L, D) each
        keep: torch.Tensor | AttentionMask | None = mask if isinstance(mask, AttentionMask) else None
        if isinstance(mask, torch.Tensor):
            keep = mask != 0
            if keep.dim() == 3:  # (B, Lq, Lk) -> (B, 1, Lq, Lk)
                keep = keep.unsqueeze(1)
        out, weights = attend(
            q, k, v, self.heads, keep, form=self.attention_form, need_weights=need_weights, impl=self.attention_impl
        )  # (B, Lq, D)
        return self.w_o(self.dropout(out)), weights
