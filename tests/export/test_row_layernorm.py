"""The ONNX Runtime CPU export runs residual Add + LayerNorm on 2-D rows: no SkipLayerNormalization in a plain session.

ONNX Runtime 1.32's fused SkipLayerNormalization CPU kernel measured ~5x slower than the ops it
replaces, and a user opens the shipped file in a plain ``InferenceSession``. Checked: the
``ort-cpu`` export carries the rewrite and a plain session fuses nothing into
SkipLayerNormalization, while the same graph without it does get the fusion (so the check can
fail); outputs equal eager to the fp32 bar; TensorRT graphs are left as exported.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fixtures import eager, feed_for, small_layer

from attn_export.export import export_onnx
from attn_export.targets.targets import export_spec_for


def _plain_session_ops(path, tmp_path) -> list[str]:
    so = ort.SessionOptions()  # what a user opens: nothing disabled
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]


@pytest.mark.parametrize("mask", ["padding", "none"])
def test_ort_cpu_export_is_not_fused_into_skip_layer_norm(tmp_path, mask):
    layer = small_layer(mask=mask)
    spec = export_spec_for("ort-cpu", "fp32")
    assert spec.layernorm_rows
    result = export_onnx(layer, tmp_path / "rows.onnx", spec)
    assert result.layernorm_rows == 2, result.describe()  # the two post-norm residuals
    ops = _plain_session_ops(tmp_path / "rows.onnx", tmp_path)
    assert "SkipLayerNormalization" not in ops and ops.count("LayerNormalization") == 2, ops
    export_onnx(layer, tmp_path / "plain.onnx", dataclasses.replace(spec, layernorm_rows=False))
    assert _plain_session_ops(tmp_path / "plain.onnx", tmp_path).count("SkipLayerNormalization") >= 1, "without the rewrite ORT fuses (the check can fail)"
    feed = feed_for(layer, 3, 11)
    got = ort.InferenceSession(str(tmp_path / "rows.onnx"), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_allclose(got, eager(layer, feed), rtol=0, atol=1e-4)


def test_tensorrt_graphs_are_left_as_exported(tmp_path):
    spec = export_spec_for("tensorrt", "fp32")
    assert not spec.layernorm_rows
    assert export_onnx(small_layer(mask="padding"), tmp_path / "trt.onnx", spec).layernorm_rows == 0


def test_gemm_labels_survive_the_quantizers_preprocessing(tmp_path):
    """ORT's pre-processing fuses the rows' MatMul + Add into Gemm and drops the torch name scope; the labels come back."""
    import onnx_ir as ir

    from attn_export.compress.calib.data import ActivationSet
    from attn_export.compress.calib.generate import synthesize_hidden_states
    from attn_export.compress.quant.gemm_groups import find_gemms
    from attn_export.compress.quant.onnx import preprocess_for_quantization
    from attn_export.compress.quant.static import StaticQuantSpec, quantize_static_onnx

    layer = small_layer(mask="padding")
    export_onnx(layer, tmp_path / "rows.onnx", export_spec_for("ort-cpu", "fp32"))
    preprocess_for_quantization(tmp_path / "rows.onnx", tmp_path / "pre.onnx")
    scoped = [n for n in ir.load(tmp_path / "pre.onnx").graph if n.op_type == "MatMul" and n.inputs[1] is not None and n.inputs[1].const_value is not None]
    assert scoped and all("pkg.torch.onnx.name_scopes" in n.metadata_props for n in scoped), [n.name for n in scoped]
    x, kpm = synthesize_hidden_states(8, 16, 64, np.random.default_rng(0))
    quantize_static_onnx(tmp_path / "rows.onnx", tmp_path / "q.onnx", ActivationSet(x, kpm), StaticQuantSpec())
    groups = {g.group for g in find_gemms(ir.load(tmp_path / "q.onnx"))}
    assert groups == {"layer.qkv", "layer.attn_out", "layer.ffn1", "layer.ffn2"}, groups
