"""Fully masked rows stay finite (zeros); fused QKV equals separate projections."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from fixtures import LAYER_MASKS, eager, feed_for, small_layer

from attn_export.layers import MultiHeadAttention, fuse_qkv_


@pytest.mark.parametrize("name", ["transformer", "mha", "self-attention", "block-sparse", "linear"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fully_masked_rows_are_finite_zeros(name, dtype):
    layer = small_layer(name, "padding")
    feed = feed_for(layer, 3, 12, fully_masked_row=1)
    layer = layer.to(dtype)
    x = torch.from_numpy(feed["x"]).to(dtype)
    with torch.no_grad():
        if name == "transformer":
            y = layer(x, torch.from_numpy(feed["key_padding_mask"]))
            assert torch.isfinite(y).all()
        else:
            inner = layer.layer
            kpm = torch.from_numpy(feed["key_padding_mask"])
            if name == "mha":
                out, _ = inner(x, x, x, mask=kpm[:, None, None, :], need_weights=False)
            else:
                out, _ = inner(x, kpm, need_weights=False)
            assert torch.isfinite(out).all()
            # The attention output of a sequence without keys is zero, so the layer returns W_o's bias.
            bias = inner.w_o.bias.to(dtype)
            torch.testing.assert_close(out[1], bias.expand_as(out[1]), atol=1e-3, rtol=0)


@pytest.mark.parametrize("name,mask", LAYER_MASKS)
def test_fused_qkv_equals_separate(name, mask):
    layer = small_layer(name, mask)
    fused = copy.deepcopy(layer)
    assert fuse_qkv_(fused) >= 1
    feed = feed_for(layer, 2, 11)
    np.testing.assert_allclose(eager(fused, feed), eager(layer, feed), atol=1e-5, rtol=0)


def test_fused_qkv_cross_attention():
    mha = MultiHeadAttention(64, 4).eval()
    fused = copy.deepcopy(mha)
    fuse_qkv_(fused)
    assert fused.is_qkv_fused and not hasattr(fused, "w_q")
    q, kv = torch.randn(2, 4, 64), torch.randn(2, 7, 64)
    with torch.no_grad():
        torch.testing.assert_close(fused(q, kv, kv)[0], mha(q, kv, kv)[0], atol=1e-5, rtol=0)
