"""int8 embedding rows (dynamic route) and QAT-lite (static route) on small models."""

from __future__ import annotations

import copy

import numpy as np
import onnx_ir as ir
import pytest
import torch

from attn_export.compress.quant.embedding_quant import EmbeddingQuantPass, quantize_rows
from attn_export.compress.qat import QatConfig, fake_quant, qat_


def _lookup_model(table: np.ndarray) -> ir.Model:
    ids = ir.Value(name="ids", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(["B", "S"]))
    tv = ir.Value(name="table", const_value=ir.tensor(table), type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(table.shape))
    gather = ir.node("Gather", [tv, ids], attributes={"axis": 0}, name="lookup")
    relu = ir.node("Relu", [gather.outputs[0]], name="after")
    relu.outputs[0].name = "y"
    relu.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    graph = ir.Graph([ids], [relu.outputs[0]], nodes=[gather, relu], initializers=[tv], opset_imports={"": 20})
    return ir.Model(graph, ir_version=10)


def _run(model: ir.Model, feed: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    data = ir.serde.serialize_model(model).SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feed)[0]


def test_embedding_rows_are_int8_with_one_scale_each():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((2000, 48)).astype(np.float32)
    table[7] *= 1e-3  # a rare token's small row keeps its own precision
    model = _lookup_model(table)
    ids = rng.integers(0, 2000, size=(3, 11)).astype(np.int64)
    ids[0, 0] = 7
    before = _run(model, {"ids": ids})
    emb = EmbeddingQuantPass(min_elements=1000)
    assert emb(model).modified and len(emb.result.tables) == 1
    after = _run(model, {"ids": ids})
    q, scale = quantize_rows(table)
    assert q.dtype == np.int8 and scale.shape == (2000, 1)
    bound = (scale[ids] / 2 + 1e-7)  # half a step of each gathered row
    assert np.all(np.abs(after - before) <= np.maximum(bound, 1e-7)), float(np.abs(after - before).max())
    assert np.abs(after[0, 0] - before[0, 0]).max() < 1e-5, "the small row is not flattened by the big ones' scale"
    table_inits = [v for v in model.graph.initializers.values() if v.const_value is not None and v.const_value.shape[0] == 2000]
    assert {v.dtype for v in table_inits} == {ir.DataType.INT8, ir.DataType.FLOAT} and min(v.const_value.shape[-1] for v in table_inits) == 1
    small = _lookup_model(table[:10])
    assert not EmbeddingQuantPass()(small).modified, "tables under the size floor stay float"


def test_fake_quant_is_the_qdq_arithmetic_and_passes_gradients():
    x = torch.linspace(-3, 3, 101, requires_grad=True)
    t = torch.tensor(2.0, requires_grad=True)
    y = fake_quant(x, t)
    s = 2.0 / 127
    expected = np.clip(np.rint(x.detach().numpy() / s), -128, 127) * s
    np.testing.assert_allclose(y.detach().numpy(), expected, atol=1e-6)
    y.sum().backward()
    assert x.grad is not None and float(x.grad[50]) == pytest.approx(1.0), "straight-through inside the range"
    assert float(x.grad[0]) == 0.0, "clipped values pass no gradient to x"
    assert t.grad is not None and float(t.grad) != 0.0, "the threshold learns through the scale"


def test_qat_lowers_the_fake_quant_error(tmp_path):
    from fixtures import D_MODEL, HEADS

    from attn_export.compress.calib.generate import synthesize_hidden_states
    from attn_export.config.run import RunConfig
    from attn_export.subjects.layer import LayerSubject

    x, kpm = synthesize_hidden_states(98, 16, D_MODEL, np.random.default_rng(0))
    np.savez(tmp_path / "acts.npz", calib_x=x[:90], calib_key_padding_mask=kpm[:90], val_x=x[90:], val_key_padding_mask=kpm[90:])
    subject = LayerSubject(RunConfig(quantize="int8", d_model=D_MODEL, heads=HEADS, calib=tmp_path / "acts.npz", out=tmp_path, batch=8))
    student = copy.deepcopy(subject.module)
    # minmax ranges waste levels on the outlier channels: the learned thresholds must win some back
    config = QatConfig(steps=60, eval_every=10, lr=1e-5, scale_lr=3e-2, method="minmax", smoothquant=False, select_items=32)
    summary = qat_(student, subject.module, subject, set(), config)
    print(summary.describe())
    assert summary.quantized_linears == 6 and summary.select_error_after < 0.97 * summary.select_error_before, summary.describe()
    assert set(summary.thresholds) >= {"layer.ffn_in", "layer.ffn_out"} and all(t > 0 for t in summary.thresholds.values())
    assert summary.thresholds["layer.self_attn.w_q"] == summary.thresholds["layer.self_attn.w_k"], "Q/K/V share their input's range"
    assert all(type(m).__name__ != "FakeQuantLinear" for m in student.modules()), "the trained model is a plain model again"
    for a, b in zip(student.layer.norm1.parameters(), subject.module.layer.norm1.parameters()):
        assert a.data_ptr() != b.data_ptr(), "the teacher is never trained"
