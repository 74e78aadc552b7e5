"""Rotary position embeddings (RoPE): positions enter attention by rotating q and k, not by adding vectors.

Why: rotary encoders (ModernBERT) have no position table; each query and key is rotated by an
angle proportional to its position, so a score q_i . k_j depends on i - j only. Being applied
to q and k after their projections and before ``attend``, it works in every attention form
(decomposed, ORT's MultiHeadAttention, the ONNX ``Attention`` op, long-seq, packed) without
any of them knowing: they receive rotated q and k.

The formula is transformers' (``models/modernbert/modeling_modernbert.py``:
``ModernBertRotaryEmbedding.compute_default_rope_parameters`` and ``forward``,
``apply_rotary_pos_emb`` with ``rotate_half``), op for op:

    inv_freq = 1 / theta ** (arange(0, Dh, 2) / Dh)           (Dh/2,) float32
    freqs    = position * inv_freq;  emb = cat(freqs, freqs)    (..., L, Dh)
    q'       = q * cos(emb) + rotate_half(q) * sin(emb),  rotate_half(x) = cat(-x2, x1)

computed in float32 whatever the model's dtype (transformers rotates ``q.float()``), and cast
back. Positions are whatever the caller says: ``arange(L)`` for a padded batch (transformers'
default ``position_ids``), each real token's own position in the packed form. Only the
``default`` rope type is reproduced (a scaled rope type is refused by the family).

In ONNX this is plain elementwise ops (Mul, Add, Cos, Sin, Neg, Slice/Split, Concat), which
every runtime and TensorRT release this project targets parse.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from attn_export.errors import ConfigError

__all__ = ["RotaryEmbedding", "rotate_half"]

log = logging.getLogger(__name__)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., Dh) -> cat(-x[..., Dh/2:], x[..., :Dh/2]) (transformers' ``rotate_half``)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotates projected q and k (..., L, H * Dh) by their positions with one base ``theta``.

    ``inv_freq`` is computed where it is used, in float32, not held as a buffer: a checkpoint has
    no key for it (transformers does not save it either), the export folds it into one float32
    constant, and casting the model to fp16 cannot round it (an fp16 inv_freq is off by ~5e-4
    relative, which at position 8192 turns an angle by radians).
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        if head_dim < 2 or head_dim % 2:
            raise ConfigError(f"expected an even attention head size for rotary positions, got {head_dim}; use hidden_size / heads even")
        if not theta > 0:
            raise ConfigError(f"expected a positive rotary theta, got {theta!r}; use the config's rope_theta")
        self.head_dim = head_dim
        self.theta = float(theta)

    def inv_freq(self, device: torch.device | None = None) -> torch.Tensor:
        """1 / theta ** (arange(0, Dh, 2) / Dh), (Dh/2,) float32: ``compute_default_rope_parameters``."""
        return 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float, device=device) / self.head_dim))

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (..., L) integer -> cos, sin (..., L, Dh), float32."""
        freqs = positions[..., None].float() * self.inv_freq(positions.device)  # (..., L, Dh/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (..., L, Dh)
        return emb.cos(), emb.sin()

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k (..., L, D) with D = H * Dh; positions broadcastable to (..., L) -> rotated q, k (same shape and dtype)."""
        cos, sin = self.cos_sin(positions)  # (..., L, Dh)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # (..., L, 1, Dh): broadcast over heads
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        heads = x.shape[-1] // self.head_dim
        xh = x.view(*x.shape[:-1], heads, self.head_dim).float()  # (..., L, H, Dh), float32 as transformers
        out = xh * cos + rotate_half(xh) * sin  # (..., L, H, Dh)
        return out.reshape(x.shape).to(x.dtype)  # (..., L, D)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta:g}"
