"""Block-sparse attention: each token attends only within its block of ``block_size`` tokens.

The design note's sketch does not run; this is the working version. The sequence is padded
to a multiple of the block size, the pad keys are masked, and blocks are folded into the
batch so the same ``attend`` (and every export form) computes each block's attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_export.errors import ConfigError
from attn_export.layers.attention import attend
from attn_export.layers.masks import padding_to_keep
from attn_export.layers.projections import AttentionProjections

__all__ = ["BlockSparseAttention"]


class BlockSparseAttention(AttentionProjections):
    """Block-diagonal self-attention over x (B, L, D); cost O(L * block_size)."""

    def __init__(self, d_model: int = 512, heads: int = 8, block_size: int = 32, dropout: float = 0.0) -> None:
        super().__init__(d_model, heads)
        if block_size <= 0:
            raise ConfigError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, length, d = x.shape
        bs = self.block_size
        pad = (bs - length % bs) % bs
        keep_tokens = (
            torch.ones(b, length, dtype=torch.int32, device=x.device)
            if key_padding_mask is None
            else (key_padding_mask != 0).to(torch.int32)
        )  # (B, L); int32, not bool: TensorRT's Pad does not take BOOL tensors
        x_p = F.pad(x, (0, 0, 0, pad))  # (B, Lp, D)
        keep_p = F.pad(keep_tokens, (0, pad), value=0)  # (B, Lp): the pad is masked
        blocks = x_p.shape[1] // bs
        q, k, v = self.project(x_p, x_p, x_p)  # (B, Lp, D)
        q, k, v = (t.reshape(b * blocks, bs, d) for t in (q, k, v))  # (B*nb, bs, D)
        keep = padding_to_keep(keep_p.reshape(b * blocks, bs))  # (B*nb, 1, 1, bs)
        out, weights = attend(
            q, k, v, self.heads, keep, form=self.attention_form, need_weights=need_weights, impl=self.attention_impl
        )  # (B*nb, bs, D)
        out = out.reshape(b, blocks * bs, d)[:, :length]  # (B, L, D)
        if weights is not None:
            weights = weights.reshape(b, blocks, self.heads, bs, bs)  # per-block maps
        return self.w_o(self.dropout(out)), weights
