"""Every reference layer and mask kind: eager vs fp32 ONNX export in ONNX Runtime (<= 1e-4),
at a batch size and sequence length different from the export example."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fixtures import LAYER_MASKS, eager, feed_for, run_onnx, small_layer

from attn_export.export import ExportSpec, export_onnx, summarize_graph

EXAMPLE = dict(example_batch=2, example_seq=16)


@pytest.mark.parametrize("name,mask", LAYER_MASKS)
def test_fp32_export_matches_eager(tmp_path, name, mask):
    layer = small_layer(name, mask)
    result = export_onnx(layer, tmp_path / "m.onnx", ExportSpec(**EXAMPLE))
    onnx.checker.check_model(onnx.load(result.path), full_check=True)
    feed = feed_for(layer, batch=3, seq=37, seed=1)  # != export example (2, 16)
    got = run_onnx(result.path, feed)
    ref = eager(layer, feed)
    err = np.abs(got - ref)
    assert err.max() <= 1e-4, f"max abs {err.max():.3g} at {np.unravel_index(err.argmax(), err.shape)}"


@pytest.mark.parametrize("form", ["onnx-attention", "ort-contrib"])
@pytest.mark.parametrize("name,mask", [("transformer", "padding"), ("self-attention", "causal"), ("mha", "padding"), ("block-sparse", "padding")])
def test_fused_forms_match_eager(tmp_path, form, name, mask):
    layer = small_layer(name, mask)
    result = export_onnx(layer, tmp_path / "m.onnx", ExportSpec(attention=form, **EXAMPLE))
    assert result.fused_attention == 1, result.describe()
    feed = feed_for(layer, batch=3, seq=29, seed=2)
    np.testing.assert_allclose(run_onnx(result.path, feed), eager(layer, feed), atol=1e-4, rtol=0)


def test_onnx_attention_opset23_with_padding_mask_expanded(tmp_path):
    layer = small_layer("transformer", "padding")
    result = export_onnx(layer, tmp_path / "m.onnx", ExportSpec(attention="onnx-attention"))
    assert result.opset == 23
    model = onnx.shape_inference.infer_shapes(onnx.load(result.path))
    attn = [n for n in model.graph.node if n.op_type == "Attention"]
    assert len(attn) == 1
    shapes = {v.name: v.type.tensor_type.shape for v in model.graph.value_info}
    mask_shape = shapes[attn[0].input[3]]
    assert len(mask_shape.dim) == 4
    dims = [d.dim_param or d.dim_value for d in mask_shape.dim]
    assert dims[1] == 1 and dims[2] == dims[3] != 1, f"mask must be [B,1,Lq,Lk], got {dims}"
    feed = feed_for(layer, batch=4, seq=40, seed=3)
    np.testing.assert_allclose(run_onnx(result.path, feed), eager(layer, feed), atol=1e-4, rtol=0)


def test_export_reports_what_it_did(tmp_path):
    layer = small_layer("transformer", "padding")
    dec = export_onnx(layer, tmp_path / "d.onnx", ExportSpec())
    assert (dec.attention_blocks, dec.fused_attention, dec.qkv_fused) == (1, 0, 1)
    assert [i["op"] for i in dec.fp32_islands].count("Softmax") == 1
    ort = export_onnx(layer, tmp_path / "o.onnx", ExportSpec(attention="ort-contrib"))
    assert ort.fused_attention == 1 and "com.microsoft.MultiHeadAttention" in summarize_graph(ort.path).fused_ops
    assert "1/1 attention blocks fused" in ort.describe()
    no_fuse = export_onnx(layer, tmp_path / "n.onnx", ExportSpec(fuse_qkv=False))
    ops = summarize_graph(no_fuse.path).op_counts
    assert ops["MatMul"] == summarize_graph(dec.path).op_counts["MatMul"] + 2  # 3 QKV GEMMs instead of 1
