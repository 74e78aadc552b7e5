"""Reference attention layers (plain ``nn.Module``s) and their building blocks."""

from attn_export.layers.attention import ATTENTION_FORMS, ATTENTION_IMPLS, attend
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
    LAYER_NAMES,
    LAYERS,
    MASK_KINDS,
    MaskedLayer,
    build_layer,
    supported_masks,
)
from attn_export.layers.self_attention import SelfAttention
from attn_export.layers.transformer import Fp32LayerNorm, TransformerLayer

__all__ = [
    "ATTENTION_FORMS",
    "ATTENTION_IMPLS",
    "AttentionMask",
    "AttentionProjections",
    "BlockSparseAttention",
    "Fp32LayerNorm",
    "LAYER_NAMES",
    "LAYERS",
    "LinearAttention",
    "MASK_KINDS",
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
    "supported_masks",
    "window_mask",
]
