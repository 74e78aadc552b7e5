"""The sensitivity fallback of the dynamic int8 route (ONNX Runtime CPU), on a small reference layer.

Fault injection as for the static route (``test_mixed_precision``): one GEMM's int8 weight
scale, as ``quantize_dynamic`` wrote it, is scaled up 8x, so only that GEMM's int8 form is
wrong. The dynamic route's Q/DQ view must reproduce the quantizer's arithmetic, the ranking
must put the broken GEMM first, and the shipped model must be the quantizer's own with that
MatMul excluded, and pass.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from fixtures import small_layer_subject

from attn_export.compress.quant.dynamic_groups import dynamic_qdq_model, quantized_matmuls
from attn_export.compress.quant.gemm_groups import SwitchableGraph, find_gemms
from attn_export.compress.quant.mixed_precision import FallbackGoal, dynamic_fallback
from attn_export.compress.quant.onnx import quantize_dynamic_onnx
from attn_export.runtime import OrtRunner, SessionFromOnnx
from attn_export.subjects.layer import LayerSubject

BROKEN = "layer.ffn1"


@pytest.fixture(scope="module")
def subject(tmp_path_factory) -> LayerSubject:
    return small_layer_subject(tmp_path_factory.mktemp("dfb"))


@pytest.fixture(scope="module")
def fp32(subject, tmp_path_factory):
    path = tmp_path_factory.mktemp("dfb_fp32") / "fp32.onnx"
    subject.export(subject.module, path, subject.cfg.export_spec("fp32"))
    return path


def _runner(path) -> OrtRunner:
    return OrtRunner(SessionFromOnnx(path, providers=["cpu"], intra_op_threads=1))


def _break(all_int8, float_graph) -> str:
    """Scale the broken group's int8 weight scale by 8 in ``all_int8``; returns that MatMul's name."""
    flt = ir.load(float_graph)
    node = next(g.node for g in find_gemms(dynamic_qdq_model(flt, ir.load(all_int8))) if g.group == BROKEN)
    model = ir.load(all_int8)
    weight = quantized_matmuls(model)[node].inputs[1]
    scale = model.graph.initializers[weight.name.removesuffix("_quantized") + "_scale"]
    scale.const_value = ir.tensor(scale.const_value.numpy() * 8.0)
    ir.save(model, all_int8)
    return node


def test_the_view_reproduces_the_quantizer_and_the_float_graph(subject, fp32, tmp_path):
    """All switches on = what quantize_dynamic's MatMulInteger model computes; all off = the float graph it read."""
    seen = {}

    def keep_float(float_graph, all_int8):
        seen["float"], seen["int8"] = ir.load(float_graph), ir.load(all_int8)
        return []

    out = tmp_path / "dyn.onnx"
    quantize_dynamic_onnx(fp32, out, per_channel=True, keep_float=keep_float)
    feed = subject.feeds("select")[0]
    graph = SwitchableGraph(dynamic_qdq_model(seen["float"], seen["int8"]), seen["float"], 1, tmp_path)
    try:
        assert set(graph.groups) == {"layer.qkv", "layer.attn_out", "layer.ffn1", "layer.ffn2"}, graph.groups
        all_float, all_int8 = graph.runner(set()).infer(feed)["y"], graph.runner(set(graph.groups)).infer(feed)["y"]
    finally:
        graph.close()
    quantized, float_ref = _runner(out).infer(feed)["y"], _runner(fp32).infer(feed)["y"]
    np.testing.assert_allclose(all_float, float_ref, atol=1e-5)
    scale = float(np.abs(quantized - float_ref).max())
    assert scale > 1e-3, "int8 must differ from float, or the comparison below says nothing"
    assert float(np.abs(all_int8 - quantized).max()) < 0.05 * scale, "the view computes the quantizer's arithmetic, up to float summation"


def _quantize_with_fallback(subject, fp32, out, break_one: bool) -> tuple[object, list[str]]:
    """``quantize_dynamic_onnx`` with the auto fallback (after breaking one GEMM when asked): (its result, the broken MatMul)."""
    chosen, results = [], []

    def keep_float(float_graph, all_int8):
        if break_one:
            chosen.append(_break(all_int8, float_graph))
        nodes, result = dynamic_fallback(float_graph, all_int8, subject, "int8", FallbackGoal(), "auto", 8, 1, _runner)
        results.append(result)
        return nodes

    quantize_dynamic_onnx(fp32, out, per_channel=True, keep_float=keep_float)
    return results[0], chosen


def test_auto_keeps_the_broken_gemm_in_float_and_ships_the_quantizers_model(subject, fp32, tmp_path):
    out = tmp_path / "dyn.onnx"
    result, chosen = _quantize_with_fallback(subject, fp32, out, break_one=True)
    assert result.float_groups == [BROKEN] and result.met, result.describe()
    assert [s["met"] for s in result.steps] == [False, True], "all int8 fails, the broken group in float meets the goal, then it stops"
    assert result.gemms[0]["rank"] is not None and next(g for g in result.gemms if g["group"] == BROKEN)["rank"] == 1
    assert chosen[0] not in quantized_matmuls(ir.load(out)), "the broken MatMul is excluded from the shipped model"
    assert len(quantized_matmuls(ir.load(out))) == len(result.gemms) - 1
    judged = subject.judge(_runner(out), "report", "int8")
    assert judged.passed, judged.violations


def test_auto_ranks_nothing_when_the_all_int8_model_meets_the_goal(subject, fp32, tmp_path):
    out = tmp_path / "dyn.onnx"
    result, _ = _quantize_with_fallback(subject, fp32, out, break_one=False)
    assert result.met and result.float_groups == [] and result.gemms == [] and len(result.steps) == 1, result.to_dict()
    assert "every GEMM in int8" in result.describe()
    assert len(quantized_matmuls(ir.load(out))) == 4
