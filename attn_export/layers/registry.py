"""Build reference layers by name, deterministically, and wrap them for export.

``build_layer("transformer", d_model=512, heads=8, mask="padding", seed=0)`` returns the
same weights in every process for the same arguments, so replicas agree. ``MaskedLayer``
gives every layer the same export signature: ``forward(x, key_padding_mask=None) -> y``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attn_export.errors import ConfigError
from attn_export.layers.block_sparse import BlockSparseAttention
from attn_export.layers.linear_attention import LinearAttention
from attn_export.layers.masks import AttentionMask
from attn_export.layers.mha import MultiHeadAttention
from attn_export.layers.prenorm import PreNormLayer
from attn_export.layers.self_attention import SelfAttention
from attn_export.layers.transformer import TransformerLayer
from attn_export.vocab.choices import LAYER_MASKS, LAYER_NAMES, check_heads

__all__ = ["LayerInfo", "LAYERS", "build_layer", "MaskedLayer"]



@dataclass(frozen=True)
class LayerInfo:
    """What a layer name means: its class and the mask kinds it supports."""

    cls: type[nn.Module]
    masks: tuple[str, ...]
    summary: str


LAYERS: dict[str, LayerInfo] = {
    "transformer": LayerInfo(TransformerLayer, LAYER_MASKS["transformer"], "post-norm encoder layer, FFN 4x (default)"),
    "mha": LayerInfo(MultiHeadAttention, LAYER_MASKS["mha"], "multi-head attention, separate W_q/W_k/W_v/W_o"),
    "self-attention": LayerInfo(SelfAttention, LAYER_MASKS["self-attention"], "self-attention with padding/causal/window masks"),
    "block-sparse": LayerInfo(BlockSparseAttention, LAYER_MASKS["block-sparse"], "attention within fixed-size blocks"),
    "linear": LayerInfo(LinearAttention, LAYER_MASKS["linear"], "linear attention, elu+1 feature map"),
}
if tuple(LAYERS) != LAYER_NAMES:  # pragma: no cover - the vocabulary and the classes name the same layers
    raise ImportError(f"layers.registry builds {tuple(LAYERS)} but the vocabulary names {LAYER_NAMES}")


def _info(layer: str) -> LayerInfo:
    if layer not in LAYERS:
        raise ConfigError(f"unknown layer {layer!r}; choose one of {', '.join(LAYER_NAMES)}")
    return LAYERS[layer]


def build_layer(
    layer: str = "transformer",
    d_model: int = 512,
    heads: int = 8,
    *,
    mask: str = "none",
    window: int = 16,
    block_size: int = 32,
    activation: str = "relu",
    seed: int = 0,
) -> nn.Module:
    """Construct a reference layer in eval mode with weights drawn from ``seed``.

    The mask kind is structural for causal/window (built into the layer) and an input for
    padding; ``MaskedLayer`` handles both so callers never special-case it.
    """
    info = _info(layer)
    check_heads(d_model, heads)
    if mask not in info.masks:
        raise ConfigError(f"layer {layer!r} supports masks {', '.join(info.masks)}, got {mask!r}")
    causal = mask == "causal"
    win = window if mask == "window" else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if layer == "transformer":
            mod: nn.Module = TransformerLayer(d_model, heads, activation=activation, causal=causal, window=win)
        elif layer == "self-attention":
            mod = SelfAttention(d_model, heads, window=win, causal=causal)
        elif layer == "mha":
            mod = MultiHeadAttention(d_model, heads)
        elif layer == "block-sparse":
            mod = BlockSparseAttention(d_model, heads, block_size=block_size)
        else:
            mod = LinearAttention(d_model, heads, causal=causal)
    return mod.eval()


class MaskedLayer(nn.Module):
    """Uniform export signature: x (B, L, D) [+ key_padding_mask (B, L), 1 = keep] -> (B, L, D)."""

    def __init__(self, layer: nn.Module, mask: str = "none") -> None:
        super().__init__()
        self.layer = layer
        self.mask = mask

    @property
    def input_names(self) -> list[str]:
        return ["x", "key_padding_mask"] if self.mask == "padding" else ["x"]

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        layer = self.layer
        if isinstance(layer, MultiHeadAttention):
            m = AttentionMask(
                key_keep=None if key_padding_mask is None else key_padding_mask != 0,  # (B, L)
                causal=self.mask == "causal" and key_padding_mask is None,
            )
            out, _ = layer(x, x, x, mask=m, need_weights=False)
            return out
        if isinstance(layer, (TransformerLayer, PreNormLayer)):  # post-norm or pre-norm encoder layers
            return layer(x, key_padding_mask)
        out, _ = layer(x, key_padding_mask, need_weights=False)
        return out
