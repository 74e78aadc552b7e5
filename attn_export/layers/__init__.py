"""Reference attention layers (plain ``nn.Module``s) and their building blocks.

Names load lazily (PEP 562): ``attn_export.layers.encoder_config`` is read while flags are
validated, before torch is imported, and importing it must not load every layer.
"""

from __future__ import annotations

from attn_export.host.lazy import lazy_exports

_WHERE = {
    "attend": "attention", "BlockSparseAttention": "block_sparse", "LinearAttention": "linear_attention",
    "AttentionMask": "masks", "causal_mask": "masks", "window_mask": "masks", "MultiHeadAttention": "mha",
    "AttentionProjections": "projections", "fuse_qkv_": "projections", "set_attention_form_": "projections",
    "set_attention_impl_": "projections", "LAYERS": "registry", "MaskedLayer": "registry", "build_layer": "registry",
    "SelfAttention": "self_attention", "Fp32LayerNorm": "transformer", "TransformerLayer": "transformer",
    "PreNormLayer": "prenorm", "RotaryEmbedding": "rotary",
}  # fmt: skip
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
