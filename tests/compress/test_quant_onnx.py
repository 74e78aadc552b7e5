"""int8 ONNX routes on the default layer (TransformerLayer 512/8, padding mask).

Static Q/DQ placement is checked on the graph (zero points, per-channel weights, float
Softmax/LayerNorm/mask Add, the TensorRT MHA pattern on request); accuracy is measured
against the eager fp32 layer on a held-out split the calibration never saw; size against
the fp32 file. Calibration data: hidden-state-like activations with a few outlier channels.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch
from fixtures import run_onnx

from attn_export.compress.calib.data import ActivationSet
from attn_export.compress.calib.generate import synthesize_hidden_states
from attn_export.compress.methods.int8_dynamic import Int8Dynamic
from attn_export.compress.methods.int8_static import Int8Static
from attn_export.compress.methods.torchao import TorchaoInt8
from attn_export.compress.quant.qdq import attention_bmms, inspect_qdq
from attn_export.compress.quant.onnx import (
    calibration_feeds,
    quantize_dynamic_onnx,
)
from attn_export.compress.quant.static import StaticQuantSpec, quantize_static_onnx
from attn_export.compress.quant.smoothquant import (
    SmoothQuantPass,
    activation_absmax,
    smoothable_groups,
)
from attn_export.config.run import RunConfig
from attn_export.errors import ConfigError, DataError
from attn_export.export import export_onnx
from attn_export.layers import MaskedLayer, build_layer
from attn_export.validate import accuracy, tolerance_for

INT8 = tolerance_for("int8")  # cosine >= 0.999, rel_l2 <= 5e-2
MAX_SIZE_RATIO = 0.30


@pytest.fixture(scope="module")
def default_layer() -> MaskedLayer:
    return MaskedLayer(build_layer("transformer", 512, 8, mask="padding"), "padding")


@pytest.fixture(scope="module")
def fp32_onnx(default_layer, tmp_path_factory) -> str:
    return export_onnx(default_layer, tmp_path_factory.mktemp("fp32") / "layer.onnx").path


@pytest.fixture(scope="module")
def splits() -> tuple[ActivationSet, ActivationSet]:
    """Disjoint calibration (24 x 64) and validation (8 x 64) sequences from one draw."""
    x, kpm = synthesize_hidden_states(32, 64, 512, np.random.default_rng(0))
    return ActivationSet(x[:24], kpm[:24]), ActivationSet(x[24:], kpm[24:])


@pytest.fixture(scope="module")
def reference(default_layer, splits) -> np.ndarray:
    val = splits[1]
    with torch.no_grad():
        return default_layer(torch.from_numpy(val.x), torch.from_numpy(val.key_padding_mask)).numpy()


@pytest.fixture(scope="module")
def static_minmax(fp32_onnx, splits, tmp_path_factory):
    return quantize_static_onnx(fp32_onnx, tmp_path_factory.mktemp("q") / "static.onnx", splits[0], StaticQuantSpec())


def _val_accuracy(path: str, splits, reference: np.ndarray):
    val = splits[1]
    return accuracy(reference, run_onnx(path, {"x": val.x, "key_padding_mask": val.key_padding_mask}))


def _dq_readers(path: str) -> dict[str, set[str]]:
    """Activation DequantizeLinear name -> op types that read it."""
    graph = ir.load(path).graph
    readers: dict[str, set[str]] = {}
    for node in graph:
        if node.op_type == "DequantizeLinear" and node.inputs[0].producer() is not None:
            readers[node.name] = {user.op_type for user, _ in node.outputs[0].uses()}
    return readers


def test_static_qdq_graph_is_symmetric_per_channel_with_float_islands(static_minmax):
    summary = inspect_qdq(static_minmax.path)
    assert summary.zero_points_all_zero, f"nonzero zero points: {summary.nonzero_zero_points}"
    assert all(q.dtype == "INT8" for q in summary.quantize_linear), [q.dtype for q in summary.quantize_linear]
    assert len(summary.weights) == 4, summary.weights  # QKV, O, FFN in, FFN out
    for w in summary.weights:
        assert w.per_channel and w.axis == 1 and w.channels == w.shape[1], w
    assert summary.n_quantize_linear == 4, summary.describe()  # one activation Q per projection input
    for name, readers in _dq_readers(static_minmax.path).items():
        assert readers == {"MatMul"}, f"{name} is read by {readers}: only projection MatMuls may read int8"
    assert len(summary.attention_bmms) == 2 and len(summary.mask_adds) == 1
    for node in summary.attention_bmms + summary.mask_adds:
        assert summary.op(node) is None, f"{node} has Q/DQ: {summary.op(node)}"
    assert summary.ops_of("Softmax") == []
    for ln in summary.ops_of("LayerNormalization"):
        assert ln.dq_inputs == (), ln  # its output's Q feeds ffn_in; the residual reads it in float
    assert all(op.dq_inputs == () for op in summary.ops_of("Add")), summary.ops_of("Add")


def test_static_qdq_attention_bmm_follows_tensorrt_mha_pattern(fp32_onnx, splits, reference, tmp_path):
    result = quantize_static_onnx(fp32_onnx, tmp_path / "bmm.onnx", splits[0], StaticQuantSpec(quantize_attention_bmm=True))
    summary = inspect_qdq(result.path)
    assert summary.zero_points_all_zero, summary.nonzero_zero_points
    qk, pv = (summary.op(name) for name in summary.attention_bmms)
    assert qk is not None and qk.dq_inputs == (0, 1) and qk.q_outputs == (), qk  # Q/DQ before BMM1 only
    assert pv is not None and pv.dq_inputs == (0, 1) and pv.q_outputs == (0,), pv  # P, V in; Q/DQ after BMM2
    (softmax,) = summary.ops_of("Softmax")
    assert softmax.dq_inputs == () and softmax.q_outputs == (0,), softmax
    assert summary.op(summary.mask_adds[0]) is None, "the mask Add must stay float"
    assert all(ln.dq_inputs == () for ln in summary.ops_of("LayerNormalization"))
    acc = _val_accuracy(result.path, splits, reference)
    print(f"static int8 with BMMs: {acc}")
    assert not INT8.violations(acc), INT8.violations(acc)


def test_attention_bmm_quantization_refuses_sequences_over_512(fp32_onnx, tmp_path):
    long = ActivationSet(np.zeros((1, 513, 512), np.float32), np.ones((1, 513), np.int32))
    with pytest.raises(ConfigError, match="512"):
        quantize_static_onnx(fp32_onnx, tmp_path / "x.onnx", long, StaticQuantSpec(quantize_attention_bmm=True))
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy"])
def test_static_calibration_methods_meet_int8_tolerance(method, fp32_onnx, splits, reference, static_minmax, tmp_path):
    result = static_minmax if method == "minmax" else quantize_static_onnx(
        fp32_onnx, tmp_path / f"{method}.onnx", splits[0], StaticQuantSpec(method=method)
    )
    acc = _val_accuracy(result.path, splits, reference)
    print(f"static int8 {method}: {acc}; {result.describe()}")
    assert not INT8.violations(acc), f"{method}: {INT8.violations(acc)}"
    assert result.size_ratio <= MAX_SIZE_RATIO, result.describe()
    assert result.calib_samples == 24 and result.calib_method == method


def test_dynamic_route_accuracy_size_and_graph(fp32_onnx, splits, reference, tmp_path):
    result = quantize_dynamic_onnx(fp32_onnx, tmp_path / "dynamic.onnx")
    acc = _val_accuracy(result.path, splits, reference)
    print(f"dynamic int8: {acc}; {result.describe()}")
    assert not INT8.violations(acc), INT8.violations(acc)
    assert result.size_ratio <= MAX_SIZE_RATIO, result.describe()
    summary = inspect_qdq(result.path)
    assert summary.n_dynamic_quantize_linear == 4, summary.describe()  # one per projection input
    assert len(summary.attention_bmms) == 2, "the attention BMMs must stay float MatMuls"


def test_smoothquant_helps_with_outlier_channels(fp32_onnx, splits, reference, static_minmax, tmp_path):
    smooth = quantize_static_onnx(fp32_onnx, tmp_path / "sq.onnx", splits[0], StaticQuantSpec(smoothquant_alpha=0.5))
    plain_acc, smooth_acc = (_val_accuracy(r.path, splits, reference) for r in (static_minmax, smooth))
    print(f"minmax rel_l2 {plain_acc.rel_l2:.4g} -> SmoothQuant {smooth_acc.rel_l2:.4g} (cosine {smooth_acc.cosine:.6f})")
    assert not INT8.violations(smooth_acc), INT8.violations(smooth_acc)
    assert smooth_acc.rel_l2 < 0.8 * plain_acc.rel_l2, "SmoothQuant should cut the error on outlier-channel data"
    summary = inspect_qdq(smooth.path)
    assert summary.zero_points_all_zero and not summary.per_tensor_weights
    assert summary.ops_of("Mul") == [] or all(m.dq_inputs == () for m in summary.ops_of("Mul")), "the smoothing Mul stays float"


def test_smoothquant_pass_preserves_the_float_function(fp32_onnx, splits):
    model = ir.load(fp32_onnx)
    feeds = calibration_feeds(fp32_onnx, splits[0], max_samples=8)
    groups = smoothable_groups(model.graph)
    assert [len(g.matmuls) for g in groups] == [1, 1, 1, 1]  # QKV (fused), O, FFN in, FFN out
    assert not {n.name for n in attention_bmms(model.graph)} & {m for g in groups for m in g.matmuls}
    absmax = activation_absmax(model, [g.activation for g in groups], feeds)
    before = run_onnx(fp32_onnx, feeds[0])
    sq = SmoothQuantPass(absmax, alpha=0.5)
    assert sq(model).modified and len(sq.smoothed) == 4
    # attention's context is smoothed inside W_v (no op); QKV, FFN in and FFN out get a Mul
    assert len(sq.folded) == 1 and sq.folded[0] == groups[1].activation, sq.folded
    assert sum(n.op_type == "Mul" and n.name.endswith("_smooth_mul") for n in model.graph) == 3
    path = str(fp32_onnx).replace(".onnx", "_smoothed.onnx")
    ir.save(model, path)
    after = run_onnx(path, feeds[0])
    err = np.abs(after - before)
    assert err.max() <= 1e-4, f"max abs {err.max():.3g} at {np.unravel_index(err.argmax(), err.shape)}"


def test_low_rank_then_static_quantizes_both_factors(tmp_path):
    from fixtures import D_MODEL, eager, small_layer

    from attn_export.compress.lowrank import LowRankConfig, low_rank_

    layer = small_layer("transformer", "padding")
    x, kpm = synthesize_hidden_states(40, 32, D_MODEL, np.random.default_rng(3))
    calib, val = ActivationSet(x[:32], kpm[:32]), ActivationSet(x[32:], kpm[32:])
    summary = low_rank_(layer, LowRankConfig(rank_ratio=0.5), calib)
    assert len(summary.ranks) == 4, summary.describe()
    fp32 = export_onnx(layer, tmp_path / "lowrank.onnx").path
    result = quantize_static_onnx(fp32, tmp_path / "lowrank_int8.onnx", calib)
    qdq = inspect_qdq(result.path)
    assert len(qdq.weights) == 2 * 4 + 2 and not qdq.per_tensor_weights, qdq.describe()  # down/up of q,k,v,o + FFN
    assert qdq.zero_points_all_zero
    feed = {"x": val.x, "key_padding_mask": val.key_padding_mask}
    acc = accuracy(eager(layer, feed), run_onnx(result.path, feed))
    print(f"low-rank + static int8 vs low-rank eager: {acc}")
    assert not INT8.violations(acc), INT8.violations(acc)


def test_calibration_feeds_default_the_mask_and_batch(fp32_onnx, splits):
    no_mask = ActivationSet(splits[0].x[:10], None)
    feeds = calibration_feeds(fp32_onnx, no_mask, max_samples=10, batch_size=4)
    assert [f["x"].shape[0] for f in feeds] == [4, 4, 2]
    assert all(f["key_padding_mask"].dtype == np.int32 and f["key_padding_mask"].all() for f in feeds)
    with pytest.raises(DataError, match="feature size 64, the model takes 512"):
        calibration_feeds(fp32_onnx, ActivationSet(np.zeros((2, 8, 64), np.float32)))


def test_inspect_qdq_reports_nonzero_zero_points_and_per_tensor_weights():
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.ones((4, 3), np.int8), "w_q"),
        numpy_helper.from_array(np.array(0.1, np.float32), "w_s"),
        numpy_helper.from_array(np.array(0, np.int8), "w_zp"),
        numpy_helper.from_array(np.array(0.05, np.float32), "x_s"),
        numpy_helper.from_array(np.array(3, np.uint8), "x_zp"),  # asymmetric: TensorRT rejects it
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_zp"], ["xq"], name="q_x"),
        helper.make_node("DequantizeLinear", ["xq", "x_s", "x_zp"], ["xd"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w"], name="dq_w"),
        helper.make_node("MatMul", ["xd", "w"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], inits,
    )  # fmt: skip
    summary = inspect_qdq(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    assert summary.nonzero_zero_points == ["q_x", "dq_x"] and not summary.zero_points_all_zero
    assert summary.per_tensor_weights == ["w_q"]
    assert summary.op("mm") is not None and summary.op("mm").dq_inputs == (0,) and summary.op("mm").dq_weights == (1,)
    assert summary.quantize_linear[0].dtype == "UINT8"


def test_each_route_says_which_targets_can_deploy_it():
    """The methods describe themselves: the plan and RunConfig read ``deploy_refusal``, never a route name."""
    from attn_export.targets.targets import get_target

    for name in ("tensorrt", "jetson"):  # the route policy refuses it, with the route's own reason
        refusal = Int8Dynamic.deploy_refusal(get_target(name))
        assert refusal == f"the {name} target's route policy ships int8 by static only; {Int8Dynamic.unlisted_why}; use --int8-mode static"
    assert Int8Dynamic.deploy_refusal(get_target("ort-cpu")) is None
    assert Int8Static.deploy_refusal(get_target("tensorrt")) is None
    assert "ONNX" in TorchaoInt8.deploy_refusal(get_target("ort-cpu"))
    with pytest.raises(ConfigError, match="int8-mode"):
        RunConfig(quantize="int8", int8_mode="fp8")
    with pytest.raises(ConfigError, match="target"):
        get_target("tpu")


def test_spec_and_input_errors_are_actionable(tmp_path, splits):
    with pytest.raises(ConfigError, match="minmax, percentile, entropy"):
        StaticQuantSpec(method="mse")
    with pytest.raises(ConfigError, match="percentile"):
        StaticQuantSpec(percentile=101.0)
    with pytest.raises(ConfigError, match="alpha"):
        StaticQuantSpec(smoothquant_alpha=1.5)
    with pytest.raises(ConfigError, match="does not exist"):
        quantize_static_onnx(tmp_path / "missing.onnx", tmp_path / "q.onnx", splits[0])
    with pytest.raises(ConfigError, match="does not exist"):
        quantize_dynamic_onnx(tmp_path / "missing.onnx", tmp_path / "q.onnx")


def test_fp16_export_is_refused_with_a_hint(tmp_path):
    from fixtures import small_layer

    from attn_export.export import ExportSpec

    fp16 = export_onnx(small_layer("transformer", "padding"), tmp_path / "fp16.onnx", ExportSpec(precision="fp16")).path
    with pytest.raises(ConfigError, match="--precision fp32"):
        quantize_dynamic_onnx(fp16, tmp_path / "q.onnx")
