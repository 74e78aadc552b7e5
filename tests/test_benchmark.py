"""attn-export bench: FLOP counting by hand, ceilings, memory method and a tiny grid smoke run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fixtures import small_layer

from attn_export.campaigns.bench import (
    BenchConfig,
    count_flops,
    count_module_flops,
    measure_ceilings,
    run_bench,
)
from attn_export.campaigns.bench.table import markdown_tables
from attn_export.errors import ConfigError
from attn_export.validate.memory import memory_method, peak_memory_delta
from attn_export.validate.schema import SCHEMA_VERSIONS


def test_count_flops_matches_a_hand_computation():
    # d_model 512, 8 heads, L 128, B 2, FFN 2048: tokens T = 256
    f = count_flops(512, 8, seq=128, batch=2)
    T = 256
    assert f.projections == 4 * 2 * T * 512 * 512 == 536_870_912
    assert f.attention == 2 * (2 * 2 * 8 * 128 * 128 * 64) == 67_108_864  # per head: (L x Dh)(Dh x L), (L x L)(L x Dh)
    assert f.ffn == 2 * (2 * T * 512 * 2048) == 1_073_741_824
    assert f.total == 1_677_721_600
    # rank-r factors of w_q (512 -> r -> 512): 2 T r (512 + 512)
    lr = count_flops(512, 8, seq=128, batch=2, ranks={"w_q": 128})
    assert f.projections - lr.projections == 2 * T * 512 * 512 - 2 * T * 128 * 1024
    assert count_flops(512, 8, 128, 2, ffn=False).ffn == 0


def test_count_flops_rejects_bad_shapes():
    with pytest.raises(ConfigError, match="heads dividing"):
        count_flops(100, 8, 16, 1)
    with pytest.raises(ConfigError, match="ranks keyed"):
        count_flops(64, 4, 16, 1, ranks={"q": 8})


def test_module_flops_agree_with_the_shape_formula():
    layer = small_layer("transformer", "none", d_model=64, heads=4)
    assert count_module_flops(layer, seq=32, batch=3) == count_flops(64, 4, seq=32, batch=3)
    from attn_export.layers import fuse_qkv_

    fuse_qkv_(layer)  # one fused GEMM costs the same FLOPs as three
    assert count_module_flops(layer, 32, 3).total == count_flops(64, 4, 32, 3).total


def test_ceilings_measure_every_precision_tiny():
    c = measure_ceilings(threads=1, size=64, budget_s=0.01)
    assert c.fp32_gflops > 0 and c.int8_gops > 0
    assert set(c.measurements) == {"fp32.torch", "fp32.onnxruntime", "fp16.torch", "fp16.onnxruntime", "int8.torch", "int8.onnxruntime"}
    # the int8 ceiling is what ONNX Runtime's int8 kernel does on this CPU, never torch._int_mm (kept for reference);
    # an int8 variant's attention products run in fp32, so its ceiling is the faster of the two (ceilings.RUNS_IN)
    assert c.for_precision("int8") == max(c.measurements["int8.onnxruntime"], c.fp32_gflops)


def test_peak_memory_delta_sees_a_numpy_allocation():
    if not memory_method().startswith("vmhwm"):
        pytest.skip(f"peak RSS cannot be reset here: {memory_method()}")
    delta = peak_memory_delta(lambda: np.ones(16 * 2**20 // 8).sum())  # 16 MiB touched
    assert 15 * 2**20 <= delta < 64 * 2**20


def test_tiny_grid_smoke(tmp_path):
    cfg = BenchConfig.quick(
        seqs=(8, 16), batches=(2,), d_model=32, heads=4, threads=1, variants=("eager-fp32", "ort-fp32-decomposed", "ort-int8-dynamic"),
        ceiling_size=64, ceiling_budget_s=0.01, point_budget_s=0.05, min_repeats=2, max_repeats=3, warmup=1, workdir=tmp_path,
    )  # fmt: skip
    bench = run_bench(cfg)
    json.dumps(bench)  # JSON-ready
    assert bench["schema_version"] == SCHEMA_VERSIONS["bench"] and bench["kind"] == "bench"
    assert [v["name"] for v in bench["variants"]] == list(cfg.variants)
    assert all(v["available"] for v in bench["variants"]), bench["variants"]
    rows = {(r["variant"], r["seq"]): r for r in bench["results"]}
    assert len(rows) == 6
    for (name, seq), r in rows.items():
        assert r["latency_ms"]["p90"] >= r["latency_ms"]["p50"] > 0
        assert r["gflop"] == pytest.approx(count_flops(32, 4, seq, 2).total / 1e9)
        ceil = bench["ceilings"]
        assert r["efficiency"] == pytest.approx(r["gflops_per_s"] / (max(ceil["int8_gops"], ceil["fp32_gflops"]) if "int8" in name else ceil["fp32_gflops"]))
    assert rows[("eager-fp32", 8)]["speedup_vs_eager"] == 1.0
    acc = {v["name"]: v["accuracy"] for v in bench["variants"]}
    assert acc["ort-fp32-decomposed"]["rel_l2"] < 1e-5 and acc["ort-int8-dynamic"]["cosine"] > 0.99
    text = markdown_tables(bench)
    assert "| ort-int8-dynamic | 2 | 16 |" in text and "ceilings" in text


def test_oversized_points_are_skipped_and_listed(tmp_path):
    """A score tensor too big for the machine skips the quadratic-memory variants only, and says so."""
    cfg = BenchConfig.quick(seqs=(8, 64), batches=(1,), d_model=32, heads=4, threads=1, variants=("eager-fp32", "eager-sdpa"), ceiling_size=32,
                            ceiling_budget_s=0.01, point_budget_s=0.01, min_repeats=1, max_repeats=1, max_attention_gib=4 * 64 * 64 * 4 / 2**30 * 0.99, workdir=tmp_path)  # fmt: skip
    bench = run_bench(cfg)
    assert sorted((r["variant"], r["seq"]) for r in bench["results"]) == [("eager-fp32", 8), ("eager-sdpa", 8), ("eager-sdpa", 64)]
    [skip] = bench["skipped"]
    assert (skip["variant"], skip["seq"]) == ("eager-fp32", 64) and "GiB" in skip["reason"]

def test_unknown_variant_is_a_config_error():
    with pytest.raises(ConfigError, match="expected variants"):
        BenchConfig(variants=("ort-fp64",))


def test_bench_command_writes_json_markdown_and_plot(tmp_path):
    import typer
    from typer.testing import CliRunner

    from attn_export.cli.bench import register

    args = ["bench", "--quick", "--seqs", "8,16", "--batches", "1", "--variants", "eager-fp32,ort-fp32-decomposed", "--d-model", "32",
            "--heads", "4", "--threads", "1", "--ceiling-size", "128", "--out", str(tmp_path)]  # fmt: skip
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "x eager" in res.stdout and "eff" in res.stdout and "ceilings" in res.stdout
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert {r["variant"] for r in bench["results"]} == {"eager-fp32", "ort-fp32-decomposed"}
    assert (tmp_path / "bench.md").is_file() and (tmp_path / "seq_scaling.png").is_file()
