"""fp16 exports keep the masked softmax and LayerNorm in float32; fully masked rows stay finite."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fixtures import eager, feed_for, run_onnx, small_layer

from attn_export.errors import ConfigError
from attn_export.export import ExportSpec, export_onnx, summarize_graph
from attn_export.validate import accuracy
from attn_export.vocab.choices import ATTENTION_FORMS


def test_fp16_softmax_and_layernorm_run_in_float32(tmp_path):
    layer = small_layer("transformer", "padding")
    result = export_onnx(layer, tmp_path / "h.onnx", ExportSpec(precision="fp16"))
    summary = summarize_graph(result.path)
    assert "FLOAT16" in summary.dtypes_of_floats  # it is a half-precision graph...
    softmax = [i for i in summary.islands if i.op == "Softmax"]
    assert softmax and all(i.input_dtype == "FLOAT" and i.output_dtype == "FLOAT" for i in softmax)
    assert summary.island_dtypes_ok  # ...with LayerNorm in fp32 too
    model = onnx.load(result.path)
    weights = [t for t in model.graph.initializer if len(t.dims) == 2]
    assert weights and all(t.data_type == onnx.TensorProto.FLOAT16 for t in weights)


@pytest.mark.parametrize("form", ["decomposed", "onnx-attention"])
@pytest.mark.parametrize("name,mask", [("transformer", "padding"), ("self-attention", "causal"), ("block-sparse", "padding")])
def test_fp16_accuracy_vs_eager_fp32(tmp_path, form, name, mask):
    layer = small_layer(name, mask)
    result = export_onnx(layer, tmp_path / "h.onnx", ExportSpec(attention=form, precision="fp16"))
    feed = feed_for(layer, batch=4, seq=33, seed=5)
    acc = accuracy(eager(layer, feed), run_onnx(result.path, feed, dtype=np.float16))
    assert acc.rel_l2 <= 1e-2, acc


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("form", ATTENTION_FORMS)
def test_fully_masked_rows_finite_in_every_form(tmp_path, form, precision):
    layer = small_layer("transformer", "padding")
    result = export_onnx(layer, tmp_path / "m.onnx", ExportSpec(attention=form, precision=precision))
    feed = feed_for(layer, batch=3, seq=10, seed=4, fully_masked_row=2)
    got = run_onnx(result.path, feed, dtype=np.float16 if precision == "fp16" else np.float32)
    assert np.isfinite(got).all()
    ref = eager(layer, feed)
    assert np.isfinite(ref).all()
    tol = 1e-4 if precision == "fp32" else 5e-2
    np.testing.assert_allclose(got[2], ref[2], atol=tol, rtol=0)


def test_mask_value_is_safe_in_fp16():
    import torch

    from attn_export.layers.masks import mask_value

    assert torch.isinf(torch.tensor(-1e9, dtype=torch.float16))  # the design note's value overflows
    v = torch.tensor(mask_value(torch.float16), dtype=torch.float16)
    scores = torch.tensor([-1000.0, 0.0, 1000.0], dtype=torch.float16)
    assert torch.isfinite(v + scores).all()  # adding any realistic score stays finite


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(attention="flash"), "expected --attention"),
        (dict(precision="int4"), "expected --precision"),
        (dict(attention="onnx-attention", opset=20), "use --opset 23"),
        (dict(opset=9), "expected --opset"),
    ],
)
def test_export_spec_validation(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ExportSpec(**kwargs)
