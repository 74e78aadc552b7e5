"""Reference attention layers (plain ``nn.Module``s) and their building blocks."""

from attn_export.layers.attention import attend
from attn_export.layers.block_sparse import BlockSparseAttention
from attn_export.layers.linear_attention import LinearAttention
from attn_export.layers.masks import AttentionMask, causal_mask, window_mask
from attn_export.layers.mha import MultiHeadAttention
from attn_export.layers.projections import (
    AttentionProjections,
    fuse_qkv_,
    set_attention_form_,
    set_attention_impl_,
)
from attn_export.layers.registry import (
    LAYERS,
    MaskedLayer,
    build_layer,
)
from attn_export.layers.self_attention import SelfAttention
from attn_export.layers.transformer import Fp32LayerNorm, TransformerLayer

__all__ = [
    "AttentionMask",
    "AttentionProjections",
    "BlockSparseAttention",
    "Fp32LayerNorm",
    "LAYERS",
    "LinearAttention",
    "MaskedLayer",
    "MultiHeadAttention",
    "SelfAttention",
    "TransformerLayer",
    "attend",
    "build_layer",
    "causal_mask",
    "fuse_qkv_",
    "set_attention_form_",
    "set_attention_impl_",
    "window_mask",
]
