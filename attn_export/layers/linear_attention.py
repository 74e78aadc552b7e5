"""Linear attention with the elu(x)+1 feature map (Katharopoulos et al., 2020): O(L) in length.

The design note's sketch does not run; this is the working version.
    out_i = phi(q_i) . sum_j phi(k_j) v_j^T  /  (phi(q_i) . sum_j phi(k_j) + eps)
Padded keys are removed by zeroing phi(k_j); a query with no key left returns zeros.
``causal=True`` uses prefix sums, still O(L).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_export.layers.attention import merge_heads, split_heads
from attn_export.layers.projections import AttentionProjections

__all__ = ["LinearAttention", "elu_feature_map"]


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 > 0, so the implied attention weights are positive."""
    return F.elu(x) + 1.0


class LinearAttention(AttentionProjections):
    """Kernelised self-attention over x (B, L, D). Has no attention matrix, so no fused form."""

    def __init__(
        self, d_model: int = 512, heads: int = 8, causal: bool = False, eps: float = 1e-6, dropout: float = 0.0
    ) -> None:
        super().__init__(d_model, heads)
        self.causal = causal
        self.eps = eps
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        q, k, v = self.project(x, x, x)  # (B, L, D)
        q_phi = elu_feature_map(split_heads(q, self.heads)).float()  # (B, H, L, Dh), sums in fp32
        k_phi = elu_feature_map(split_heads(k, self.heads)).float()
        vh = split_heads(v, self.heads).float()
        if key_padding_mask is not None:
            keep = (key_padding_mask != 0)[:, None, :, None].to(k_phi.dtype)  # (B, 1, L, 1)
            k_phi = k_phi * keep
        if self.causal:
            kv = torch.cumsum(k_phi.unsqueeze(-1) * vh.unsqueeze(-2), dim=2)  # (B, H, L, Dh, Dh)
            num = (q_phi.unsqueeze(-2) @ kv).squeeze(-2)  # (B, H, L, Dh)
            z = torch.cumsum(k_phi, dim=2)  # (B, H, L, Dh)
            den = (q_phi * z).sum(-1, keepdim=True)  # (B, H, L, 1)
        else:
            kv = k_phi.transpose(-2, -1) @ vh  # (B, H, Dh, Dh)
            num = q_phi @ kv  # (B, H, L, Dh)
            den = q_phi @ k_phi.sum(dim=2).unsqueeze(-1)  # (B, H, L, 1)
        out = (num / (den + self.eps)).to(x.dtype)  # (B, H, L, Dh)
        weights = None
        if need_weights:  # the implied (B, H, L, L) attention matrix, for diagnostics only
            scores = q_phi @ k_phi.transpose(-2, -1)
            if self.causal:
                scores = scores.tril()
            weights = (scores / (scores.sum(-1, keepdim=True) + self.eps)).to(x.dtype)
        return self.w_o(self.dropout(merge_heads(out))), weights
