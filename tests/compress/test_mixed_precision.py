"""Accuracy-driven mixed precision of the static Q/DQ route, on a small reference layer.

Fault injection: one GEMM's int8 weight scale is scaled up 8x, so only its int8 form is
wrong. The sensitivity ranking must put it first, the automatic fallback must keep exactly
it in float and stop there, and the result must still follow TensorRT's Q/DQ rules.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from fixtures import small_layer_subject

from attn_export.checks.trt_compat import check_trt_compat
from attn_export.compress.quant.gemm_groups import SwitchableGraph, apply_fallback, find_gemms
from attn_export.compress.quant.mixed_precision import FallbackGoal, fallback_search, sensitivity
from attn_export.compress.quant.qdq import inspect_qdq
from attn_export.compress.quant.static import StaticQuantSpec, quantize_static_onnx
from attn_export.subjects.layer import LayerSubject

BROKEN = "layer.ffn1"  # the group whose int8 weight scale the tests break


@pytest.fixture(scope="module")
def subject(tmp_path_factory) -> LayerSubject:
    """A 64-wide TransformerLayer with 30 calibration (24 train / 6 select) and 8 report sequences."""
    return small_layer_subject(tmp_path_factory.mktemp("mp"))


@pytest.fixture(scope="module")
def quantized(subject, tmp_path_factory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("mpq")
    fp32 = tmp / "fp32.onnx"
    subject.export(subject.module, fp32, subject.cfg.export_spec("fp32"))
    qdq, flt = tmp / "qdq.onnx", tmp / "float.onnx"
    quantize_static_onnx(fp32, qdq, subject.calibration(), StaticQuantSpec(), float_model_out=flt)
    broken = ir.load(qdq)
    gemm = next(g for g in find_gemms(broken) if g.group == BROKEN)
    node = next(n for n in broken.graph if n.name == gemm.node)
    scale = node.inputs[1].producer().inputs[1]  # the weight DequantizeLinear's per-channel scale
    scale.const_value = ir.tensor(scale.const_value.numpy() * 8.0)
    ir.save(broken, tmp / "broken.onnx")
    return {"tmp": tmp, "fp32": fp32, "qdq": qdq, "float": flt, "broken": tmp / "broken.onnx"}


def _switchable(quantized: dict[str, object], which: str) -> SwitchableGraph:
    return SwitchableGraph(ir.load(quantized[which]), ir.load(quantized["float"]), 1, quantized["tmp"])


def test_gemm_inventory_groups_the_issue_units(quantized):
    groups = {g.group: g.label for g in find_gemms(ir.load(quantized["qdq"]))}
    assert set(groups) == {"layer.qkv", "layer.attn_out", "layer.ffn1", "layer.ffn2"}, groups
    assert groups["layer.ffn1"] == "layer.ffn_in" and groups["layer.attn_out"] == "layer.self_attn.w_o"


def test_switchable_graph_reproduces_both_ends(subject, quantized):
    """All switches on = the Q/DQ graph (reference arithmetic); all off = the float graph."""
    from fixtures import run_onnx

    graph = _switchable(quantized, "qdq")
    feed = subject.feeds("select")[0]
    try:
        np.testing.assert_allclose(graph.runner(set()).infer(feed)["y"], run_onnx(quantized["fp32"], feed), atol=1e-5)
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.add_session_config_entry("session.disable_quant_qdq", "1")
        ref = ort.InferenceSession(str(quantized["qdq"]), so, providers=["CPUExecutionProvider"]).run(None, feed)[0]
        np.testing.assert_allclose(graph.runner(set(graph.groups)).infer(feed)["y"], ref, atol=1e-5)
    finally:
        graph.close()


def test_sensitivity_ranks_the_broken_gemm_first(subject, quantized):
    graph = _switchable(quantized, "broken")
    try:
        ranking = sensitivity(subject, graph, limit=8)
    finally:
        graph.close()
    print([(r.group, f"{r.error:.3g}") for r in ranking])
    assert ranking[0].group == BROKEN, ranking
    assert ranking[0].error > 5 * ranking[1].error, "the broken GEMM must stand out, not merely lead"
    assert [r.group for r in ranking].count(BROKEN) == 1 and len(ranking) == 4


def test_fallback_stops_as_soon_as_the_tolerance_is_met(subject, quantized):
    graph = _switchable(quantized, "broken")
    try:
        ranking = [r.group for r in sensitivity(subject, graph, limit=8)]
        chosen, steps = fallback_search(subject, graph, ranking, "int8", FallbackGoal(), "auto")
        fixed_n, steps_n = fallback_search(subject, graph, ranking, "int8", FallbackGoal(), 2)
    finally:
        graph.close()
    assert chosen == [BROKEN], chosen
    assert [s.met for s in steps] == [False, True], "one judgement fails (all int8), the next meets it, then it stops"
    assert steps[0].shortfall, "the failing step says why"
    assert fixed_n == ranking[:2] and len(steps_n) == 1, "--int8-fallback N keeps exactly the N most sensitive groups"


def test_fallback_result_keeps_tensorrt_rules(subject, quantized):
    out = quantized["tmp"] / "mixed.onnx"
    moved = apply_fallback(quantized["broken"], ir.load(quantized["float"]), [BROKEN], out)
    assert moved == 1
    summary = inspect_qdq(out)
    ffn1 = next(g for g in find_gemms(ir.load(quantized["qdq"])) if g.group == BROKEN)
    assert summary.op(ffn1.node) is None, "the fallback GEMM reads float input and float weight"
    assert len(summary.weights) == 3 and not summary.per_tensor_weights and summary.zero_points_all_zero
    assert not any(summary.op(n) for n in summary.mask_adds), "the mask Add stays float"
    for version in ("10.3", "10.14"):
        report = check_trt_compat(out, version, precision="int8")
        assert report, f"TensorRT {version}: {report}"
    from attn_export.runtime import OrtRunner, SessionFromOnnx

    judged = subject.judge(OrtRunner(SessionFromOnnx(out, providers=["cpu"], intra_op_threads=1, qdq_fusion=False)), "report", "int8")
    assert judged.passed, judged.violations
