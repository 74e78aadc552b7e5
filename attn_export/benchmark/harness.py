"""``run_bench``: every variant side by side in one process, over a grid of shapes.

At each (batch, seq) point every available variant gets a fresh runner, its peak memory is
measured on its first inference, and then all variants are timed round-robin on the same
input (``time_runners``), so machine noise hits them alike and their ratios to eager are
fair. The machine's GEMM ceilings are measured in the same run and thread count, and each
variant's FLOP rate (FLOPs counted from the layer's shapes) is divided by the ceiling of its
precision. Grid points too large for the machine are skipped *and listed*.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from attn_export.benchmark.ceilings import measure_ceilings
from attn_export.benchmark.flops import count_module_flops
from attn_export.benchmark.memory import memory_method, peak_memory_delta
from attn_export.benchmark.variants import (
    DEFAULT_VARIANTS,
    VARIANTS,
    BenchContext,
    PreparedVariant,
    accuracy_feed,
    prepare_variants,
)
from attn_export.errors import ConfigError, DataError
from attn_export.validate.latency import time_runners
from attn_export.validate.metrics import accuracy

__all__ = ["BENCH_FORMAT", "BenchConfig", "run_bench"]

log = logging.getLogger(__name__)

BENCH_FORMAT = "attn-export-bench/1"
Progress = Callable[[str, int, int], None]  # (message, done, total)


@dataclass(frozen=True)
class BenchConfig:
    """The grid, the variants and how long to spend; ``BenchConfig.quick()`` fits in ~2 minutes."""

    seqs: tuple[int, ...] = (128, 512, 1024, 2048, 4096, 8192)
    batches: tuple[int, ...] = (1, 8)
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    d_model: int = 512
    heads: int = 8
    mask: str = "padding"
    seed: int = 0
    threads: int | None = None
    warmup: int = 1
    min_repeats: int = 3
    max_repeats: int = 20
    point_budget_s: float = 10.0  # timed rounds per grid point, all variants together
    ceiling_size: int = 2048
    ceiling_budget_s: float = 1.0
    max_gflop_per_run: float = 1000.0  # skip grid points whose eager run would take too long
    max_attention_gib: float = 4.5  # skip quadratic-memory variants whose B*H*L*L fp32 score tensor would not fit
    workdir: Path | None = None

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ConfigError(f"expected variants from {', '.join(VARIANTS)}, got {unknown}")
        if not self.seqs or not self.batches or min(self.seqs + self.batches) < 1:
            raise ConfigError(f"expected positive --seqs and --batches, got seqs={self.seqs}, batches={self.batches}")
        if self.min_repeats < 1 or self.max_repeats < self.min_repeats:
            raise ConfigError(f"expected 1 <= min_repeats <= max_repeats, got {self.min_repeats}, {self.max_repeats}")

    @classmethod
    def quick(cls, **overrides: Any) -> BenchConfig:
        base = cls(seqs=(128, 512), batches=(1, 8), warmup=1, min_repeats=3, max_repeats=10, point_budget_s=3.0, ceiling_size=1024, ceiling_budget_s=0.3)
        return replace(base, **overrides)


def _environment(threads: int, process: dict[str, Any]) -> dict[str, Any]:
    from attn_export.environment import capture_environment

    env = capture_environment(threads, process)
    env["load_average"] = _loadavg()
    return env


def _loadavg() -> list[float] | None:
    """The 1/5/15-minute load average: a busy machine explains noisy ratios."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _feed(layer: Any, batch: int, seq: int, d_model: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feed = {"x": rng.standard_normal((batch, seq, d_model)).astype(np.float32)}
    if "key_padding_mask" in layer.input_names:
        feed["key_padding_mask"] = np.ones((batch, seq), np.int32)  # dense work is the same with padding
    return feed


def _accuracy(prepared: list[PreparedVariant], ctx: BenchContext) -> dict[str, dict[str, float]]:
    feed = accuracy_feed(ctx)
    ref = ctx.eager(ctx.layer, "ref")().infer(feed)["y"]
    out: dict[str, dict[str, float]] = {}
    for v in prepared:
        if not v.available:
            continue
        try:
            with v.make_runner() as runner:  # type: ignore[misc]
                got = runner.infer(feed)
            out[v.name] = asdict(accuracy(ref, next(iter(got.values()))))
        except Exception as err:  # noqa: BLE001 - a variant that cannot run is reported, not fatal
            v.reason = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"
    return out


def _scores_skip(cfg: BenchConfig, batch: int, seq: int) -> str | None:
    """Why a quadratic-memory variant cannot run at this point (its B*H*L*L scores), or None."""
    scores_gib = batch * cfg.heads * seq * seq * 4 / 2**30
    if scores_gib > cfg.max_attention_gib:
        return f"attention scores need {scores_gib:.1f} GiB per tensor > max_attention_gib {cfg.max_attention_gib}"
    return None


def _skip_reason(cfg: BenchConfig, batch: int, seq: int, flops: float) -> str | None:
    if flops / 1e9 > cfg.max_gflop_per_run:
        return f"{flops / 1e9:.0f} GFLOP per run > max_gflop_per_run {cfg.max_gflop_per_run}"
    return None


def _run_point(
    cfg: BenchConfig, prepared: list[PreparedVariant], ctx: BenchContext, batch: int, seq: int, skipped: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    from attn_export.benchmark.variants import LINEAR_MEMORY_VARIANTS

    feed = _feed(ctx.layer, batch, seq, cfg.d_model, cfg.seed + 7)
    runners, rows = {}, {}
    too_big = _scores_skip(cfg, batch, seq)
    for v in prepared:
        if not v.available:
            continue
        if too_big and v.name not in LINEAR_MEMORY_VARIANTS:
            skipped.append({"batch": batch, "seq": seq, "variant": v.name, "reason": too_big})
            continue
        runner = v.make_runner()  # type: ignore[misc]
        try:
            runner.activate()
            if v.warm_before_memory:
                runner.infer(feed)
            mem = peak_memory_delta(lambda r=runner: r.infer(feed))
        except Exception as err:  # noqa: BLE001 - e.g. torch.compile without a working C++ toolchain
            v.reason = f"failed at batch {batch}, seq {seq}: {type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"
            runner.deactivate()
            continue
        runners[v.name] = runner
        rows[v.name] = {"variant": v.name, "batch": batch, "seq": seq, "peak_mem_bytes": mem, "first_run_s": runner.last_inference_time}
    if not runners:
        return []
    per_round = sum(r["first_run_s"] or 0.0 for r in rows.values()) or 1e-3
    repeats = int(np.clip(cfg.point_budget_s / per_round, cfg.min_repeats, cfg.max_repeats))
    lat = time_runners(runners, feed, warmup=cfg.warmup, repeats=repeats, batch=batch)
    for r in runners.values():
        r.deactivate()
    by_name = {v.name: v for v in prepared}
    for name, row in rows.items():
        flops = count_module_flops(by_name[name].flops_module, seq, batch).total
        row.update(latency_ms=asdict(lat[name]), gflop=flops / 1e9, throughput_per_s=lat[name].throughput_per_s,
                   tokens_per_s=lat[name].throughput_per_s * seq, gflops_per_s=flops / 1e9 / (lat[name].p50 / 1e3))  # fmt: skip
        row.pop("first_run_s")
    return list(rows.values())


def _derive(results: list[dict[str, Any]], prepared: list[PreparedVariant], ceilings: Any) -> None:
    """Ratios to eager at the same point, efficiency vs the precision's ceiling, fp16 honesty note."""
    precision = {v.name: v.precision for v in prepared}
    eager = {(r["batch"], r["seq"]): r["latency_ms"]["p50"] for r in results if r["variant"] == "eager-fp32"}
    for r in results:
        e = eager.get((r["batch"], r["seq"]))
        r["speedup_vs_eager"] = e / r["latency_ms"]["p50"] if e else None
        ceil = ceilings.for_precision(precision[r["variant"]])
        r["efficiency"] = r["gflops_per_s"] / ceil if ceil and math.isfinite(ceil) else None
    for v in prepared:
        ratios_e = [r["speedup_vs_eager"] for r in results if r["variant"] == v.name and r.get("speedup_vs_eager")]
        if v.name != "eager-fp32" and ratios_e and float(np.median(ratios_e)) < 0.95:
            v.notes.append(f"slower than eager-fp32 (median {float(np.median(ratios_e)):.2f}x)")
    fp32 = {(r["batch"], r["seq"]): r["latency_ms"]["p50"] for r in results if r["variant"] == "ort-fp32-decomposed"}
    ratios = [r["latency_ms"]["p50"] / fp32[(r["batch"], r["seq"])] for r in results if r["variant"] == "ort-fp16" and (r["batch"], r["seq"]) in fp32]
    for v in prepared:
        if v.name == "ort-fp16" and ratios:
            med = float(np.median(ratios))
            v.notes.append(f"{'slow' if med > 1.05 else 'ok'}: median {med:.2f}x the latency of ort-fp32-decomposed on this CPU runtime")


def _subject(cfg: BenchConfig, workdir: Path) -> Any:
    """The bench's layer as a pipeline subject, with calibration data (shipped, or generated for this width)."""
    from attn_export.compress.calib_data import default_calibration_path, generate_calibration
    from attn_export.config import RunConfig
    from attn_export.subjects.layer import LayerSubject

    try:
        calib = default_calibration_path(cfg.d_model)
    except DataError:  # no shipped set for this width: a seeded synthetic one, identical on every run
        calib = generate_calibration(workdir / f"calib_d{cfg.d_model}.npz", cfg.d_model, n_calib=16, n_val=4, seed=cfg.seed)
    run_cfg = RunConfig(d_model=cfg.d_model, heads=cfg.heads, mask=cfg.mask, seed=cfg.seed, quantize="int8", calib=calib,
                        out=workdir, render=False, threads=cfg.threads)  # fmt: skip
    return LayerSubject(run_cfg)


def run_bench(cfg: BenchConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the JSON-ready result (format ``attn-export-bench/1``)."""
    from attn_export.compress.int8_encoding import choose_cpu_encoding
    from attn_export.environment import cpu_summary_line
    from attn_export.process import ProcessSettings, process_settings

    say = progress or (lambda msg, done, total: log.info("[%d/%d] %s", done, total, msg))
    threads = cfg.threads or os.cpu_count() or 1
    grid = [(b, s) for b in cfg.batches for s in cfg.seqs]
    total = 3 + len(cfg.variants) + len(grid)
    step = 0
    with process_settings(ProcessSettings(threads=threads)) as proc:
        encoding = choose_cpu_encoding("auto")
        say(f"{cpu_summary_line()}; int8 weights {encoding.encoding}", step, total)
        say(f"measuring GEMM ceilings ({cfg.ceiling_size}^3, {threads} threads)", step, total)
        ceilings = measure_ceilings(threads, cfg.ceiling_size, cfg.ceiling_budget_s)
        step += 1
        with tempfile.TemporaryDirectory(prefix="attn-bench-") as tmp:
            workdir = Path(cfg.workdir or tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            subject = _subject(cfg, workdir)
            layer = subject.module
            ctx = BenchContext(subject, workdir, threads, cfg.d_model, cfg.seed)
            say(f"preparing {len(cfg.variants)} variants", step, total)
            prepared = prepare_variants(cfg.variants, ctx, encoding)
            step += len(cfg.variants)
            say("accuracy of each variant vs eager fp32", step, total)
            acc = _accuracy(prepared, ctx)
            step += 1
            results: list[dict[str, Any]] = []
            skipped: list[dict[str, Any]] = []
            for batch, seq in grid:
                say(f"timing batch {batch}, seq {seq}", step, total)
                flops = count_module_flops(layer, seq, batch).total
                reason = _skip_reason(cfg, batch, seq, flops)
                if reason:
                    skipped.append({"batch": batch, "seq": seq, "reason": reason})
                else:
                    results.extend(_run_point(cfg, prepared, ctx, batch, seq, skipped))
                step += 1
            say("measuring GEMM ceilings again (the best of both counts)", step, total)
            ceilings = ceilings.merged(measure_ceilings(threads, cfg.ceiling_size, cfg.ceiling_budget_s))
            step += 1
            say("done", step, total)
        environment = _environment(threads, proc)
        environment["int8_encoding"] = encoding.to_dict()
    _derive(results, prepared, ceilings)
    variants = [
        {"name": v.name, "runtime": v.runtime, "precision": v.precision, "description": v.description, "available": v.available,
         "reason": v.reason, "notes": v.notes, "size_bytes": v.size_bytes, "accuracy": acc.get(v.name)}
        for v in prepared
    ]  # fmt: skip
    return {
        "format": BENCH_FORMAT,
        "environment": environment,
        "layer": {"layer": "transformer", "d_model": cfg.d_model, "heads": cfg.heads, "ffn_mult": 4, "mask": cfg.mask, "seed": cfg.seed},
        "config": {k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "ceilings": ceilings.to_dict(),
        "methods": {
            "latency": "p50/p90 over round-robin timed runs of all variants on one input, after warm-up; "
            "ONNX Runtime intra-op spinning off, and the CLI sets OMP_WAIT_POLICY=PASSIVE unless set, so idle "
            "thread pools of one runtime do not steal cores from the variant being timed",
            "memory": f"{memory_method()}: peak RSS delta of the first inference on a fresh runner",
            "flops": "2 x MACs of projections, Q K^T, P V and FFN, from the module shapes (low-rank factors as they run)",
            "efficiency": "variant GFLOP/s at p50 / best measured GEMM rate of its precision (fp32|fp16|int8)",
        },
        "variants": variants,
        "results": results,
        "skipped": skipped,
    }
