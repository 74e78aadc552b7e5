"""SelfAttention with a key-padding mask, an optional local window, an optional causal mask and optional rotary positions."""

from __future__ import annotations

import torch
from torch import nn

from attn_export.errors import ConfigError
from attn_export.layers.attention import attend
from attn_export.layers.masks import AttentionMask, causal_mask, combine_keep, window_mask
from attn_export.layers.projections import AttentionProjections
from attn_export.layers.rotary import RotaryEmbedding

__all__ = ["SelfAttention"]


class SelfAttention(AttentionProjections):
    """Self-attention over x (B, L, D).

    key_padding_mask (B, L): 1 = real token, 0 = padding. ``window=w`` masks |i - j| > w;
    ``causal=True`` masks j > i. Both are built in-graph from L, so exports stay dynamic.
    The mask travels to ``attend`` in parts (``AttentionMask``), so the long-seq export form
    never materialises an (L, L) mask. ``rotary`` (``layers.rotary``) rotates q and k by their
    positions after the projections, so every attention form gets rotated q and k.
    """

    def __init__(
        self,
        d_model: int = 512,
        heads: int = 8,
        window: int | None = None,
        causal: bool = False,
        dropout: float = 0.0,
        bias: bool = True,
        rotary: RotaryEmbedding | None = None,
    ) -> None:
        super().__init__(d_model, heads, bias)
        if window is not None and window < 0:
            raise ConfigError(f"window must be >= 0, got {window}; use None for global attention")
        self.window = window
        self.causal = causal
        self.dropout = nn.Dropout(dropout)
        self.rotary = rotary

    def positioned(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k (..., L, D) rotated by ``positions`` (..., L) (None: ``arange(L)``); unchanged without rotary."""
        if self.rotary is None:
            return q, k
        if positions is None:
            positions = torch.arange(q.shape[-2], device=q.device)  # (L,): transformers' default position_ids
        return self.rotary(q, k, positions)

    def structural_keep(self, length: int, device: torch.device) -> torch.Tensor | None:
        """The (L, L) causal/window keep mask, or None when attention is global."""
        return combine_keep(
            causal_mask(length, device=device) if self.causal else None,
            window_mask(length, self.window, device=device) if self.window is not None else None,
        )

    def forward(
        self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``bias``: an additive score bias (B or 1, H, L, L), float32, e.g. a relative position bias."""
        q, k, v = self.project(x, x, x)  # (B, L, D)
        q, k = self.positioned(q, k)  # rotary positions arange(L), when the layer has them
        keep = AttentionMask(
            key_keep=None if key_padding_mask is None else key_padding_mask != 0,  # (B, L)
            causal=self.causal,
            window=self.window,
        )
        out, weights = attend(
            q, k, v, self.heads, keep, form=self.attention_form, need_weights=need_weights, impl=self.attention_impl, bias=bias
        )
        return self.w_o(self.dropout(out)), weights
