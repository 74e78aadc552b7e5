"""Efficiency never passes its ceiling by construction (issue 23: 232%), and bench ratios are paired medians with quartiles."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

from attn_export.campaigns.bench.ceilings import RUNS_IN, Ceilings, gemm_model
from attn_export.campaigns.bench.flops import count_module_flops
from attn_export.campaigns.bench.harness import _derive, paired_ratio
from attn_export.campaigns.bench.table import markdown_tables
from attn_export.layers import MaskedLayer, build_layer


def _ceilings(fp32: float, fp16: float, int8: float) -> Ceilings:
    return Ceilings(fp32, fp16, int8, {"fp32.onnxruntime": fp32, "fp16.onnxruntime": fp16, "int8.onnxruntime": int8}, 1024, 2)


def test_a_variant_is_judged_against_every_precision_its_products_can_run_in():
    c = _ceilings(fp32=200.0, fp16=80.0, int8=1300.0)  # an x86 CPU: fp16 GEMM slower than fp32
    assert c.for_precision("fp16") == 200.0  # ORT CPU runs much of a fp16 graph in fp32
    assert c.for_precision("int8") == 1300.0 and c.for_precision("fp32") == 200.0
    assert _ceilings(fp32=200.0, fp16=float("nan"), int8=150.0).for_precision("int8") == 200.0  # attention BMMs stay fp32
    assert math.isnan(_ceilings(float("nan"), float("nan"), float("nan")).for_precision("fp16"))
    assert all("fp32" in runs for runs in RUNS_IN.values())


def test_efficiency_stays_at_or_below_one_for_a_fp16_graph_running_at_fp32_speed():
    """The case that read 232%: ort-fp16 at 150 GFLOP/s against a fp16-only ceiling of 65."""
    c = _ceilings(fp32=200.0, fp16=65.0, int8=1300.0)
    rows = [{"variant": "eager-fp32", "batch": 8, "seq": 128, "latency_ms": {"p50": 100.0}, "gflops_per_s": 60.0, "rounds_ms": [100.0] * 5},
            {"variant": "ort-fp16", "batch": 8, "seq": 128, "latency_ms": {"p50": 40.0}, "gflops_per_s": 150.0, "rounds_ms": [40.0] * 5}]  # fmt: skip
    prepared = [{"name": "eager-fp32", "precision": "fp32", "notes": []}, {"name": "ort-fp16", "precision": "fp16", "notes": []}]
    _derive(rows, prepared, c)
    assert rows[1]["efficiency"] == pytest.approx(150.0 / 200.0) and rows[1]["efficiency"] <= 1.0


def test_the_ceiling_gemm_has_constant_weights_like_a_model():
    """B is an initializer, so ONNX Runtime prepacks it as it does every model's weights (the unpacked path measured 25-35% lower)."""
    for op, a, b in (("MatMul", onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT), ("MatMulInteger", onnx.TensorProto.UINT8, onnx.TensorProto.INT8)):
        model, feed = gemm_model(16, a, b, op)
        assert [i.name for i in model.graph.input] == ["A"] and [t.name for t in model.graph.initializer] == ["B"] and set(feed) == {"A"}
        onnx.checker.check_model(model, full_check=True)


@pytest.mark.parametrize(("layer", "mask", "attention"), [
    ("transformer", "padding", 4 * 2 * 64 * 64 * 32),  # dense: 2 * 2 B L^2 D
    ("block-sparse", "padding", 4 * 2 * 64 * 32 * 32),  # blocks of 32: 2 * 2 B L bs D
    ("linear", "none", 4 * 2 * 64 * 32 * 8),  # kernelised: 2 * 2 B L D Dh (Dh = 32 / 4)
])  # fmt: skip
def test_attention_flops_are_what_each_layer_computes(layer, mask, attention):
    model = MaskedLayer(build_layer(layer, 32, 4, mask=mask), mask)
    assert count_module_flops(model, seq=64, batch=2).attention == attention


def test_block_sparse_counts_the_padded_last_block():
    model = MaskedLayer(build_layer("block-sparse", 32, 4, mask="padding", block_size=16), "padding")
    assert count_module_flops(model, seq=40, batch=1).attention == 4 * 48 * 16 * 32  # 40 tokens -> 3 blocks of 16


def test_ratios_are_paired_medians_with_quartiles():
    # the load rises in round 3: the variant's rounds 3-5 and the eager's rounds 4-5 ran on a busy machine
    eager = [100.0, 100.0, 100.0, 300.0, 300.0]
    variant = [20.0, 20.0, 60.0, 60.0, 60.0]
    median, q25, q75 = paired_ratio(eager, variant)
    assert median == pytest.approx(5.0) and q25 == pytest.approx(5.0) and q75 == pytest.approx(5.0)
    assert float(np.median(eager)) / float(np.median(variant)) == pytest.approx(100 / 60)  # the ratio of medians swings to 1.67x
    assert paired_ratio(eager, variant[:4]) is None and paired_ratio(None, variant) is None  # unequal rounds are not paired
    spread = paired_ratio([100.0, 110.0, 90.0, 100.0], [20.0, 20.0, 20.0, 25.0])
    assert spread[1] < spread[0] < spread[2]  # the quartiles bracket the median when rounds differ


def test_the_bench_table_prints_the_quartiles_beside_the_ratio():
    c = _ceilings(200.0, 80.0, 1300.0)
    rows = [{"variant": "eager-fp32", "batch": 1, "seq": 128, "latency_ms": {"p50": 30.0, "p90": 31.0}, "gflops_per_s": 30.0,
             "throughput_per_s": 33.0, "rounds_ms": [30.0, 31.0, 29.0, 30.0]},
            {"variant": "ort-int8-dynamic", "batch": 1, "seq": 128, "latency_ms": {"p50": 5.0, "p90": 6.0}, "gflops_per_s": 150.0,
             "throughput_per_s": 200.0, "rounds_ms": [5.0, 6.0, 5.0, 5.5]}]  # fmt: skip
    prepared = [{"name": "eager-fp32", "precision": "fp32", "notes": []}, {"name": "ort-int8-dynamic", "precision": "int8", "notes": []}]
    _derive(rows, prepared, c)
    bench = {"ceilings": c.to_dict(), "results": rows, "variants": [], "environment": {}}
    line = next(ln for ln in markdown_tables(bench).splitlines() if ln.startswith("| ort-int8-dynamic"))
    q25, q75 = rows[1]["speedup_quartiles"]
    assert f"| {rows[1]['speedup_vs_eager']:.2f}x [{q25:.2f}-{q75:.2f}] |" in line, line
