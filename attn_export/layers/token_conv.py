"""A convolution over neighbouring tokens after the first layer: DeBERTa-v2's ``ConvLayer``.

Why: deberta-v2-xlarge/xxlarge (``conv_kernel_size`` 3) mix each token with its neighbours once,
after layer 0 (transformers' ``models/deberta_v2/modeling_deberta_v2.py``, ``ConvLayer`` and
``DebertaV2Encoder.forward``): ``LN(layer0_out + act(Conv1d(embeddings)))`` where the convolution
reads the *embedding output* (padding rows zeroed, as ``DebertaV2Embeddings`` multiplies by the
mask) and its output is zeroed at padding before the activation. The result at padding positions
is zeroed too (transformers multiplies by the mask); real tokens never read it.

The padded form runs it on (B, S, D); the packed form (``layers.packed``) scatters its rows to
the (B, S, D) grid for this one layer, so a token's neighbours are its neighbours in the input.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from attn_export.layers.transformer import Fp32LayerNorm

__all__ = ["TokenConv"]

log = logging.getLogger(__name__)

_ACTIVATIONS = {"tanh": nn.Tanh, "gelu": nn.GELU, "relu": nn.ReLU}  # keys: encoder_config.CONV_ACTIVATIONS


class TokenConv(nn.Module):
    """(embeddings, layer-0 output, mask) (B, S, D), (B, S, D), (B, S) -> (B, S, D), zeros at padding."""

    def __init__(self, d_model: int, kernel_size: int, groups: int, activation: str, eps: float) -> None:
        super().__init__()
        self.conv = nn.Conv1d(d_model, d_model, kernel_size, padding=(kernel_size - 1) // 2, groups=groups)
        self.act = _ACTIVATIONS[activation]()
        self.norm = Fp32LayerNorm(d_model, eps=eps)

    def forward(self, embedded: torch.Tensor, residual: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        keep = (attention_mask != 0).unsqueeze(-1)  # (B, S, 1)
        zero = torch.zeros((), dtype=embedded.dtype)
        x = torch.where(keep, embedded, zero)  # DebertaV2Embeddings' `embeddings * mask`
        out = self.conv(x.transpose(1, 2)).transpose(1, 2)  # (B, S, D)
        out = self.act(torch.where(keep, out, zero))
        return torch.where(keep, self.norm(residual + out), zero)  # (B, S, D)
