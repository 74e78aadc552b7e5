"""The engine step attests what it built: the plan's GEMMs read from the ONNX, the build's attestation through the
strict doubles, and the run failing in one line per violation unless ``--accept-engine-mismatch`` records it."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from trt_fakes import World, install

from attn_export.pipeline.deploy import ACCEPT_MISMATCH_FLAG, _attestation, planned_gemms
from attn_export.runtime.tensorrt.attest import Attestation, EngineExpectation, PlannedGemm, attest_engine
from attn_export.runtime.tensorrt.build import build_engine
from attn_export.runtime.tensorrt.spec import EngineSpec
from attn_export.validate.report import Report

INSPECTOR = Path(__file__).resolve().parents[1] / "fixtures" / "trt" / "inspector"
EXPECT = EngineExpectation.from_dict(json.loads((INSPECTOR / "expectation.json").read_text()))


def _scoped(node: onnx.NodeProto, module: str) -> onnx.NodeProto:
    node.metadata_props.add(key="pkg.torch.onnx.name_scopes", value=f"['', '{module}', 'linear']")  # as torch.onnx names them
    return node


def _graph(path: Path, quantized: bool) -> Path:
    """x (2, 8) -> ffn_in (int8 Q/DQ or float) -> ffn_out (float) -> x @ x^T (an activation GEMM, not the plan's)."""
    w = np.ones((8, 8), np.float32)
    inits = [numpy_helper.from_array(w, "w_out"), numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.int8(0), "z")]
    nodes = []
    if quantized:
        inits += [numpy_helper.from_array(np.ones((8, 8), np.int8), "w_in_q")]
        nodes += [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"), helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xdq"], name="dq"),
                  helper.make_node("DequantizeLinear", ["w_in_q", "s", "z"], ["w_in"], name="wdq")]  # fmt: skip
        first = "xdq"
    else:
        inits += [numpy_helper.from_array(w, "w_in")]
        first = "x"
    nodes += [_scoped(helper.make_node("MatMul", [first, "w_in"], ["h"], name="mm_in"), "layers.0.ffn_in"),
              _scoped(helper.make_node("MatMul", ["h", "w_out"], ["y"], name="mm_out"), "layers.0.ffn_out"),
              helper.make_node("Transpose", ["y"], ["yt"], name="t"), helper.make_node("MatMul", ["y", "yt"], ["out"], name="bmm")]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 2])], inits)  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    return path


def test_planned_gemms_are_the_constant_weight_gemms_in_their_groups(tmp_path: Path) -> None:
    assert planned_gemms(_graph(tmp_path / "q.onnx", True), "int8") == (
        PlannedGemm("mm_in", "layers.0.ffn1", "int8"), PlannedGemm("mm_out", "layers.0.ffn2", "float"))  # fmt: skip
    assert [g.precision for g in planned_gemms(_graph(tmp_path / "f.onnx", False), "fp16")] == ["float", "float"]


@pytest.mark.parametrize(("version", "precision", "floats"), [("10.3.0", "fp16", "fp16"), ("11.4.0.106", "fp32", "fp32")])
def test_build_engine_attests_the_engine_it_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, precision: str, floats: str) -> None:
    install(monkeypatch, version, World(inspector=json.loads((INSPECTOR / "one_gemm_fp32.json").read_text())))
    result = build_engine(_graph(tmp_path / "m.onnx", False), tmp_path / "m.engine", EngineSpec(precision=precision), gemms=EXPECT.gemms)
    att = Attestation.from_dict(result.attestation)
    assert att.violations == ["GEMM group layers.1.ffn2: int8 requested, engine layer '/layers_1/ffn_out/MatMul_myl0_15' runs fp32"]
    assert att.violations[0] in result.warnings and att.layers_by_precision["fp32"] == 1
    float_plan = tuple(PlannedGemm(g.node, g.group, "float") for g in EXPECT.gemms)  # resolved to what this build runs floats in:
    spec = EngineSpec(precision=precision)  # fp16 under 10.3's weakly typed FP16 flag, the fp32 graph's own type on 11.4
    resolved = Attestation.from_dict(build_engine(tmp_path / "m.onnx", tmp_path / "m2.engine", spec, gemms=float_plan).attestation)
    assert {g.requested for g in resolved.groups} == {floats}
    assert bool(resolved) is (floats == "fp32")  # the FP32 GEMM fails an fp16 request, never an fp32 one


def _result(fixture: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(attestation=attest_engine(json.loads((INSPECTOR / fixture).read_text()), EXPECT).to_dict())


def test_a_violation_fails_the_run_in_one_line_naming_the_layer() -> None:
    report = Report(model={})
    recorded = _attestation(_result("one_gemm_fp32.json"), False, "trt-int8", report)
    assert report.verdict["failures"] == ["trt-int8 attestation: GEMM group layers.1.ffn2: int8 requested, engine layer "
                                          "'/layers_1/ffn_out/MatMul_myl0_15' runs fp32 (--accept-engine-mismatch keeps it)"]  # fmt: skip
    assert recorded["allowed_by"] is None


def test_the_override_is_recorded_in_the_report() -> None:
    report = Report(model={})
    recorded = _attestation(_result("attention_unfused.json"), True, "trt-int8", report)
    assert "failures" not in report.verdict and report.verdict["accept_engine_mismatch"] is True
    assert recorded["allowed_by"] == ACCEPT_MISMATCH_FLAG and report.notes[0].startswith("trt-int8 attestation: attention not fused")
    assert _attestation(_result("all_int8.json"), True, "trt-int8", Report(model={}))["violations"] == []
