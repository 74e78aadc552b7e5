"""Low-rank factorization: config checks, the rank rule, activation-aware vs plain SVD, ONNX export."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from attn_export.compress.calib.data import ActivationSet, default_calibration_path, load_calibration
from attn_export.compress.calib.generate import generate_calibration
from attn_export.compress.distill import output_error
from attn_export.compress.lowrank import (
    LowRankConfig,
    LowRankLinear,
    factorization_is_profitable,
    linear_flops,
    low_rank_,
)
from attn_export.errors import ConfigError
from attn_export.export import ExportSpec, export_onnx
from attn_export.layers import MaskedLayer, build_layer
from attn_export.layers.projections import fuse_qkv_


def _layer(d_model: int = 64, heads: int = 4, name: str = "transformer") -> MaskedLayer:
    return MaskedLayer(build_layer(name, d_model, heads, mask="padding"), "padding")


@pytest.fixture(scope="module")
def calib64(tmp_path_factory) -> ActivationSet:
    path = generate_calibration(tmp_path_factory.mktemp("calib") / "d64.npz", d_model=64, n_calib=12, n_val=4, seq_len=16)
    return load_calibration(path, d_model=64).calib


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"targets": ("q", "x")}, "expected distinct targets"),
        ({"method": "pca"}, "expected method"),
        ({"rank_ratio": 1.0}, "0 < rank_ratio < 1"),
        ({"rank_ratio": None}, "rank_ratio=0.5"),
        ({"rank": 0}, "positive int"),
        ({"energy": 1.5}, "0 < energy <= 1"),
        ({"param_budget": -3}, "positive param_budget"),
    ],
)
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        LowRankConfig(**kwargs)


def test_config_accepts_comma_targets_and_picks_the_first_criterion():
    cfg = LowRankConfig(targets="q,k,ffn", energy=0.9)
    assert cfg.targets == ("q", "k", "ffn") and cfg.criterion == "energy"
    assert LowRankConfig().criterion == "rank_ratio"


def test_profitability_rule_and_flops():
    assert factorization_is_profitable(512, 512, 255) and not factorization_is_profitable(512, 512, 256)
    assert linear_flops(512, 2048) == 2 * 512 * 2048 and linear_flops(512, 2048, 10) == 2 * 10 * 2560


def test_rank_that_saves_nothing_is_refused_unless_forced(calib64):
    layer = _layer()
    summary = low_rank_(layer, LowRankConfig(rank={"q": 32, "k": 16}), calib64)  # 32 * 128 >= 64 * 64
    assert "rank 32" in summary.skipped["layer.self_attn.w_q"] and "force=True" in summary.skipped["layer.self_attn.w_q"]
    assert type(layer.layer.self_attn.w_q) is nn.Linear
    assert summary.ranks == {"layer.self_attn.w_k": 16}
    assert summary.skipped["layer.self_attn.w_v"] == "not in the rank dict"
    forced = low_rank_(_layer(), LowRankConfig(rank=32, force=True), calib64)
    assert forced.ranks["layer.self_attn.w_q"] == 32 and not forced.skipped
    assert forced.layers["layer.self_attn.w_q"]["profitable"] is False


@pytest.mark.parametrize("method", ["svd", "activation"])
def test_full_rank_factorization_is_exact(method, calib64):
    ref = _layer()
    low = copy.deepcopy(ref)
    low_rank_(low, LowRankConfig(rank=64, force=True, targets=("q", "k", "v", "o", "ffn"), method=method), calib64)
    x, kpm = calib64.to_torch()
    with torch.no_grad():
        torch.testing.assert_close(low(x, kpm), ref(x, kpm), atol=2e-5, rtol=1e-4)


def test_summary_counts_params_and_flops(calib64):
    layer = _layer()
    before = sum(p.numel() for p in layer.parameters())
    summary = low_rank_(layer, LowRankConfig(rank_ratio=0.5), calib64)
    r = int(0.5 * 64 * 64 / 128)
    assert summary.ranks == {f"layer.self_attn.w_{t}": r for t in "qkvo"}
    assert summary.params_before == before
    assert summary.params_after == before - 4 * 64 * 64 + 4 * r * 128
    assert summary.replaced_params_after * 2 == summary.replaced_params_before
    assert summary.flops_before - summary.flops_after == 4 * (linear_flops(64, 64) - linear_flops(64, 64, r))
    assert isinstance(layer.layer.self_attn.w_o, LowRankLinear) and summary.to_dict()["ranks"] == summary.ranks


def test_padded_positions_do_not_affect_the_factors(calib64):
    noisy_x = calib64.x.copy()
    noisy_x[calib64.key_padding_mask == 0] = 1e3  # garbage where the mask says padding
    a, b = _layer(), _layer()
    low_rank_(a, LowRankConfig(), calib64)
    low_rank_(b, LowRankConfig(), ActivationSet(noisy_x, calib64.key_padding_mask))
    torch.testing.assert_close(a.layer.self_attn.w_q.down.weight, b.layer.self_attn.w_q.down.weight, atol=1e-5, rtol=1e-4)


def test_energy_budget_and_ffn_targets(calib64):
    low = low_rank_(_layer(), LowRankConfig(energy=0.5, targets=("ffn",)), calib64)
    assert set(low.ranks) == {"layer.ffn_in", "layer.ffn_out"}
    assert all(info["energy_kept"] >= 0.5 for info in low.layers.values())
    budget = 10_000  # below the 4 x 31 x 128 that the largest profitable ranks would take
    spent = low_rank_(_layer(), LowRankConfig(param_budget=budget), calib64)
    assert budget - 128 < spent.replaced_params_after <= budget and len(spent.ranks) == 4
    with pytest.raises(ConfigError, match="param_budget >= 512"):
        low_rank_(_layer(), LowRankConfig(param_budget=100), calib64)


def test_skips_fused_and_already_factorized_projections(calib64):
    layer = _layer()
    low_rank_(layer, LowRankConfig(targets=("o",)), calib64)
    fuse_qkv_(layer)
    summary = low_rank_(layer, LowRankConfig(targets=("q", "o")), calib64)
    assert "fuse_qkv_" in summary.skipped["layer.self_attn.w_qkv"]
    assert "LowRankLinear" in summary.skipped["layer.self_attn.w_o"] and not summary.ranks


def test_activation_method_needs_calibration_data():
    with pytest.raises(ConfigError, match="needs calibration activations"):
        low_rank_(_layer(), LowRankConfig())


@pytest.mark.parametrize("name", ["mha", "self-attention"])
def test_bare_attention_layers_are_factorized(name, calib64):
    layer = build_layer(name, 64, 4, mask="padding")
    summary = low_rank_(layer, LowRankConfig(), calib64.x, calib64.key_padding_mask)
    assert len(summary.ranks) == 4


def _val_errors(ref: MaskedLayer, calib: ActivationSet, val: ActivationSet) -> dict[str, float]:
    errors = {}
    for method in ("svd", "activation"):
        low = copy.deepcopy(ref)
        low_rank_(low, LowRankConfig(rank_ratio=0.5, targets=("q", "k", "v", "o"), method=method), calib)
        errors[method] = output_error(low, ref, val).rel_l2
    print(f"validation rel L2 at 50% of projection params: {errors}")
    return errors


def test_activation_aware_beats_plain_svd_on_validation_default_layer():
    """Acceptance (d_model 512, 8 heads, shipped set): whitening by the calibration activations wins."""
    data = load_calibration(default_calibration_path(512), d_model=512)
    errors = _val_errors(_layer(512, 8), data.calib, data.val)
    assert errors["activation"] < 0.75 * errors["svd"], errors


def test_activation_aware_beats_plain_svd_on_validation_d128(tmp_path):
    data = load_calibration(generate_calibration(tmp_path / "d128.npz", 128, n_calib=24, n_val=8, seq_len=32, seed=5))
    errors = _val_errors(_layer(128, 8), data.calib, data.val)
    assert errors["activation"] < 0.75 * errors["svd"], errors


def test_low_rank_layer_exports_as_two_matmuls_and_matches_eager(tmp_path, calib64):
    layer = _layer()
    summary = low_rank_(layer, LowRankConfig(rank_ratio=0.5), calib64)
    r = summary.ranks["layer.self_attn.w_q"]
    result = export_onnx(layer, tmp_path / "low.onnx", ExportSpec())
    assert result.qkv_fused == 0, "factorized Q/K/V must not be fused"
    proto = onnx.load(result.path)
    weights = {i.name: tuple(i.dims) for i in proto.graph.initializer}
    factor_matmuls = [
        n for n in proto.graph.node
        if n.op_type in ("MatMul", "Gemm") and any(r in weights.get(i, ()) for i in n.input)
    ]  # fmt: skip
    assert len(factor_matmuls) == 2 * 4, [n.name for n in factor_matmuls]
    import onnxruntime as ort

    x, kpm = calib64.to_torch()
    sess = ort.InferenceSession(result.path, providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {"x": x.numpy(), "key_padding_mask": kpm.numpy().astype(np.int32)})
    with torch.no_grad():
        want = layer(x, kpm).numpy()
    err = np.abs(got - want)
    assert err.max() < 1e-4, f"max abs error {err.max():.3g} at {np.unravel_index(err.argmax(), err.shape)}"


def test_low_rank_words_have_one_home():
    """The methods and the target names the CLI offers are the ones the transform takes (vocab/choices.py is their home)."""
    import attn_export.compress.lowrank as lowrank
    from attn_export.vocab import choices as vocabulary

    assert lowrank.LOW_RANK_METHODS is vocabulary.LOW_RANK_METHODS
    assert tuple(lowrank.LOW_RANK_TARGETS) == vocabulary.LOW_RANK_TARGET_NAMES
