"""Post-norm Transformer encoder layer (attention, FFN 4x, residuals), LayerNorm kept in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_export.errors import ConfigError
from attn_export.layers.position_bias import RelativePositionBias
from attn_export.layers.self_attention import SelfAttention

__all__ = ["TransformerLayer", "Fp32LayerNorm"]

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


class Fp32LayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32 even when the module is half precision.

    Half-precision variance of activations with outliers under/overflows; the Casts this
    adds are the LayerNorm fp32 island of fp16 exports (and no-ops in fp32 graphs).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return super().forward(x)
        w = None if self.weight is None else self.weight.float()
        b = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)


class TransformerLayer(nn.Module):
    """x -> LN(x + Attn(x)) -> LN(h + FFN(h)); FFN = Linear(D, 4D) -> act -> Linear(4D, D).

    ``position_bias``: a relative position bias module (MPNet) whose bias every layer adds to
    its scores; the encoder shares one module with all its layers and computes the bias once
    per forward, so a layer run alone (layer N of a checkpoint) computes it itself.
    """

    def __init__(
        self,
        d_model: int = 512,
        heads: int = 8,
        ffn_mult: int = 4,
        activation: str = "relu",
        dropout: float = 0.1,
        eps: float = 1e-5,
        causal: bool = False,
        window: int | None = None,
        d_ffn: int | None = None,
        position_bias: RelativePositionBias | None = None,
    ) -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ConfigError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        self.d_model = d_model
        self.heads = heads
        d_ffn = d_ffn or ffn_mult * d_model
        self.self_attn = SelfAttention(d_model, heads, window=window, causal=causal)
        self.norm1 = Fp32LayerNorm(d_model, eps=eps)
        self.ffn_in = nn.Linear(d_model, d_ffn)
        self.act = _ACTIVATIONS[activation]()
        self.ffn_out = nn.Linear(d_ffn, d_model)
        self.norm2 = Fp32LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.position_bias = position_bias

    def forward(
        self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, position_bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``position_bias``: the bias the encoder computed once for all its layers (None: this layer's own, if it has one)."""
        if position_bias is None and self.position_bias is not None:
            position_bias = self.position_bias.for_length(x.shape[1], x.device)  # (1, H, L, L)
        attn, _ = self.self_attn(x, key_padding_mask, need_weights=False, bias=position_bias)  # (B, L, D)
        return self.after_attention(x, attn)

    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention projects: the input itself (post-norm; ``layers.prenorm`` normalises it first)."""
        return x

    def after_attention(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual + norm around the attention output, then the FFN block; any leading shape.

        Shared with the packed encoder form (``layers.packed``), which runs it on (T, D) tokens.
        """
        h = self.norm1(x + self.dropout(attn))
        ffn = self.ffn_out(self.act(self.ffn_in(h)))  # (..., D)
        return self.norm2(h + self.dropout(ffn))
