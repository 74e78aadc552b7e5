"""The example method of docs/architecture.md: int8 weight-only for ONNX Runtime (MatMulNBits, 8 bits).

Checked: the plan builds it only when asked (``--int8-mode weight-only``) and never for
TensorRT; the graph it writes (every projection a MatMulNBits, activations float, about a
quarter of the fp32 file); its accuracy on unseen sequences against eager fp32 with the int8
bar; and that the shipped selection takes it when it is the only candidate.
"""

from __future__ import annotations

import onnx
import pytest
from fixtures import small_layer_subject

from attn_export.compress.methods.int8_weight_only import Int8WeightOnly
from attn_export.compress.registry import BuildContext, Source, apply, route_names
from attn_export.config.run import RunConfig
from attn_export.errors import ConfigError
from attn_export.targets.targets import export_spec_for, get_target
from attn_export.pipeline.plan import make_plan


def test_planned_only_when_asked_and_never_for_tensorrt(tmp_path):
    assert "weight-only" in route_names("int8")
    default = make_plan(RunConfig(quantize="int8", out=tmp_path))
    assert not any(isinstance(s.config, Int8WeightOnly) for s in default.steps), "opt-in: auto keeps to the routes that usually win"
    asked = make_plan(RunConfig(quantize="int8", int8_mode="weight-only", out=tmp_path))
    (step,) = [s for s in asked.steps if isinstance(s.config, Int8WeightOnly)]
    assert step.name == "int8-weight-only" and step.filename == "model.int8-weight-only.onnx" and step.source == "onnx-fp32"
    assert asked.selections[0].candidates == ("int8-weight-only",) and "weight-only" in asked.selections[0].preference
    with pytest.raises(ConfigError, match="--int8-mode weight-only cannot target tensorrt: .*MatMulNBits"):
        RunConfig(quantize="int8", int8_mode="weight-only", target="tensorrt", out=tmp_path)
    with pytest.raises(ConfigError, match="power of two"):
        Int8WeightOnly(block_size=96)


def test_graph_size_and_accuracy_on_unseen_sequences(tmp_path):
    subject = small_layer_subject(tmp_path)
    spec = export_spec_for("ort-cpu", "fp32")
    ctx = BuildContext(subject, tmp_path, get_target("ort-cpu"), spec, 1)
    fp32 = tmp_path / "model.onnx"
    subject.export(subject.module, fp32, spec)
    source = ctx.onnx_artifact("onnx-fp32", fp32, "fp32", "fp32", module=subject.module, onnx_fp32=fp32)
    art = apply(Source(source, "int8-weight-only", tmp_path / "model.int8-weight-only.onnx", ctx), Int8WeightOnly(block_size=32))
    ops = [n.op_type for n in onnx.load(str(art.path)).graph.node]
    assert ops.count("MatMulNBits") == art.details["quantization"]["matmuls"] >= 4, ops  # QKV, O, FFN1, FFN2 (the attention BMMs stay MatMul)
    assert "QuantizeLinear" not in ops and "DynamicQuantizeLinear" not in ops, "activations stay float"
    assert art.details["size_ratio_vs_fp32"] < 0.45, art.details  # a 64-wide layer: the int8 weights plus 4-byte scales per 32
    assert art.route == "weight-only" and art.tolerance_key == "int8"
    judged = subject.judge(art.make_runner(), "report", art.tolerance_key)
    assert judged.passed and judged.accuracy.cosine >= 0.9999, judged.headline()  # only the weights are rounded
