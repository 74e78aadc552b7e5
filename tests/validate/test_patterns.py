"""check_attention_patterns: eager vs exported softmax maps per head, and the report's auto maps."""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest
from fixtures import D_MODEL, feed_for, small_layer

from attn_export.export import ExportSpec, export_onnx
from attn_export.validate.patterns import (
    attention_maps,
    check_attention_patterns,
    expose_softmax_outputs,
)
from attn_export.validate.render import write_reports


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("maps")
    layer = small_layer("transformer", "padding")
    export_onnx(layer, d / "model.onnx", ExportSpec())
    export_onnx(layer, d / "contrib.onnx", ExportSpec(attention="ort-contrib"))
    model = ir.load(d / "model.onnx")
    qkv = next(v for v in model.graph.initializers.values() if v.const_value.shape == (D_MODEL, 3 * D_MODEL))
    arr = qkv.const_value.numpy().copy()
    arr[5, :D_MODEL] += 0.5  # corrupt the query projection of one input feature
    qkv.const_value = ir.tensor(arr, name=qkv.name)
    ir.save(model, d / "bad_q.onnx")
    return layer, d


def test_exact_export_maps_match_per_head(exported):
    layer, d = exported
    feed = feed_for(layer, 2, 8, fully_masked_row=1)
    res = check_attention_patterns(layer, feed["x"], d / "model.onnx", feed["key_padding_mask"])
    assert res, str(res)
    assert res.source == "artifact" and len(res.max_abs_per_head) == 4
    assert res.eager_maps.shape == (2, 4, 8, 8)
    assert np.allclose(res.eager_maps[0].sum(-1), 1.0, atol=1e-5)  # unpadded sequence: rows sum to 1
    assert min(res.cosine_per_head) > 0.999999


def test_fused_artifact_falls_back_to_a_decomposed_export(exported):
    layer, d = exported
    feed = feed_for(layer, 1, 8)
    eager, onnx = attention_maps(layer, feed["x"], d / "contrib.onnx", feed["key_padding_mask"])
    assert eager.shape == onnx.shape == (1, 4, 8, 8)
    res = check_attention_patterns(layer, feed["x"], d / "contrib.onnx", feed["key_padding_mask"])
    assert res and res.source.startswith("decomposed re-export")
    assert expose_softmax_outputs(d / "contrib.onnx", d / "copy.onnx") == []


def test_corrupted_query_projection_is_caught(exported):
    layer, d = exported
    feed = feed_for(layer, 2, 8)
    res = check_attention_patterns(layer, feed["x"], d / "bad_q.onnx", feed["key_padding_mask"])
    assert not res
    assert "FAIL" in str(res) and max(res.max_abs_per_head) > 1e-3


def test_report_rebuilds_the_layer_for_attention_maps(exported, tmp_path):
    _, d = exported
    report = {
        "model": {"layer": "transformer", "d_model": D_MODEL, "heads": 4, "mask": "padding"},
        "inputs": {"batch": 2, "seq_len": 16, "seed": 0},
        "stages": [{"name": "onnx-fp32", "precision": "fp32", "artifact": "elsewhere/model.onnx",
                    "accuracy": {"cosine": 1.0, "sqnr_db": 140.0, "rel_l2": 1e-7, "max_abs": 1e-6},
                    "latency_ms": {"artifact": {"p50": 1.0, "p90": 1.1}, "eager": {"p50": 2.0}}, "speedup_vs_eager": 2.0}],
    }  # fmt: skip
    (d / "report.json").write_text(json.dumps(report))
    files = write_reports(d / "report.json", tmp_path)  # the artifact is found next to the report
    assert "attention_maps.png" in files


def test_linear_attention_has_no_maps_and_says_so(tmp_path):
    from attn_export.validate.patterns import NoAttentionMaps, has_attention_maps

    layer = small_layer("linear", "causal")
    assert not has_attention_maps(layer) and has_attention_maps(small_layer("block-sparse", "none"))
    feed = feed_for(layer, 1, 8)
    with pytest.raises(NoAttentionMaps, match="LinearAttention computes no softmax attention probabilities"):
        check_attention_patterns(layer, feed["x"], tmp_path / "never-read.onnx")


def test_block_sparse_maps_compare_in_the_full_layout(tmp_path):
    """Per-block maps (eager (B, nb, H, bs, bs), graph (B*nb, H, bs, bs)) are compared as (B, H, L, L)."""
    layer = small_layer("block-sparse", "padding")  # block_size 8
    export_onnx(layer, tmp_path / "bs.onnx", ExportSpec())
    feed = feed_for(layer, 2, 12)  # two blocks, the second padded to 16
    res = check_attention_patterns(layer, feed["x"], tmp_path / "bs.onnx", feed["key_padding_mask"])
    assert res and res.source == "artifact", str(res)
    assert res.eager_maps.shape == res.onnx_maps.shape == (2, 4, 12, 12)
    assert not res.eager_maps[:, :, :8, 8:].any() and not res.onnx_maps[:, :, 8:, :8].any()  # block-diagonal


def test_a_softmax_inside_a_loop_is_not_exposed_and_the_maps_come_from_the_decomposed_form(tmp_path):
    """long-seq with a window mask runs its Softmax in a Loop over query blocks: exposing it made an invalid graph."""
    layer = small_layer("transformer", "window")
    export_onnx(layer, tmp_path / "long.onnx", ExportSpec(attention="long-seq", long_seq_block=4))
    model = ir.load(tmp_path / "long.onnx")
    assert any(n.op_type == "Softmax" for n in model.graph.all_nodes()) and not any(n.op_type == "Softmax" for n in model.graph)
    assert expose_softmax_outputs(tmp_path / "long.onnx", tmp_path / "copy.onnx") == []
    feed = feed_for(layer, 2, 10)
    res = check_attention_patterns(layer, feed["x"], tmp_path / "long.onnx")
    assert res and res.source.startswith("decomposed re-export (the artifact's attention has no Softmax in its main graph"), str(res)
    assert res.eager_maps.shape == (2, 4, 10, 10) and not res.eager_maps[:, :, 0, 4:].any()  # window 3: query 0 sees keys 0..3


def test_a_maps_graph_onnx_runtime_cannot_run_is_a_one_line_error(exported, monkeypatch):
    from attn_export.errors import ExportError
    from attn_export.validate import patterns

    def broken(*_a, **_k):
        raise Exception("[ONNXRuntimeError] : 1 : FAIL : Load model failed:\nGraph output (x) does not exist in the graph.")  # what ORT raises

    layer, d = exported
    monkeypatch.setattr(patterns, "SessionFromOnnx", broken)
    feed = feed_for(layer, 1, 8)
    with pytest.raises(ExportError, match=r"ONNX Runtime could not run the attention-map graph \(artifact\): .*does not exist") as err:
        check_attention_patterns(layer, feed["x"], d / "model.onnx", feed["key_padding_mask"])
    assert "\n" not in str(err.value)
