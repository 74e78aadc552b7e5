"""The per-token int8 route (``compress.quant.per_token``): one activation range per row, so a sequence's outputs
do not depend on its batch mates, on a small reference layer run by ONNX Runtime's real kernels.

The dynamic route beside it is the control: its one range per tensor per batch makes the same
sequence come out differently alone and in a batch, which is what the per-token rewrite removes.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from fixtures import D_MODEL, small_layer_subject

from attn_export.compress.quant.dynamic_groups import dynamic_qdq_model
from attn_export.compress.quant.gemm_groups import SwitchableGraph
from attn_export.compress.quant.onnx import quantize_dynamic_onnx
from attn_export.compress.quant.per_token import per_token_pass

BAR = 0.99999  # issue 40's batch-invariance bar: min cosine, each sequence alone vs inside a batch


@pytest.fixture(scope="module")
def subject(tmp_path_factory):
    return small_layer_subject(tmp_path_factory.mktemp("ptok"))


@pytest.fixture(scope="module")
def models(subject, tmp_path_factory):
    """(fp32, dynamic, per-token) ONNX files of the same layer."""
    tmp = tmp_path_factory.mktemp("ptok_models")
    fp32 = tmp / "fp32.onnx"
    subject.export(subject.module, fp32, subject.cfg.export_spec("fp32"))
    quantize_dynamic_onnx(fp32, tmp / "dyn.onnx", per_channel=True)
    result = quantize_dynamic_onnx(fp32, tmp / "ptok.onnx", per_channel=True, per_token=True)
    assert result.route == "per-token" and result.per_token["gemms"] == 4, result.per_token  # qkv, out, ffn1, ffn2
    return fp32, tmp / "dyn.onnx", tmp / "ptok.onnx"


def _sequences(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """Hidden states whose sequences differ in scale by 30x, as real texts' activations do (a batch mate with
    wide activations is what moves a per-tensor range); the last third padded after 10 tokens."""
    from attn_export.compress.calib.generate import synthesize_hidden_states

    x, kpm = synthesize_hidden_states(n, 16, D_MODEL, np.random.default_rng(1))
    x = x * np.geomspace(0.3, 9.0, n, dtype=np.float32)[np.random.default_rng(2).permutation(n), None, None]
    kpm = np.ones_like(kpm)
    kpm[2 * n // 3 :, 10:] = 0
    return x.astype(np.float32), kpm


def _session(path, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.graph_optimization_level = 1, level
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _run(sess: ort.InferenceSession, x: np.ndarray, kpm: np.ndarray, order: np.ndarray, batch: int) -> np.ndarray:
    """Outputs of every sequence, run in batches of ``batch`` taken in ``order``, returned in file order (N, L*D)."""
    names = [i.name for i in sess.get_inputs()]
    out = np.empty((len(x), x.shape[1] * x.shape[2]), np.float32)
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        feed = dict(zip(names, (x[idx], kpm[idx].astype(np.int32 if "int32" in sess.get_inputs()[-1].type else np.int64))))
        y = sess.run(None, feed)[0]
        out[idx] = (y * kpm[idx][..., None]).reshape(len(idx), -1)  # padded rows are not outputs anyone reads
    return out


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _worst_invariance(path) -> float:
    """Min cosine of each sequence alone vs in batches of 8 and 32, file order and shuffled."""
    sess, (x, kpm) = _session(path), _sequences()
    alone = _run(sess, x, kpm, np.arange(len(x)), 1)
    shuffled = np.random.default_rng(3).permutation(len(x))
    return min(float(_cos(alone, _run(sess, x, kpm, order, b)).min()) for b in (8, 32) for order in (np.arange(len(x)), shuffled))


def test_per_token_gives_a_sequence_the_same_outputs_in_any_batch_and_the_dynamic_route_does_not(models):
    _, dynamic, per_token = models
    assert _worst_invariance(per_token) >= BAR
    assert _worst_invariance(dynamic) < BAR, "the control: per-tensor ranges per batch move a sequence with its batch mates"


def test_per_token_is_more_accurate_than_the_dynamic_route(models):
    fp32, dynamic, per_token = models
    x, kpm = _sequences()
    order = np.arange(len(x))
    ref = _run(_session(fp32), x, kpm, order, 8)
    acc = {p.name: float(_cos(_run(_session(p), x, kpm, order, 8), ref).min()) for p in (dynamic, per_token)}
    assert acc["ptok.onnx"] >= 0.998 and acc["ptok.onnx"] > acc["dyn.onnx"], acc  # measured 0.99835 vs 0.99486


def test_onnx_runtimes_fusions_leave_the_per_token_arithmetic_alone(models):
    """ORT's MatMulIntegerToFloatFusion reads a fused scale as a scalar: the pass must leave it nothing to fuse, so
    the fully optimized session computes what the unoptimized one does."""
    _, _, per_token = models
    x, kpm = _sequences(8)
    order = np.arange(len(x))
    full = _run(_session(per_token), x, kpm, order, 8)
    plain = _run(_session(per_token, ort.GraphOptimizationLevel.ORT_DISABLE_ALL), x, kpm, order, 8)
    np.testing.assert_allclose(full, plain, atol=1e-5)
    ops = {n.op_type for n in onnx.load(str(per_token)).graph.node}
    assert "DynamicQuantizeLinear" not in ops and "MatMulInteger" not in ops and "MatMulIntegerToFloat" in ops, ops


def test_the_pass_computes_per_row_int8_exactly():
    """One MatMul, against numpy's integer arithmetic: row scale max|x|/127, per-column int8 weight."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 24)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 24])],
                              [onnx.numpy_helper.from_array(w, "w")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    import tempfile
    from pathlib import Path

    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, Path(tmp) / "f.onnx")
        quantize_dynamic(str(Path(tmp) / "f.onnx"), str(Path(tmp) / "d.onnx"), per_channel=True, weight_type=QuantType.QInt8)
        ir_model = ir.load(Path(tmp) / "d.onnx")
        summary = per_token_pass(ir_model)
        ir.save(ir_model, Path(tmp) / "p.onnx")
        sess = _session(Path(tmp) / "p.onnx")
    assert summary.gemms == 1 and summary.names == ["mm"]
    x = rng.standard_normal((5, 32)).astype(np.float32) * np.array([[0.01], [1], [30], [0], [2]], np.float32)
    y = sess.run(None, {"x": x})[0]
    sw = np.abs(w).max(0) / 127
    wq = np.clip(np.round(w / sw), -127, 127)
    sa = np.maximum(np.abs(x).max(1, keepdims=True), 1e-12) / 127
    xq = np.clip(np.round(x * (127 / np.maximum(np.abs(x).max(1, keepdims=True), 1e-12))), -127, 127)
    np.testing.assert_allclose(y, (xq @ wq) * sa * sw, rtol=1e-5, atol=1e-6)
    assert not y[3].any(), "an all-zero row (padding) stays exactly zero"


def test_the_fallbacks_view_of_the_route_reproduces_it(subject, models, tmp_path):
    """All switches on = the per-token model; all off = the float graph: the fallback ranks what ships."""
    fp32, _, _ = models
    seen = {}

    def keep_float(float_graph, all_int8):
        seen["float"], seen["int8"] = ir.load(float_graph), ir.load(all_int8)
        return []

    out = tmp_path / "ptok.onnx"
    quantize_dynamic_onnx(fp32, out, per_channel=True, keep_float=keep_float, per_token=True)
    x, kpm = _sequences(8)
    graph = SwitchableGraph(dynamic_qdq_model(seen["float"], seen["int8"], per_token=True), seen["float"], 1, tmp_path)
    try:
        assert set(graph.groups) == {"layer.qkv", "layer.attn_out", "layer.ffn1", "layer.ffn2"}, graph.groups
        feed = {"x": x, "key_padding_mask": kpm.astype(np.int64)}
        names = [i.name for i in _session(out).get_inputs()]
        feed = dict(zip(names, (x, kpm.astype(np.int32 if "int32" in _session(out).get_inputs()[-1].type else np.int64))))
        all_float, all_int8 = graph.runner(set()).infer(feed), graph.runner(set(graph.groups)).infer(feed)
    finally:
        graph.close()
    key = next(iter(all_int8))
    shipped, float_ref = _session(out).run(None, feed)[0], _session(fp32).run(None, feed)[0]
    keep = kpm[..., None].astype(bool)
    np.testing.assert_allclose(all_float[key] * keep, float_ref * keep, atol=1e-5)
    scale = float(np.abs((shipped - float_ref) * keep).max())
    assert scale > 1e-4, "int8 must differ from float, or the comparison below says nothing"
    assert float(np.abs((all_int8[key] - shipped) * keep).max()) < 0.05 * scale, "the view computes the route's arithmetic"


_QEMU_SCRIPT = """
import sys, numpy as np, onnxruntime as ort
data = np.load("data.npz", allow_pickle=False)
for model in ("full.onnx", "reduced.onnx"):
    for prec in ("0", "1"):
        so = ort.SessionOptions(); so.add_session_config_entry("session.x64quantprecision", prec)
        y = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"x": data["x"]})[0]
        expected = data["expected_" + model.split(".")[0]]
        print(model, prec, float(np.abs(y - expected).max() / np.abs(expected).max()))
"""


def _one_matmul(tmp, w: np.ndarray, reduce_range: bool) -> tuple[np.ndarray, np.ndarray]:
    """A per-token model of ``x @ w`` written to ``tmp/(full|reduced).onnx``: (its int8 weight, its weight scale)."""
    from onnx import TensorProto, helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", w.shape[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", w.shape[1]])],
                              [onnx.numpy_helper.from_array(w, "w")])  # fmt: skip
    name = "reduced" if reduce_range else "full"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp / "f.onnx")
    quantize_dynamic(str(tmp / "f.onnx"), str(tmp / "d.onnx"), per_channel=True, reduce_range=reduce_range, weight_type=QuantType.QInt8)
    model = ir.load(tmp / "d.onnx")
    per_token_pass(model)
    proto = ir.serde.serialize_model(model)
    proto.ir_version = min(proto.ir_version, 10)
    onnx.save(proto, tmp / f"{name}.onnx")
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    return inits["w_quantized"].astype(np.int64), inits["w_scale"].astype(np.float64)


@pytest.mark.skipif(__import__("shutil").which("qemu-x86_64") is None, reason="qemu-user is not installed (apt-get install qemu-user)")
def test_per_token_on_avx2_is_exact_with_the_encodings_the_project_picks_there(tmp_path):
    """ONNX Runtime's real AVX2 kernels (qemu -cpu Haswell: no VNNI). Full-range weights saturate the U8S8 kernel's int16
    pair sums there, as on the dynamic route; the two encodings ``int8_encoding`` picks for such CPUs (the U8U8 session
    option, or 7-bit reduce-range weights) are exact for the per-token route's MatMulIntegerToFloat too."""
    import os
    import subprocess
    import sys

    rng = np.random.default_rng(0)
    w = (rng.uniform(0.8, 1.0, (64, 16)) * np.where(rng.random((64, 16)) < 0.5, 1, -1)).astype(np.float32)
    x = rng.uniform(0.9, 1.0, (8, 64)).astype(np.float32)  # every byte near 255 once shifted by the zero point 128
    expected = {}
    for reduce_range in (False, True):
        wq, sw = _one_matmul(tmp_path, w, reduce_range)
        row = np.maximum(np.abs(x).max(1, keepdims=True), 1e-12).astype(np.float32)
        xq = np.clip(np.round(x * (np.float32(127) / row)), -127, 127).astype(np.int64)
        expected["expected_" + ("reduced" if reduce_range else "full")] = ((xq @ wq) * sw * (row / 127)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=x, **expected)
    (tmp_path / "probe.py").write_text(_QEMU_SCRIPT)
    proc = subprocess.run(["qemu-x86_64", "-cpu", "Haswell", os.path.realpath(sys.executable), "probe.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.skip(f"qemu could not run Python here: {proc.stderr.strip().splitlines()[-1:] if proc.stderr else proc.returncode}")
    err = {tuple(line.split()[:2]): float(line.split()[2]) for line in proc.stdout.strip().splitlines()}
    assert err[("full.onnx", "0")] > 1e-3, proc.stdout  # U8S8 on AVX2: saturated sums (the control)
    assert err[("full.onnx", "1")] < 1e-5, proc.stdout  # session.x64quantprecision=1 (what auto picks on AVX2): exact
    assert err[("reduced.onnx", "0")] < 1e-5 and err[("reduced.onnx", "1")] < 1e-5, proc.stdout  # 7-bit weights: exact


def test_the_route_is_built_by_default_on_onnx_runtime_cpu_in_place_of_dynamic_and_refused_by_name_on_tensorrt():
    from attn_export.compress.methods.int8_dynamic import Int8Dynamic, Int8PerToken
    from attn_export.config.run import RunConfig
    from attn_export.errors import ConfigError
    from attn_export.pipeline.plan import make_plan

    asked = {s.name: s.config for s in make_plan(RunConfig(quantize="int8", int8_mode="per-token")).steps}
    assert list(asked) == ["onnx-fp32", "int8-per-token"] and isinstance(asked["int8-per-token"], Int8PerToken)
    auto = make_plan(RunConfig(quantize="int8"))
    assert [s.name for s in auto.steps] == ["onnx-fp32", "int8-static", "int8-per-token"], "auto: per-token, not dynamic"
    assert auto.selections[-1].preference[0] == "per-token"
    dynamic = {s.name: s.config for s in make_plan(RunConfig(quantize="int8", int8_mode="dynamic")).steps}
    assert type(dynamic["int8-dynamic"]) is Int8Dynamic, "dynamic stays, opt-in"
    with pytest.raises(ConfigError, match="per-token.*MatMulIntegerToFloat|MatMulIntegerToFloat.*per-token|route policy"):
        make_plan(RunConfig(quantize="int8", int8_mode="per-token", target="tensorrt"))
