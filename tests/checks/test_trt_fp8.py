"""check-trt's FP8 rules on hand-made graphs: saturate=0, int8 mixed with FP8, FP8 MHA head sizes, opset, architecture."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from attn_export.checks.trt_fp8 import fp8_findings, qdq_kinds
from attn_export.runtime.tensorrt.spec import TrtVersion


def _gemm(opset: int = 21, saturate: int = 1, extra_int8: bool = False) -> ir.Model:
    """x -> Q(fp8) -> DQ -> MatMul(DQ(fp8 weight)) -> y, optionally with an int8 Q/DQ on y."""
    f8 = TensorProto.FLOAT8E4M3FN
    inits = [
        numpy_helper.from_array(np.float32(0.1), "s"), helper.make_tensor("z", f8, [], [0.0]),
        helper.make_tensor("w", f8, [4, 3], [1.0] * 12), numpy_helper.from_array(np.full(3, 0.01, np.float32), "ws"),
        helper.make_tensor("wz", f8, [3], [0.0] * 3),
    ]  # fmt: skip
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q", saturate=saturate),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq"),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], name="wdq", axis=1),
        helper.make_node("MatMul", ["xd", "wd"], ["y0"], name="mm"),
    ]
    out = "y0"
    if extra_int8:
        inits += [numpy_helper.from_array(np.float32(0.1), "s8"), numpy_helper.from_array(np.int8(0), "z8")]
        nodes += [helper.make_node("QuantizeLinear", ["y0", "s8", "z8"], ["yq"]), helper.make_node("DequantizeLinear", ["yq", "s8", "z8"], ["y1"])]
        out = "y1"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2, 3])], initializer=inits)  # fmt: skip
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10))


def test_kinds_and_architecture() -> None:
    model = _gemm()
    assert qdq_kinds(model) == {"FLOAT8E4M3FN": 3}
    assert any(f.severity == "info" and "sm90" in f.message for f in fp8_findings(model, TrtVersion(10, 14), "sm90"))
    errors = [f for f in fp8_findings(model, TrtVersion(10, 3), "sm87") if f.severity == "error"]
    assert len(errors) == 1 and "no fp8" in errors[0].message and "--quantize int8" in errors[0].message
    assert [f.severity for f in fp8_findings(model, TrtVersion(10, 14), None)] == ["warning"]
    assert any(f.severity == "error" and "10.8" in f.message for f in fp8_findings(model, TrtVersion(10, 3), "sm100"))
    assert fp8_findings(ir.Model(ir.Graph([], [], nodes=[], opset_imports={"": 21}), ir_version=10), TrtVersion(10, 14), "sm90") == []


def test_saturate_zero_and_mixed_int8_warn_and_opset_18_is_an_error() -> None:
    sat = fp8_findings(_gemm(saturate=0), TrtVersion(10, 14), "sm90")
    assert any(f.severity == "warning" and f.node == "q" and "saturate=0" in f.message for f in sat)
    mixed = fp8_findings(_gemm(extra_int8=True), TrtVersion(10, 14), "sm90")
    assert any("int8 and FP8" in f.message and "strongly typed" in f.message for f in mixed)
    assert not any("int8 and FP8" in f.message for f in fp8_findings(_gemm(extra_int8=True), TrtVersion(11, 4), "sm90"))
    old = fp8_findings(_gemm(opset=18), TrtVersion(10, 14), "sm90")
    assert any(f.severity == "error" and "opset >= 19" in f.message for f in old)


def test_fp8_mha_outside_the_fused_head_sizes_warns(tmp_path) -> None:
    from fixtures import small_layer

    from attn_export.checks.trt_compat import check_trt_compat
    from attn_export.compress.calib.data import ActivationSet
    from attn_export.compress.calib.generate import synthesize_hidden_states
    from attn_export.compress.quant.fp8 import Fp8Spec, quantize_fp8_onnx
    from attn_export.export import export_onnx
    from attn_export.targets.targets import export_spec_for

    layer = small_layer("transformer", "padding", d_model=16, heads=4)  # head size 4: below FP8 fMHA's 9-256
    export_onnx(layer, tmp_path / "fp32.onnx", export_spec_for("tensorrt", "fp32", attention="decomposed"))
    x, kpm = synthesize_hidden_states(8, 16, 16, np.random.default_rng(0))
    quantize_fp8_onnx(tmp_path / "fp32.onnx", tmp_path / "bmm.onnx", ActivationSet(x, kpm), Fp8Spec(quantize_attention_bmm=True))
    found = check_trt_compat(tmp_path / "bmm.onnx", "10.14", gpu_arch="sm90")  # shapes inferred first: the head size is known
    assert found and any(f.severity == "warning" and "head size 4" in f.message and "9-256" in f.message for f in found.findings), str(found)
    quantize_fp8_onnx(tmp_path / "fp32.onnx", tmp_path / "plain.onnx", ActivationSet(x, kpm), Fp8Spec())
    assert not any("head size" in f.message for f in check_trt_compat(tmp_path / "plain.onnx", "10.14", gpu_arch="sm90").findings)
