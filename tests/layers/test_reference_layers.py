"""Reference layers: masks, head split, block-sparse and linear attention against explicit maths."""

from __future__ import annotations

import pytest
import torch

from attn_export.errors import ConfigError
from attn_export.layers import (
    BlockSparseAttention,
    LinearAttention,
    MultiHeadAttention,
    SelfAttention,
    TransformerLayer,
    build_layer,
    causal_mask,
    window_mask,
)
from attn_export.layers.linear_attention import elu_feature_map


@pytest.mark.parametrize("cls", [MultiHeadAttention, SelfAttention, BlockSparseAttention, LinearAttention, TransformerLayer])
def test_heads_must_divide_d_model(cls):
    with pytest.raises(ConfigError, match="heads must divide d_model"):
        cls(d_model=30, heads=4)


def test_defaults_match_design_note():
    mha = MultiHeadAttention()
    assert (mha.d_model, mha.heads, mha.head_dim) == (512, 8, 64)
    layer = TransformerLayer()
    assert layer.ffn_in.out_features == 4 * 512


def test_mha_cross_attention_shapes_and_weights():
    mha = MultiHeadAttention(64, 4).eval()
    q, kv = torch.randn(2, 5, 64), torch.randn(2, 9, 64)
    out, w = mha(q, kv, kv)
    assert out.shape == (2, 5, 64) and w.shape == (2, 4, 5, 9)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 5))


def test_mha_mask_zero_means_masked():
    mha = MultiHeadAttention(64, 4).eval()
    x = torch.randn(2, 6, 64)
    mask = torch.ones(2, 1, 6, 6)
    mask[..., 4:] = 0
    _, w = mha(x, x, x, mask=mask)
    assert torch.all(w[..., 4:] == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 6))


def test_mha_matches_explicit_formula():
    mha = MultiHeadAttention(32, 2).eval()
    x = torch.randn(1, 5, 32)
    out, _ = mha(x, x, x)
    q, k, v = mha.w_q(x), mha.w_k(x), mha.w_v(x)
    heads = []
    for h in range(2):
        sl = slice(16 * h, 16 * (h + 1))
        a = torch.softmax(q[..., sl] @ k[..., sl].transpose(-1, -2) / 4.0, -1)
        heads.append(a @ v[..., sl])
    ref = mha.w_o(torch.cat(heads, -1))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_causal_and_window_helpers():
    c = causal_mask(4)
    assert c.tolist() == [[j <= i for j in range(4)] for i in range(4)]
    w = window_mask(5, 1)
    assert w.tolist() == [[abs(i - j) <= 1 for j in range(5)] for i in range(5)]


def test_self_attention_window_and_padding():
    sa = SelfAttention(64, 4, window=2).eval()
    x = torch.randn(2, 8, 64)
    kpm = torch.ones(2, 8, dtype=torch.int32)
    kpm[1, 5:] = 0
    _, w = sa(x, kpm)
    far = ~window_mask(8, 2)
    assert torch.all(w[:, :, far] == 0)
    assert torch.all(w[1, :, :, 5:] == 0)


def test_self_attention_causal():
    sa = SelfAttention(64, 4, causal=True).eval()
    _, w = sa(torch.randn(1, 7, 64))
    assert torch.all(w[..., ~causal_mask(7)] == 0)


@pytest.mark.parametrize("length", [16, 21])  # multiple and non-multiple of the block size
def test_block_sparse_equals_block_diagonal_mha(length):
    bs = BlockSparseAttention(64, 4, block_size=8).eval()
    mha = MultiHeadAttention(64, 4).eval()
    mha.load_state_dict(bs.state_dict(), strict=False)
    x = torch.randn(2, length, 64)
    kpm = torch.ones(2, length, dtype=torch.int32)
    kpm[1, length - 3 :] = 0
    blocks = torch.arange(length) // 8
    keep = (blocks[:, None] == blocks[None, :])[None, None] & (kpm != 0)[:, None, None, :]
    out, _ = bs(x, kpm)
    ref, _ = mha(x, x, x, mask=keep.int())
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_equals_quadratic_form(causal):
    la = LinearAttention(32, 2, causal=causal).eval()
    x = torch.randn(2, 9, 32)
    kpm = torch.ones(2, 9, dtype=torch.int32)
    kpm[1, 6:] = 0
    out, _ = la(x, kpm)
    q, k, v = la.w_q(x), la.w_k(x), la.w_v(x)
    outs = []
    for h in range(2):
        sl = slice(16 * h, 16 * (h + 1))
        s = elu_feature_map(q[..., sl]) @ elu_feature_map(k[..., sl]).transpose(-1, -2)  # (B, L, L)
        s = s * (kpm != 0)[:, None, :]
        if causal:
            s = s.tril()
        outs.append((s / (s.sum(-1, keepdim=True) + la.eps)) @ v[..., sl])
    ref = la.w_o(torch.cat(outs, -1))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


def test_sdpa_fast_path_matches_math():
    sa = SelfAttention(64, 4).eval()
    x = torch.randn(2, 10, 64)
    kpm = torch.ones(2, 10, dtype=torch.int32)
    kpm[0, 7:] = 0
    ref, _ = sa(x, kpm, need_weights=False)
    sa.fast = True
    out, _ = sa(x, kpm, need_weights=False)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_construction_is_deterministic_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = build_layer("transformer", 64, 4, seed=7)
    assert torch.equal(torch.random.get_rng_state(), before)
    b = build_layer("transformer", 64, 4, seed=7)
    c = build_layer("transformer", 64, 4, seed=8)
    for (n, p), (_, q), (_, r) in zip(a.state_dict().items(), b.state_dict().items(), c.state_dict().items()):
        assert torch.equal(p, q), n
    assert not torch.equal(a.self_attn.w_q.weight, c.self_attn.w_q.weight)


def test_transformer_is_post_norm():
    layer = TransformerLayer(64, 4, dropout=0.0).eval()
    out = layer(torch.randn(2, 5, 64) * 10)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 5), atol=1e-4, rtol=0)  # ends with LayerNorm
