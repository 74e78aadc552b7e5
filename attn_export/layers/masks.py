"""Mask helpers. Convention everywhere: a *keep* mask, 1/True = attend, 0/False = masked.

Masks are combined as booleans and turned into an additive bias exactly once, in the
softmax's float32 island, so the large negative value never overflows a half-precision
graph (the design note's -1e9 overflows fp16).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "AttentionMask",
    "mask_value",
    "causal_mask",
    "window_mask",
    "padding_to_keep",
    "combine_keep",
    "keep_to_bias",
]


def mask_value(dtype: torch.dtype) -> float:
    """A large negative number that is finite in ``dtype`` even after adding a score to it."""
    return float(torch.finfo(dtype).min) / 2


def causal_mask(length_q: int, length_k: int | None = None, device: torch.device | None = None) -> torch.Tensor:
    """Square subsequent mask: keep[i, j] = j <= i. Shape (Lq, Lk), bool."""
    length_k = length_q if length_k is None else length_k
    i = torch.arange(length_q, device=device).unsqueeze(-1)  # (Lq, 1)
    j = torch.arange(length_k, device=device).unsqueeze(0)  # (1, Lk)
    return j <= i


def window_mask(length: int, window: int, device: torch.device | None = None) -> torch.Tensor:
    """Local window: keep[i, j] = |i - j| <= window. Shape (L, L), bool."""
    i = torch.arange(length, device=device).unsqueeze(-1)
    j = torch.arange(length, device=device).unsqueeze(0)
    return (i - j).abs() <= window


def padding_to_keep(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """(B, Lk) with 1 = real token -> keep mask (B, 1, 1, Lk) that broadcasts over heads and queries."""
    return (key_padding_mask != 0)[:, None, None, :]


def combine_keep(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """AND together any number of broadcastable keep masks (None = no constraint)."""
    out: torch.Tensor | None = None
    for m in masks:
        if m is None:
            continue
        m = m != 0 if m.dtype != torch.bool else m
        out = m if out is None else out & m
    return out


def keep_to_bias(keep: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean keep mask -> additive bias: 0 where kept, ``mask_value(dtype)`` where masked."""
    zero = torch.zeros((), dtype=dtype, device=keep.device)
    neg = torch.full((), mask_value(dtype), dtype=dtype, device=keep.device)
    return torch.where(keep, zero, neg)


@dataclass(frozen=True)
class AttentionMask:
    """A self-attention mask kept in its parts: key padding, causal, local window.

    The explicit math and SDPA paths expand it with ``dense``; the ``long-seq`` export form
    hands the parts to ONNX Runtime's kernels, so its graph never holds an (Lq, Lk) mask.

    key_keep: (B, Lk) bool, True = real token (None = no padding).
    causal: keep[i, j] = j <= i.  window: keep[i, j] = |i - j| <= window (None = global).
    """

    key_keep: torch.Tensor | None = None
    causal: bool = False
    window: int | None = None

    @property
    def is_padding_only(self) -> bool:
        """True when only the keys are masked: every query row sees the same keys."""
        return not self.causal and self.window is None

    def dense(self, length_q: int, length_k: int, device: torch.device | None = None) -> torch.Tensor | None:
        """The keep mask broadcastable to (B, H, Lq, Lk), or None when nothing is masked."""
        structural = combine_keep(
            causal_mask(length_q, length_k, device=device) if self.causal else None,
            _window_keep(length_q, length_k, self.window, device) if self.window is not None else None,
        )  # (Lq, Lk)
        padding = None if self.key_keep is None else self.key_keep[:, None, None, :]  # (B, 1, 1, Lk)
        return combine_keep(padding, structural)

    def row_valid(self, length_q: int, length_k: int, device: torch.device | None = None) -> torch.Tensor | None:
        """Which query rows keep at least one key, broadcastable to (B, H, Lq, 1); None = all.

        Causal and window masks always keep the diagonal, so only padding can empty a row,
        and without a structural mask a row is empty exactly when its sequence is.
        """
        if self.key_keep is None:
            return None
        if self.is_padding_only:
            return self.key_keep.any(dim=-1)[:, None, None, None]  # (B, 1, 1, 1)
        keep = self.dense(length_q, length_k, device)
        return None if keep is None else keep.any(dim=-1, keepdim=True)


def _window_keep(length_q: int, length_k: int, window: int, device: torch.device | None) -> torch.Tensor:
    if length_q == length_k:
        return window_mask(length_q, window, device=device)
    i = torch.arange(length_q, device=device).unsqueeze(-1)  # (Lq, 1)
    j = torch.arange(length_k, device=device).unsqueeze(0)  # (1, Lk)
    return (i - j).abs() <= window
