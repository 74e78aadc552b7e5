"""torchao int8 on the default layer: SQNR against the eager fp32 layer on held-out data.

Thresholds: torchao's own tests require SQNR > 35 dB for an int8 Linear
(``min_sqnr=35`` in test/quantization); a post-norm layer re-normalizes after each block,
so the whole layer must meet the same bar for int8-dynamic. Weight-only keeps activations
in float, leaving only per-row weight rounding (~40-50 dB per Linear), so it must clear 45 dB.
Measured on this data: ~43 dB (dynamic) and ~56 dB (weight-only).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attn_export.compress.calib.generate import synthesize_hidden_states
from attn_export.errors import ConfigError
from attn_export.layers import MaskedLayer, build_layer
from attn_export.validate import sqnr_db

pytest.importorskip("torchao", reason="torchao (the eager int8 reference backend) is not installed (pip install torchao)")

from attn_export.compress.quant.eager import EAGER_INT8_MODES, quantize_eager_

MIN_SQNR_DB = {"int8-dynamic": 35.0, "int8-weight-only": 45.0}


@pytest.fixture(scope="module")
def layer_and_data():
    layer = MaskedLayer(build_layer("transformer", 512, 8, mask="padding"), "padding")
    x, kpm = synthesize_hidden_states(8, 64, 512, np.random.default_rng(1))  # held out: nothing is calibrated
    return layer, torch.from_numpy(x), torch.from_numpy(kpm)


@pytest.mark.parametrize("mode", EAGER_INT8_MODES)
def test_torchao_int8_sqnr_on_default_layer(mode, layer_and_data):
    layer, x, kpm = layer_and_data
    with torch.no_grad():
        ref = layer(x, kpm).numpy()
    quantized = quantize_eager_(layer, mode)
    with torch.no_grad():
        out = quantized(x, kpm).numpy()
    sqnr = sqnr_db(ref, out)
    print(f"torchao {mode}: SQNR {sqnr:.1f} dB")
    assert sqnr >= MIN_SQNR_DB[mode], f"{mode}: SQNR {sqnr:.1f} dB < {MIN_SQNR_DB[mode]} dB"
    assert type(quantized.layer.ffn_in.weight) is not nn.Parameter, "the Linear weights should be torchao tensors"
    with torch.no_grad():  # the reference layer itself is untouched (deep copy)
        np.testing.assert_array_equal(layer(x, kpm).numpy(), ref)
    assert type(layer.layer.ffn_in.weight) is nn.Parameter


def test_inplace_quantizes_the_given_module():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    out = quantize_eager_(model, "int8-weight-only", inplace=True)
    assert out is model and type(model[0].weight) is not nn.Parameter


def test_bad_mode_and_no_linear_are_config_errors():
    with pytest.raises(ConfigError, match="int8-dynamic"):
        quantize_eager_(nn.Linear(4, 4), "int4")
    with pytest.raises(ConfigError, match="no"):
        quantize_eager_(nn.ReLU())
