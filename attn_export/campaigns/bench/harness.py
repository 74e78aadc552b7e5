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
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from attn_export.campaigns.bench.ceilings import measure_ceilings
from attn_export.campaigns.bench.flops import count_module_flops
from attn_export.campaigns.bench.grid import GRID, QUICK
from attn_export.campaigns.bench.variants import DEFAULT_VARIANTS, LINEAR_MEMORY_VARIANTS, VARIANTS
from attn_export.errors import ConfigError
from attn_export.subjects.kinds import KINDS
from attn_export.validate.memory import memory_method

__all__ = ["BenchConfig", "paired_ratio", "run_bench"]

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]  # (message, done, total)


@dataclass(frozen=True)
class BenchConfig:
    """The grid, the variants and how long to spend; ``BenchConfig.quick()`` is the small grid (L 128,512 x B 1,8; 125 s on a quiet
    2-core machine, 7.6 min on a loaded one in issue 23; the bench prints the time it took)."""

    seqs: tuple[int, ...] = GRID["seqs"]
    batches: tuple[int, ...] = GRID["batches"]
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    d_model: int = KINDS["layer"].defaults["d_model"]  # the default reference layer's shape, from its one table
    heads: int = KINDS["layer"].defaults["heads"]
    mask: str = KINDS["layer"].defaults["mask"]
    seed: int = 0
    threads: int | None = None
    warmup: int = 1
    min_repeats: int = 3
    max_repeats: int = 20
    point_budget_s: float = 10.0  # timed rounds per grid point, all variants together
    ceiling_size: int = GRID["ceiling_size"]
    ceiling_budget_s: float = 1.0
    max_gflop_per_run: float = 1000.0  # skip grid points whose eager run would take too long
    max_attention_gib: float = 4.5  # skip quadratic-memory variants whose B*H*L*L fp32 score tensor would not fit
    workdir: Path | None = None

    def __post_init__(self) -> None:
        if not self.variants:
            raise ConfigError(f"expected --variants to name at least one variant, got none; choose from {', '.join(VARIANTS)}")
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ConfigError(f"expected variants from {', '.join(VARIANTS)}, got {unknown}")
        if not self.seqs or not self.batches or min(self.seqs + self.batches) < 1:
            raise ConfigError(f"expected positive --seqs and --batches, got seqs={self.seqs}, batches={self.batches}")
        if self.min_repeats < 1 or self.max_repeats < self.min_repeats:
            raise ConfigError(f"expected 1 <= min_repeats <= max_repeats, got {self.min_repeats}, {self.max_repeats}")

    @classmethod
    def quick(cls, **overrides: Any) -> BenchConfig:
        base = cls(**QUICK)
        return replace(base, **overrides)


def _environment(threads: int, process: dict[str, Any]) -> dict[str, Any]:
    from attn_export.host.environment import capture_environment

    env = capture_environment(threads, process)
    env["load_average"] = _loadavg()
    return env


def _loadavg() -> list[float] | None:
    """The 1/5/15-minute load average: a busy machine explains noisy ratios."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _feed(batch: int, seq: int, d_model: int, seed: int, padded: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feed = {"x": rng.standard_normal((batch, seq, d_model)).astype(np.float32)}
    if padded:
        feed["key_padding_mask"] = np.ones((batch, seq), np.int32)  # dense work is the same with padding
    return feed


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


def _base_options(cfg: BenchConfig, workdir: Path) -> dict[str, Any]:
    """The RunConfig options every variant shares: the bench's layer, with calibration data (shipped, or generated for this width)."""
    from attn_export.compress.calib.data import shipped_or_generated

    calib = shipped_or_generated(cfg.d_model, workdir, cfg.seed)
    return {"d_model": cfg.d_model, "heads": cfg.heads, "mask": cfg.mask, "seed": cfg.seed, "calib": calib, "threads": cfg.threads, "render": False}


def _prepare(cfg: BenchConfig, workdir: Path, say: Callable[[str], None]) -> tuple[Any, list[Any], dict[str, Any], dict[str, str]]:
    """The subject, one plan per stage variant (each the main command's), the peers' runner factories, and why any is unavailable."""
    from attn_export.campaigns.bench.variants import peer_runner
    from attn_export.config.run import RunConfig
    from attn_export.pipeline.plan import make_plan
    from attn_export.subjects import make_subject

    base = _base_options(cfg, workdir)
    subject = make_subject(RunConfig(**base, quantize="int8", out=workdir))  # the layer and its data roles, as every variant sees them
    plans, peers, unavailable = [], {}, {}
    for name in cfg.variants:
        v = VARIANTS[name]
        try:
            if v.peer == "eager":
                continue  # the reference every run times anyway (label "eager")
            if v.peer:
                peers[name] = peer_runner(v, subject)
            else:
                run = dict(v.run or {})
                opts = base if run.get("low_rank") or run.get("quantize") else {k: x for k, x in base.items() if k != "calib"}
                plans.append(make_plan(RunConfig(**opts, **run, out=workdir / name)))
        except Exception as err:  # noqa: BLE001 - the benchmark reports every variant, runnable or not
            unavailable[name] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"
            say(f"variant {name} unavailable: {unavailable[name]}")
    return subject, plans, peers, unavailable


def _stage_variants(cfg: BenchConfig, unavailable: Mapping[str, str]) -> list[str]:
    """The variants that are plans (not peers), in the order ``_prepare`` planned them."""
    return [n for n in cfg.variants if not VARIANTS[n].peer and n not in unavailable]


def _rows(cfg: BenchConfig, results: list[Any], subject: Any, points: list[Any], timing: Any, peers: Mapping[str, Any],
          unavailable: Mapping[str, str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """One row per variant and grid point (latency, memory, FLOPs), and what each variant is (module, size, accuracy)."""
    info: dict[str, dict[str, Any]] = {}
    if "eager-fp32" in cfg.variants:
        info["eager-fp32"] = {"label": "eager", "module": subject.module, "size_bytes": subject.reference_size_bytes(),
                              "accuracy": {"max_abs": 0.0, "mean_abs": 0.0, "rel_l2": 0.0, "cosine": 1.0, "sqnr_db": 300.0}}  # fmt: skip
    for name, res in zip(_stage_variants(cfg, unavailable), results):
        v = VARIANTS[name]
        if res.error:
            info[name] = {"reason": res.error}
            continue
        art = res.artifacts[v.stage]
        stage = res.report.stage(v.stage)
        info[name] = {"label": res.labels[v.stage], "module": art.module, "size_bytes": art.size_bytes, "accuracy": asdict(stage.accuracy),
                      "artifact": str(art.path) if art.path else None, "passed": stage.passed}  # fmt: skip
    for name, make in peers.items():
        runner = make()
        try:
            judgement = subject.judge(runner, "report", "fp32")
        finally:
            runner.deactivate()
        info[name] = {"label": name, "module": subject.module, "size_bytes": None, "accuracy": asdict(judgement.accuracy)}
    rows = []
    for point in points:
        lat = timing.latency.get(point.label, {})
        for name in cfg.variants:
            label = (info.get(name) or {}).get("label")
            if label not in lat:
                continue
            b, s = point.details["batch"], point.details["seq"]
            flops = count_module_flops(info[name]["module"], s, b).total
            latency = lat[label]
            rows.append({"variant": name, "batch": b, "seq": s, "peak_mem_bytes": timing.memory.get(point.label, {}).get(label),
                         "latency_ms": asdict(latency), "gflop": flops / 1e9, "throughput_per_s": latency.throughput_per_s,
                         "tokens_per_s": latency.throughput_per_s * s, "gflops_per_s": flops / 1e9 / (latency.p50 / 1e3),
                         "rounds_ms": timing.rounds_ms.get(point.label, {}).get(label)})  # fmt: skip
    for label, why in timing.failed.items():
        for name, i in info.items():
            if i.get("label") == label:
                i["reason"] = f"failed at {why}"
    return rows, info


def paired_ratio(reference_ms: list[float] | None, variant_ms: list[float] | None) -> tuple[float, float, float] | None:
    """(median, 25th, 75th percentile) of reference / variant over the rounds both were timed in, or None.

    Round i of both was timed back to back (``time_runners``), so each ratio sees the same
    machine load; the median of these paired ratios, unlike a ratio of two medians taken
    over different moments, does not swing with load, and the quartiles show how much it could.
    """
    if not reference_ms or not variant_ms or len(reference_ms) != len(variant_ms):
        return None
    ratios = np.asarray(reference_ms, dtype=np.float64) / np.asarray(variant_ms, dtype=np.float64)
    q25, q50, q75 = np.percentile(ratios, [25, 50, 75])
    return float(q50), float(q25), float(q75)


def _derive(results: list[dict[str, Any]], prepared: list[dict[str, Any]], ceilings: Any) -> None:
    """Paired ratios to eager at the same point (median and quartiles), efficiency vs the variant's ceiling, fp16 honesty note."""
    precision = {v["name"]: v["precision"] for v in prepared}
    eager = {(r["batch"], r["seq"]): r for r in results if r["variant"] == "eager-fp32"}
    for r in results:
        e = eager.get((r["batch"], r["seq"]))
        paired = paired_ratio(e.get("rounds_ms"), r.get("rounds_ms")) if e else None
        if paired is not None:
            r["speedup_vs_eager"], r["speedup_quartiles"] = paired[0], [paired[1], paired[2]]
        else:  # no paired rounds (an older bench.json): the ratio of the two medians
            r["speedup_vs_eager"] = e["latency_ms"]["p50"] / r["latency_ms"]["p50"] if e else None
        ceil = ceilings.for_precision(precision[r["variant"]])
        r["efficiency"] = r["gflops_per_s"] / ceil if ceil and math.isfinite(ceil) else None
    for v in prepared:
        ratios_e = [r["speedup_vs_eager"] for r in results if r["variant"] == v["name"] and r.get("speedup_vs_eager")]
        if v["name"] != "eager-fp32" and ratios_e and float(np.median(ratios_e)) < 0.95:
            v["notes"].append(f"slower than eager-fp32 (median {float(np.median(ratios_e)):.2f}x)")
    fp32 = {(r["batch"], r["seq"]): r for r in results if r["variant"] == "ort-fp32-decomposed"}
    ratios = []
    for r in results:
        base = fp32.get((r["batch"], r["seq"])) if r["variant"] == "ort-fp16" else None
        if base is not None:  # fp16 latency / fp32 latency, paired by round where both have them
            paired = paired_ratio(r.get("rounds_ms"), base.get("rounds_ms"))
            ratios.append(paired[0] if paired else r["latency_ms"]["p50"] / base["latency_ms"]["p50"])
    for v in prepared:
        if v["name"] == "ort-fp16" and ratios:
            med = float(np.median(ratios))
            v["notes"].append(f"{'slow' if med > 1.05 else 'ok'}: median {med:.2f}x the latency of ort-fp32-decomposed on this CPU runtime")


def run_bench(cfg: BenchConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the JSON-ready result (``schema_version``: ``validate.schema.SCHEMA_VERSIONS["bench"]``)."""
    from attn_export.compress.quant.int8_encoding import choose_cpu_encoding
    from attn_export.host.environment import cpu_summary_line
    from attn_export.host.process import ProcessSettings, process_settings
    from attn_export.pipeline.runner import RunSettings, run_plans, runner_labels
    from attn_export.validate.latency import TimingPoint
    from attn_export.validate.schema import SCHEMA_VERSIONS

    step = [0]
    total = 4 + len(cfg.batches) * len(cfg.seqs)

    def say(msg: str) -> None:
        (progress or (lambda m, d, t: log.info("[%d/%d] %s", d, t, m)))(msg, step[0], total)

    threads = cfg.threads or os.cpu_count() or 1
    with process_settings(ProcessSettings(threads=threads)) as proc:
        encoding = choose_cpu_encoding("auto")
        say(f"{cpu_summary_line()}; int8 weights {encoding.encoding}")
        say(f"measuring GEMM ceilings ({cfg.ceiling_size}^3, {threads} threads)")
        ceilings = measure_ceilings(threads, cfg.ceiling_size, cfg.ceiling_budget_s)
        step[0] += 1
        with tempfile.TemporaryDirectory(prefix="attn-bench-") as tmp:
            workdir = Path(cfg.workdir or tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            say(f"preparing {len(cfg.variants)} variants (each the plan of its main command)")
            subject, plans, peers, unavailable = _prepare(cfg, workdir, say)
            step[0] += 1
            points, skipped = [], []
            for batch in cfg.batches:
                for seq in cfg.seqs:
                    reason = _skip_reason(cfg, batch, seq, count_module_flops(subject.module, seq, batch).total)
                    if reason:
                        skipped.append({"batch": batch, "seq": seq, "reason": reason})
                        continue
                    feed = _feed(batch, seq, cfg.d_model, cfg.seed + 7, "key_padding_mask" in subject.input_names)
                    points.append(TimingPoint(f"B{batch} L{seq}", feed, batch, warmup=cfg.warmup, repeats=None, budget_s=cfg.point_budget_s,
                                              min_repeats=cfg.min_repeats, max_repeats=cfg.max_repeats, details={"batch": batch, "seq": seq}))  # fmt: skip

            labels = runner_labels(plans)
            linear = {labels[p.content_key(VARIANTS[n].stage)] for p, n in zip(plans, _stage_variants(cfg, unavailable))
                      if n in LINEAR_MEMORY_VARIANTS} | (LINEAR_MEMORY_VARIANTS & set(peers))  # fmt: skip

            def skip(label: str, point: Any) -> str | None:
                return None if label in linear else _scores_skip(cfg, point.details["batch"], point.details["seq"])

            settings = RunSettings(threads, say, points=points or None, peers=peers, measure_memory=True, skip=skip, keep_going=True)
            results = run_plans(plans, subject, settings) if points else []
            timing = results[0].timing if results else None
            if timing is None and points:  # peers only
                from attn_export.validate.latency import time_pass

                timing = time_pass({"eager": subject.eager_runner, **peers}, points, True, skip)
            step[0] += len(points)
            rows, info = _rows(cfg, results, subject, points, timing, peers, unavailable) if timing is not None else ([], {})
            for s in (timing.skipped if timing is not None else []):
                variant = next((v for v, i in info.items() if i.get("label") == s["runner"]), s["runner"])
                skipped.append({"batch": s["batch"], "seq": s["seq"], "variant": variant, "reason": s["reason"]})
            say("measuring GEMM ceilings again (the best of both counts)")
            ceilings = ceilings.merged(measure_ceilings(threads, cfg.ceiling_size, cfg.ceiling_budget_s))
            step[0] += 1
        environment = _environment(threads, proc)
        environment["int8_encoding"] = encoding.to_dict()
    prepared = []
    for name in cfg.variants:
        v, i = VARIANTS[name], info.get(name, {})
        reason = unavailable.get(name) or i.get("reason")
        notes = list(v.notes) + ([f"built as `{v.command}`"] if v.command else [])
        prepared.append({"name": name, "runtime": v.runtime, "precision": v.precision, "description": v.description, "available": reason is None,
                         "reason": reason, "notes": notes, "size_bytes": i.get("size_bytes"), "accuracy": i.get("accuracy")})  # fmt: skip
    _derive(rows, prepared, ceilings)
    return {
        "schema_version": SCHEMA_VERSIONS["bench"], "kind": "bench", "environment": environment,
        "layer": {"layer": "transformer", "d_model": cfg.d_model, "heads": cfg.heads, "ffn_mult": 4, "mask": cfg.mask, "seed": cfg.seed},
        "config": {k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "ceilings": ceilings.to_dict(),
        "methods": {
            "latency": "p50/p90 over round-robin timed runs of all variants on one input, after warm-up; wall and process CPU time; "
            "ONNX Runtime intra-op spinning off, and the CLI sets OMP_WAIT_POLICY=PASSIVE unless set, so idle "
            "thread pools of one runtime do not steal cores from the variant being timed",
            "memory": f"{memory_method()}: peak RSS delta of a steady-state inference on a fresh runner",
            "flops": "2 x MACs of projections, Q K^T, P V and FFN, from the module shapes (low-rank factors as they run)",
            "efficiency": "variant GFLOP/s at p50 / the best measured GEMM rate among the precisions its GEMMs can run in "
            "(fp32; fp16 or fp32; int8 or fp32: Ceilings.for_precision)",
            "ratios": "x eager: median over round-robin rounds of eager / variant wall time in the same round, with quartiles",
            "variants": "every ONNX variant is the plan of its main command (attn-export with the options in its notes)",
        },
        "variants": prepared,
        "results": rows,
        "skipped": skipped,
    }  # fmt: skip
