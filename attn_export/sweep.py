"""``attn-export sweep``: a grid over the compression choices, and its accuracy/latency Pareto front.

Axes: low-rank ratio (1.0 = none), distillation steps, int8 route (none | ONNX Runtime
dynamic | static) with the static route's calibration method, and export precision. Every
configuration is built from the same seeded layer and calibration data, exported, run on
ONNX Runtime CPU and compared with eager fp32 on the calibration set's *validation* split;
latency is timed against eager in the same run. Shared steps (factorization, distillation,
export) are cached, so a grid costs little more than its distinct artifacts.

Each point carries its recipe: the single-point ``attn-export sweep`` command that rebuilds
exactly that configuration. Accuracy is deterministic (seeded low-rank, distillation and
calibration, a fixed thread count), so a recipe reproduces its accuracy exactly and its
latency within machine noise.
"""

from __future__ import annotations

import copy
import logging
import os
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from attn_export.errors import ConfigError
from attn_export.layers import MaskedLayer, build_layer
from attn_export.runtime import EagerRunner, OrtRunner, SessionFromOnnx
from attn_export.validate.latency import set_threads, time_runners
from attn_export.validate.metrics import accuracy
from attn_export.validate.pareto import ParetoPoint, pareto_front

__all__ = ["INT8_MODES", "SWEEP_FORMAT", "SweepConfig", "SweepPoint", "pareto_rows", "run_sweep", "write_sweep"]

log = logging.getLogger(__name__)

SWEEP_FORMAT = "attn-export-sweep/1"
INT8_MODES: tuple[str, ...] = ("none", "dynamic", "static")
_CALIB_METHODS: tuple[str, ...] = ("minmax", "percentile", "entropy")
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class SweepPoint:
    """One configuration of the grid."""

    rank_ratio: float  # 1.0 = no low-rank factorization
    distill_steps: int
    int8: str
    calib_method: str | None  # static int8 only
    precision: str

    @property
    def key(self) -> str:
        lr = "full" if self.rank_ratio >= 1.0 else f"r{self.rank_ratio:g}" + (f"-d{self.distill_steps}" if self.distill_steps else "")
        q = self.int8 if self.int8 != "static" else f"static-{self.calib_method}"
        return f"{lr}-{q if self.int8 != 'none' else self.precision}"


@dataclass(frozen=True)
class SweepConfig:
    """The grid and the evaluation settings shared by every point."""

    rank_ratios: tuple[float, ...] = (1.0, 0.75, 0.5, 0.25)
    distill_steps: tuple[int, ...] = (0, 100, 300)
    int8_modes: tuple[str, ...] = INT8_MODES
    calib_methods: tuple[str, ...] = _CALIB_METHODS
    precisions: tuple[str, ...] = ("fp32", "fp16")
    low_rank_targets: tuple[str, ...] = ("q", "k", "v", "o", "ffn")
    d_model: int = 512
    heads: int = 8
    seed: int = 0
    batch: int = 8
    seq_len: int = 128
    threads: int | None = None
    warmup: int = 2
    repeats: int = 10
    calibration: str | None = None  # .npz/.safetensors; default: the shipped set for d_model

    def __post_init__(self) -> None:
        checks = [
            (all(0.0 < r <= 1.0 for r in self.rank_ratios), f"expected --rank-ratios in (0, 1] (1 = no low-rank), got {list(self.rank_ratios)}"),
            (all(s >= 0 for s in self.distill_steps), f"expected --distill-steps >= 0, got {list(self.distill_steps)}"),
            (set(self.int8_modes) <= set(INT8_MODES), f"expected --int8-modes from {', '.join(INT8_MODES)}, got {list(self.int8_modes)}"),
            (set(self.calib_methods) <= set(_CALIB_METHODS), f"expected --calib-methods from {', '.join(_CALIB_METHODS)}, got {list(self.calib_methods)}"),
            (set(self.precisions) <= {"fp32", "fp16"}, f"expected --precisions from fp32, fp16, got {list(self.precisions)}"),
            (min(self.batch, self.seq_len, self.repeats) >= 1, f"expected positive --batch/--seq-len/--repeats, got {self.batch}/{self.seq_len}/{self.repeats}"),
        ]  # fmt: skip
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        if not self.points():
            raise ConfigError("the sweep grid is empty (distillation needs a rank ratio < 1, int8 needs fp32); widen --rank-ratios or --precisions")

    @classmethod
    def quick(cls, **overrides: Any) -> SweepConfig:
        base = cls(rank_ratios=(1.0, 0.5), distill_steps=(0, 40), int8_modes=INT8_MODES, calib_methods=("minmax",), precisions=("fp32", "fp16"), repeats=5)
        return replace(base, **overrides)

    def points(self) -> list[SweepPoint]:
        """The grid without meaningless combinations (distilling a full-rank layer, int8 of fp16)."""
        out = []
        for r in self.rank_ratios:
            for steps in self.distill_steps:
                if r >= 1.0 and steps > 0:
                    continue
                for prec in self.precisions:
                    for mode in self.int8_modes:
                        if mode != "none" and prec != "fp32":
                            continue
                        for method in self.calib_methods if mode == "static" else (None,):
                            out.append(SweepPoint(r, steps, mode, method, prec))
        return list(dict.fromkeys(out))

    def recipe(self, p: SweepPoint, threads: int) -> str:
        """The single-point command that rebuilds ``p`` with this sweep's settings."""
        args = ["attn-export", "sweep", "--rank-ratios", f"{p.rank_ratio:g}", "--distill-steps", str(p.distill_steps),
                "--int8-modes", p.int8, "--calib-methods", p.calib_method or "minmax", "--precisions", p.precision,
                "--low-rank-targets", ",".join(self.low_rank_targets), "--d-model", str(self.d_model), "--heads", str(self.heads),
                "--seed", str(self.seed), "--batch", str(self.batch), "--seq-len", str(self.seq_len), "--threads", str(threads),
                "--repeats", str(self.repeats)]  # fmt: skip
        if self.calibration:
            args += ["--calibration", self.calibration]
        return shlex.join(args)


@dataclass
class _Cache:
    """Artifacts shared between points: students per (rank, steps), exports per precision too."""

    cfg: SweepConfig
    teacher: MaskedLayer
    calib: Any
    workdir: Path
    threads: int
    students: dict[tuple[float, int], tuple[MaskedLayer, dict[str, Any]]] = field(default_factory=dict)
    exports: dict[tuple[float, int, str], Path] = field(default_factory=dict)

    def student(self, r: float, steps: int) -> tuple[MaskedLayer, dict[str, Any]]:
        if (r, steps) in self.students:
            return self.students[(r, steps)]
        info: dict[str, Any] = {}
        if r >= 1.0:
            model = self.teacher
        elif steps == 0:
            from attn_export.compress.lowrank import LowRankConfig, low_rank_

            model = copy.deepcopy(self.teacher)
            x, kpm = self.calib.calib.to_torch()
            info["low_rank"] = low_rank_(model, LowRankConfig(rank_ratio=r, targets=self.cfg.low_rank_targets, method="activation"), x, kpm).to_dict()
        else:
            from attn_export.compress.distill import DistillConfig, distill_

            base, base_info = self.student(r, 0)
            model = copy.deepcopy(base)
            summary = distill_(model, self.teacher, self.calib.calib, self.calib.val, DistillConfig(steps=steps, seed=self.cfg.seed, progress=False))
            info = {**base_info, "distill": summary.to_dict()}
        self.students[(r, steps)] = (model.eval(), info)
        return self.students[(r, steps)]

    def onnx(self, p: SweepPoint) -> Path:
        key = (p.rank_ratio, p.distill_steps, p.precision)
        if key not in self.exports:
            from attn_export.export import ExportSpec, export_onnx

            path = self.workdir / f"r{p.rank_ratio:g}_d{p.distill_steps}_{p.precision}.onnx"
            export_onnx(self.student(p.rank_ratio, p.distill_steps)[0], path, ExportSpec(precision=p.precision))
            self.exports[key] = path
        return self.exports[key]

    def artifact(self, p: SweepPoint) -> Path:
        src = self.onnx(p)
        if p.int8 == "none":
            return src
        dst = self.workdir / f"{p.key}.onnx"
        if p.int8 == "dynamic":
            from attn_export.compress.quant_layer import quantize_dynamic_layer

            quantize_dynamic_layer(self.student(p.rank_ratio, p.distill_steps)[0], dst)
        else:
            from attn_export.compress.quant_static import (
                StaticQuantSpec,
                quantize_static_onnx,
            )

            quantize_static_onnx(src, dst, self.calib.calib, StaticQuantSpec(method=p.calib_method or "minmax"))
        return dst


def _load_calibration(cfg: SweepConfig, workdir: Path) -> Any:
    from attn_export.compress.calib_data import (
        default_calibration_path,
        generate_calibration,
        load_calibration,
    )
    from attn_export.errors import DataError

    if cfg.calibration:
        return load_calibration(cfg.calibration, d_model=cfg.d_model)
    try:
        path = default_calibration_path(cfg.d_model)
    except DataError:  # no shipped set for this width: a seeded synthetic one, identical on every run
        path = generate_calibration(workdir / f"calib_d{cfg.d_model}.npz", cfg.d_model, n_calib=16, n_val=4, seed=cfg.seed)
    return load_calibration(path, d_model=cfg.d_model)


def _val_feed(calib: Any) -> dict[str, np.ndarray]:
    val = calib.val
    kpm = val.key_padding_mask if val.key_padding_mask is not None else np.ones(val.x.shape[:2], np.int32)
    return {"x": np.ascontiguousarray(val.x, np.float32), "key_padding_mask": np.ascontiguousarray(kpm, np.int32)}


def _evaluate(cache: _Cache, p: SweepPoint, eager: EagerRunner, ref: np.ndarray, val: dict[str, np.ndarray], lat_feed: dict[str, np.ndarray]) -> dict[str, Any]:
    from attn_export.benchmark.flops import count_module_flops

    path = cache.artifact(p)
    student, info = cache.student(p.rank_ratio, p.distill_steps)
    runner = OrtRunner(SessionFromOnnx(path, providers=["cpu"], intra_op_threads=cache.threads), name=p.key)
    with runner:
        acc = accuracy(ref, runner.infer(val)["y"])
        lat = time_runners({"artifact": runner, "eager": eager}, lat_feed, warmup=cache.cfg.warmup, repeats=cache.cfg.repeats, batch=cache.cfg.batch)
    return {
        "key": p.key, **asdict(p), "accuracy": asdict(acc),
        "latency_ms": {k: asdict(v) for k, v in lat.items()}, "speedup_vs_eager": lat["eager"].p50 / lat["artifact"].p50,
        "relative_latency": lat["artifact"].p50 / lat["eager"].p50,
        "size_bytes": path.stat().st_size, "params": sum(t.numel() for t in student.parameters()),
        "gflop": count_module_flops(student, cache.cfg.seq_len, cache.cfg.batch).total / 1e9,
        "recipe": cache.cfg.recipe(p, cache.threads), "details": info,
    }  # fmt: skip


def run_sweep(cfg: SweepConfig, workdir: str | os.PathLike[str] | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Evaluate every grid point; returns the JSON-ready result with the Pareto front's keys."""
    say = progress or (lambda msg, done, total: log.info("[%d/%d] %s", done, total, msg))
    threads = cfg.threads or os.cpu_count() or 1
    set_threads(threads)
    points = cfg.points()
    teacher = MaskedLayer(build_layer("transformer", cfg.d_model, cfg.heads, mask="padding", seed=cfg.seed), "padding")
    rng = np.random.default_rng(cfg.seed + 11)
    lat_feed = {"x": rng.standard_normal((cfg.batch, cfg.seq_len, cfg.d_model)).astype(np.float32),
                "key_padding_mask": np.ones((cfg.batch, cfg.seq_len), np.int32)}  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory(prefix="attn-sweep-") as tmp:
        work = Path(workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        cache = _Cache(cfg, teacher, _load_calibration(cfg, work), work, threads)
        val = _val_feed(cache.calib)
        eager = EagerRunner(teacher, teacher.input_names, ["y"], name="eager-fp32")
        ref = eager.infer(val)["y"]
        for i, p in enumerate(points):
            say(f"{p.key}", i, len(points))
            results.append(_evaluate(cache, p, eager, ref, val, lat_feed))
        say("done", len(points), len(points))
    pts = [ParetoPoint(r["key"], r["relative_latency"], r["accuracy"]["sqnr_db"]) for r in results]
    front = [results[i]["key"] for i in pareto_front(pts)]
    for r in results:
        r["pareto"] = r["key"] in front
    return {"format": SWEEP_FORMAT, "config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()},
            "threads": threads, "accuracy_metric": "sqnr_db", "points": results, "pareto": front}  # fmt: skip


PARETO_COLUMNS = ("config", "cosine", "SQNR dB", "p50 ms", "x eager", "params", "MiB", "recipe")


def pareto_rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    """The non-dominated configurations, fastest first, as table rows."""
    by_key = {r["key"]: r for r in result["points"]}
    rows = []
    for key in result["pareto"]:
        r = by_key[key]
        a = r["accuracy"]
        rows.append((key, f"{a['cosine']:.6f}", f"{a['sqnr_db']:.1f}", f"{r['latency_ms']['artifact']['p50']:.2f}",
                     f"{r['speedup_vs_eager']:.2f}x", str(r["params"]), f"{r['size_bytes'] / 2**20:.2f}", r["recipe"]))  # fmt: skip
    return rows


def write_sweep(result: dict[str, Any], out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """sweep.json (every point), pareto.md (the front with recipes) and pareto.png, atomically."""
    import json

    from attn_export.validate.plots import plot_pareto
    from attn_export.validate.report import atomic_write_text

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"sweep.json": atomic_write_text(out / "sweep.json", json.dumps(result, indent=2) + "\n")}
    lines = [f"# Sweep: Pareto front ({len(result['pareto'])} of {len(result['points'])} configurations)", "",
             "Accuracy: SQNR / cosine of the ONNX Runtime output vs eager fp32 on the validation split. Latency: p50, and the",
             "front uses it relative to eager timed round-robin in the same run (robust to machine load drifting during the sweep).", "",
             "| " + " | ".join(PARETO_COLUMNS) + " |", "|" + "---|" * len(PARETO_COLUMNS)]  # fmt: skip
    lines += ["| " + " | ".join(r[:-1]) + f" | `{r[-1]}` |" for r in pareto_rows(result)]
    files["pareto.md"] = atomic_write_text(out / "pareto.md", "\n".join(lines) + "\n")
    pts = [ParetoPoint(r["key"], r["relative_latency"], r["accuracy"]["sqnr_db"]) for r in result["points"]]
    png = plot_pareto(pts, out / "pareto.png", title="Sweep: accuracy vs latency (ONNX Runtime CPU)", xlabel="latency relative to eager fp32 (p50 ratio, same run)")
    if png is not None:
        files["pareto.png"] = png
    return files
