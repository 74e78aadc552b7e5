"""``attn-export sweep``: a grid over the compression choices, and its accuracy/latency Pareto front.

Axes: low-rank ratio (1.0 = none), distillation steps, int8 route (none | ONNX Runtime
dynamic | static) with the static route's calibration method, and export precision. The grid
becomes one plan of the pipeline's own steps (``attn_export.plan.Step``: exports, and the
registry's LowRank / Distill / Int8Static / Int8Dynamic), built by the runner; a step that
several points share (a factorization, a distillation, an export) is built once. Every
artifact is then timed in *one* round-robin pass with eager and judged on the report split
(never used to fit or decide), like any pipeline run.

Each point carries its recipe: the single-point ``attn-export sweep`` command that rebuilds
exactly that configuration. Accuracy is deterministic (seeded low-rank, distillation and
calibration, a fixed thread count), so a recipe reproduces its accuracy exactly and its
latency within machine noise.
"""

from __future__ import annotations

import logging
import os
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from attn_export.errors import ConfigError
from attn_export.validate.pareto import ParetoPoint, pareto_front
from attn_export.vocabulary import CALIB_METHODS

__all__ = ["SWEEP_INT8", "SWEEP_FORMAT", "SweepConfig", "SweepPoint", "pareto_rows", "run_sweep", "write_sweep"]

log = logging.getLogger(__name__)

SWEEP_FORMAT = "attn-export-sweep/1"
# The sweep's int8 axis: "none" (no int8) or one route; the routes are the vocabulary's ONNX ones.
SWEEP_INT8: tuple[str, ...] = ("none", "dynamic", "static")
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
    int8_modes: tuple[str, ...] = SWEEP_INT8
    calib_methods: tuple[str, ...] = CALIB_METHODS
    precisions: tuple[str, ...] = ("fp32", "fp16")
    low_rank_targets: tuple[str, ...] | None = None  # None: q,k,v,o,ffn for a layer, q,k for a checkpoint
    checkpoint: str | None = None  # sweep a pretrained encoder (DIR or minilm) instead of the reference layer
    layers: str | None = None
    max_texts: int | None = None  # with checkpoint: texts per corpus split
    d_model: int = 512
    heads: int = 8
    seed: int = 0
    batch: int = 8
    seq_len: int = 128
    threads: int | None = None
    warmup: int = 2
    repeats: int = 10
    calibration: str | None = None  # activations (layer) or .txt (checkpoint); default: the shipped data

    def __post_init__(self) -> None:
        checks = [
            (all(0.0 < r <= 1.0 for r in self.rank_ratios), f"expected --rank-ratios in (0, 1] (1 = no low-rank), got {list(self.rank_ratios)}"),
            (all(s >= 0 for s in self.distill_steps), f"expected --distill-steps >= 0, got {list(self.distill_steps)}"),
            (set(self.int8_modes) <= set(SWEEP_INT8), f"expected --int8-modes from {', '.join(SWEEP_INT8)}, got {list(self.int8_modes)}"),
            (set(self.calib_methods) <= set(CALIB_METHODS), f"expected --calib-methods from {', '.join(CALIB_METHODS)}, got {list(self.calib_methods)}"),
            (set(self.precisions) <= {"fp32", "fp16"}, f"expected --precisions from fp32, fp16, got {list(self.precisions)}"),
            (min(self.batch, self.seq_len, self.repeats) >= 1, f"expected positive --batch/--seq-len/--repeats, got {self.batch}/{self.seq_len}/{self.repeats}"),
            (self.threads is None or self.threads >= 1, f"expected --threads >= 1, got {self.threads}"),
            (self.checkpoint is not None or (self.layers is None and self.max_texts is None), "--layers/--max-texts apply to a --checkpoint sweep; add --checkpoint or drop them"),
        ]  # fmt: skip
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        if not self.points():
            raise ConfigError("the sweep grid is empty (distillation needs a rank ratio < 1, int8 needs fp32); widen --rank-ratios or --precisions")

    @classmethod
    def quick(cls, **overrides: Any) -> SweepConfig:
        base = cls(rank_ratios=(1.0, 0.5), distill_steps=(0, 40), int8_modes=SWEEP_INT8, calib_methods=("minmax",), precisions=("fp32", "fp16"), repeats=5)
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

    @property
    def resolved_low_rank_targets(self) -> tuple[str, ...]:
        if self.low_rank_targets is not None:
            return tuple(self.low_rank_targets)
        return ("q", "k") if self.checkpoint else ("q", "k", "v", "o", "ffn")

    def recipe(self, p: SweepPoint, threads: int) -> str:
        """The single-point command that rebuilds ``p`` with this sweep's settings."""
        args = ["attn-export", "sweep", "--low-rank", f"{p.rank_ratio:g}", "--distill", str(p.distill_steps),
                "--int8-mode", p.int8, "--calib-method", p.calib_method or "minmax", "--precision", p.precision,
                "--low-rank-targets", ",".join(self.resolved_low_rank_targets),
                "--seed", str(self.seed), "--batch", str(self.batch), "--seq-len", str(self.seq_len), "--threads", str(threads),
                "--repeats", str(self.repeats)]  # fmt: skip
        if self.checkpoint:
            args += ["--checkpoint", self.checkpoint] + (["--layers", self.layers] if self.layers else [])
            args += ["--max-texts", str(self.max_texts)] if self.max_texts else []
        else:
            args += ["--d-model", str(self.d_model), "--heads", str(self.heads)]
        if self.calibration:
            args += ["--calib", self.calibration]
        return shlex.join(args)


def _steps(cfg: SweepConfig, points: list[SweepPoint], encoding: Any) -> tuple[list[Any], dict[str, str]]:
    """The plan steps that build every point (shared steps once), and point key -> step name."""
    from attn_export.compress.registry import Distill, Int8Dynamic, Int8Static, LowRank
    from attn_export.export import ExportSpec
    from attn_export.plan import ExportStep, Step

    steps: dict[str, Step] = {}

    def add(step: Step) -> str:
        steps.setdefault(step.name, step)
        return step.name

    fp32 = add(Step("full-fp32", ExportStep("fp32", ExportSpec()), "subject", "full_fp32.onnx"))
    of_point: dict[str, str] = {}
    for p in points:
        student = fp32
        if p.rank_ratio < 1.0:
            student = add(Step(f"r{p.rank_ratio:g}-fp32", LowRank(p.rank_ratio, "activation", cfg.resolved_low_rank_targets), fp32, f"r{p.rank_ratio:g}_fp32.onnx"))
            if p.distill_steps:
                student = add(Step(f"r{p.rank_ratio:g}-d{p.distill_steps}-fp32", Distill(p.distill_steps), student,
                                   f"r{p.rank_ratio:g}_d{p.distill_steps}_fp32.onnx"))  # fmt: skip
        if p.int8 == "none" and p.precision == "fp32":
            of_point[p.key] = student
        elif p.int8 == "none":
            of_point[p.key] = add(Step(p.key, ExportStep(p.precision, ExportSpec(precision=p.precision)), student, f"{p.key}.onnx"))
        elif p.int8 == "dynamic":
            of_point[p.key] = add(Step(p.key, Int8Dynamic(per_channel=True, reduce_range=encoding.reduce_range, session_u8u8=encoding.session_u8u8), student, f"{p.key}.onnx"))
        else:
            config = Int8Static(method=p.calib_method or "minmax", reduce_range=encoding.reduce_range, session_u8u8=encoding.session_u8u8)
            of_point[p.key] = add(Step(p.key, config, student, f"{p.key}.onnx"))
    return list(steps.values()), of_point


def _subject(cfg: SweepConfig, workdir: Path) -> Any:
    from attn_export.compress.calib_data import default_calibration_path, generate_calibration
    from attn_export.config import RunConfig
    from attn_export.errors import DataError
    from attn_export.subjects import make_subject
    from attn_export.subjects.layer import LayerSubject

    if cfg.checkpoint:
        run_cfg = RunConfig(checkpoint=cfg.checkpoint, layers=cfg.layers, max_texts=cfg.max_texts, seed=cfg.seed, quantize="int8", batch=cfg.batch, seq_len=cfg.seq_len,
                            threads=cfg.threads, out=workdir, render=False, low_rank_targets=",".join(cfg.resolved_low_rank_targets),
                            calib=Path(cfg.calibration) if cfg.calibration else None)  # fmt: skip
        return make_subject(run_cfg)
    calib = cfg.calibration
    if calib is None:
        try:
            calib = str(default_calibration_path(cfg.d_model))
        except DataError:  # no shipped set for this width: a seeded synthetic one, identical on every run
            calib = str(generate_calibration(workdir / f"calib_d{cfg.d_model}.npz", cfg.d_model, n_calib=16, n_val=4, seed=cfg.seed))
    run_cfg = RunConfig(d_model=cfg.d_model, heads=cfg.heads, mask="padding", seed=cfg.seed, quantize="int8", calib=Path(calib),
                        batch=cfg.batch, seq_len=cfg.seq_len, threads=cfg.threads, out=workdir, render=False)  # fmt: skip
    return LayerSubject(run_cfg)


def run_sweep(cfg: SweepConfig, workdir: str | os.PathLike[str] | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Evaluate every grid point; returns the JSON-ready result with the Pareto front's keys."""
    from attn_export.benchmark.flops import count_module_flops
    from attn_export.compress.int8_encoding import choose_cpu_encoding
    from attn_export.compress.registry import BuildContext
    from attn_export.export import ExportSpec
    from attn_export.export.targets import get_target
    from attn_export.plan import Plan
    from attn_export.process import ProcessSettings, process_settings
    from attn_export.runner import build_artifacts, time_side_by_side

    say = progress or (lambda msg, done, total: log.info("[%d/%d] %s", done, total, msg))
    threads = cfg.threads or os.cpu_count() or 1
    points = cfg.points()
    results = []
    with process_settings(ProcessSettings(threads=threads)), tempfile.TemporaryDirectory(prefix="attn-sweep-") as tmp:
        work = Path(workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        subject = _subject(cfg, work)
        encoding = choose_cpu_encoding("auto")
        steps, of_point = _steps(cfg, points, encoding)
        say(f"building {len(steps)} artifacts for {len(points)} configurations", 0, len(points) + 2)
        build = BuildContext(subject, work, get_target("ort-cpu"), ExportSpec(), threads)
        artifacts = build_artifacts(Plan(steps), build)
        wanted = {k: artifacts[v] for k, v in of_point.items()}
        say("timing every configuration side by side with eager", len(points), len(points) + 2)
        lat, runners = time_side_by_side(subject.eager_runner(), {a.name: a for a in wanted.values()}, subject.latency_feed(),
                                         cfg.warmup, cfg.repeats, cfg.batch)  # fmt: skip
        for i, p in enumerate(points):
            art = wanted[p.key]
            say(p.key, i, len(points))
            judgement = subject.judge(runners[art.name], "report", "fp32")
            mine, eager = lat[art.name], lat["eager"]
            info = {k: v for k, v in art.details.items() if k in ("low_rank", "distill")}
            results.append({
                "key": p.key, **asdict(p), "accuracy": asdict(judgement.accuracy),
                "latency_ms": {"artifact": asdict(mine), "eager": asdict(eager)}, "speedup_vs_eager": eager.p50 / mine.p50,
                "relative_latency": mine.p50 / eager.p50, "size_bytes": art.size_bytes, "params": art.params,
                "gflop": count_module_flops(art.module, cfg.seq_len, cfg.batch).total / 1e9,
                "recipe": cfg.recipe(p, threads), "details": info,
            })  # fmt: skip
        for r in runners.values():
            r.deactivate()
        say("done", len(points) + 2, len(points) + 2)
    pts = [ParetoPoint(r["key"], r["relative_latency"], r["accuracy"]["sqnr_db"]) for r in results]
    front = [results[i]["key"] for i in pareto_front(pts)]
    for r in results:
        r["pareto"] = r["key"] in front
    return {"format": SWEEP_FORMAT, "config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()},
            "subject": subject.model_info(),
            "threads": threads, "accuracy_metric": "sqnr_db", "cpu_int8_encoding": encoding.to_dict(),
            "points": results, "pareto": front}  # fmt: skip


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
