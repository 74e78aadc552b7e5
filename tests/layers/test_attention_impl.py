"""``attention_impl``: PyTorch's SDPA and the explicit math agree for every layer and mask kind,
fully masked rows included; masks in parts expand to the same dense masks as before."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures import LAYER_MASKS, eager, feed_for, small_layer

from attn_export.errors import ConfigError
from attn_export.layers import (
    AttentionMask,
    MultiHeadAttention,
    SelfAttention,
    causal_mask,
    set_attention_impl_,
    window_mask,
)
from attn_export.layers.masks import combine_keep, padding_to_keep
from attn_export.vocab.choices import ATTENTION_IMPLS


@pytest.mark.parametrize("name,mask", LAYER_MASKS)
def test_sdpa_matches_math_for_every_layer_and_mask(name, mask):
    layer = small_layer(name, mask)
    feed = feed_for(layer, batch=3, seq=21, seed=1, fully_masked_row=2)
    ref = eager(layer, feed)
    assert set_attention_impl_(layer, "sdpa") >= 1
    got = eager(layer, feed)
    assert np.isfinite(got).all()
    err = np.abs(got - ref)
    assert err.max() <= 1e-5, f"{name}/{mask}: max abs {err.max():.3g} at {np.unravel_index(err.argmax(), err.shape)}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sdpa_fully_masked_rows_are_zeros(dtype):
    sa = SelfAttention(32, 2, causal=True).eval().to(dtype)
    x = torch.randn(2, 9, 32, dtype=dtype)
    kpm = torch.ones(2, 9, dtype=torch.int32)
    kpm[0, :3] = 0  # left padding + causal: query rows 0..2 keep no key
    kpm[1] = 0
    with torch.no_grad():
        ref, _ = sa(x, kpm, need_weights=False)
        sa.attention_impl = "sdpa"
        out, _ = sa(x, kpm, need_weights=False)
    assert torch.isfinite(out).all()
    bias = sa.w_o.bias.detach()
    torch.testing.assert_close(out[0, :3], bias.expand(3, -1))  # attention output exactly zero
    torch.testing.assert_close(out[1], bias.expand(9, -1))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, ref, atol=tol, rtol=0)


def test_mha_weights_keep_the_math_path():
    mha = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        ref, ref_w = mha(x)
        mha.attention_impl = "sdpa"
        out, w = mha(x)  # need_weights=True by default: SDPA cannot return them, math runs
        fast, none = mha(x, need_weights=False)
    assert w is not None and none is None
    torch.testing.assert_close(w, ref_w, atol=0, rtol=0)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)


def test_impl_choice_is_validated_and_fast_is_an_alias():
    sa = SelfAttention(32, 2)
    assert ATTENTION_IMPLS == ("math", "sdpa") and sa.attention_impl == "math"
    sa.fast = True
    assert sa.attention_impl == "sdpa" and sa.fast
    with pytest.raises(ConfigError, match="expected --attention-impl"):
        set_attention_impl_(sa, "flash")


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (False, 2), (True, 1)])
def test_mask_parts_expand_to_the_combined_dense_mask(causal, window):
    kpm = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]])
    parts = AttentionMask(key_keep=kpm != 0, causal=causal, window=window)
    structural = combine_keep(causal_mask(5) if causal else None, window_mask(5, window) if window is not None else None)
    expected = combine_keep(padding_to_keep(kpm), structural)
    assert torch.equal(parts.dense(5, 5), expected)
    rows = parts.row_valid(5, 5)
    assert torch.equal(rows.expand(2, 1, 5, 1), expected.expand(2, 1, 5, 5).any(-1, keepdim=True))
    assert AttentionMask().dense(5, 5) is None and AttentionMask(causal=True).row_valid(5, 5) is None
