"""``attn-export sweep``: a grid of main-command configurations, and its accuracy/latency Pareto front.

Every grid point is a ``RunConfig``, exactly what ``attn-export`` with the same options would
run, planned by ``make_plan`` and built by ``runner.run_plans`` as one merged run: a stage
several points share (a factorization, a distillation, an export) is built once, every
artifact is timed in *one* round-robin pass with eager, and each is judged on the report
split against its own tolerance key, like any pipeline run. The axes take the main command's
option values (comma lists), plus ``none`` for an option left off: ``--low-rank none,0.5``,
``--distill none,40``, ``--quantize none,int8``, ``--int8-mode static,dynamic``,
``--calib-method``, ``--precision``.

Each point carries its recipe: the main ``attn-export`` command that rebuilds exactly that
point. Accuracy is deterministic (seeded low-rank, distillation and calibration, a fixed
thread count), so a recipe reproduces its accuracy exactly and its latency within noise.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from attn_export.errors import ConfigError
from attn_export.validate.pareto import ParetoPoint, pareto_front
from attn_export.vocab.choices import CALIB_METHODS
from attn_export.vocab.precisions import PRECISIONS, precision_names

__all__ = ["MAX_POINTS", "POINT_DEFAULTS", "QUICK", "SweepConfig", "SweepPoint", "pareto_rows", "run_sweep", "with_calibration", "write_sweep"]

log = logging.getLogger(__name__)

# A grid larger than this asks for --yes (or --max-points): each point is a whole pipeline run.
MAX_POINTS = 64
# What ``attn-export sweep`` times each point with unless told (``--quick``: 5 repeats): fewer runs
# than one main command (RunConfig's 3 and 20), because a grid runs many. Its options read them here.
POINT_DEFAULTS: dict[str, int] = {"warmup": 2, "repeats": 10}
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class SweepPoint:
    """One configuration of the grid, in the main command's terms (None = the option left off)."""

    low_rank: float | None
    distill: int | None
    quantize: str | None
    int8_mode: str | None  # with quantize only
    calib_method: str | None  # static routes only
    precision: str

    @property
    def key(self) -> str:
        lr = "full" if self.low_rank is None else f"r{self.low_rank:g}" + (f"-d{self.distill}" if self.distill else "")
        if self.quantize is None:
            return f"{lr}-{self.precision}"
        mode = self.int8_mode or "auto"
        return f"{lr}-{mode}" + (f"-{self.calib_method}" if self.calib_method else "")

    def run_options(self) -> dict[str, Any]:
        """The RunConfig fields this point sets."""
        opts: dict[str, Any] = {"low_rank": self.low_rank, "distill": self.distill, "quantize": self.quantize, "precision": self.precision}
        if self.quantize is not None:
            opts["int8_mode"] = self.int8_mode or "auto"
        if self.calib_method is not None:
            opts["calib_method"] = self.calib_method
        return opts


# The default --precision axis: the export floats ONNX Runtime runs (the sweep's default target is
# ort-cpu); a float only TensorRT runs (bf16) is a value to ask for, with --target and --gpu-arch.
DEFAULT_FLOATS: tuple[str, ...] = tuple(n for n in precision_names(export_float=True) if "onnxruntime" in PRECISIONS[n].runtimes)


# ``sweep --quick``: the small grid (its help is written from it) and its timed runs per point.
QUICK: dict[str, tuple[Any, ...]] = {"low_rank": (None, 0.5), "distill": (None, 40), "quantize": (None, "int8"), "int8_mode": ("dynamic", "static"),
                                     "calib_method": ("minmax",), "precision": DEFAULT_FLOATS}  # fmt: skip
QUICK_REPEATS = 5


@dataclass(frozen=True)
class SweepConfig:
    """The grid (main-command option values; None = off) and the run settings every point shares."""

    low_rank: tuple[float | None, ...] = (None, 0.75, 0.5, 0.25)
    distill: tuple[int | None, ...] = (None, 100, 300)
    quantize: tuple[str | None, ...] = (None, "int8")
    int8_mode: tuple[str, ...] = ("dynamic", "static")
    calib_method: tuple[str, ...] = CALIB_METHODS
    precision: tuple[str, ...] = DEFAULT_FLOATS
    base: dict[str, Any] = field(default_factory=dict)  # RunConfig fields of every point (subject, shapes, threads, repeats, --calib...)
    max_points: int = MAX_POINTS

    def __post_init__(self) -> None:
        if not self.points():
            raise ConfigError("the sweep grid is empty (distillation needs --low-rank, int8 needs --precision fp32); widen --low-rank or --precision")
        for point in self.points():  # every point is a valid main command (the flags' own one-line errors)
            self.run_config(point)
        if len(self.points()) > self.max_points:
            raise ConfigError(f"the sweep grid has {len(self.points())} points (each a whole pipeline run) > --max-points {self.max_points}; "
                              "narrow an axis, or pass --yes to run it anyway")  # fmt: skip

    @classmethod
    def quick(cls, **overrides: Any) -> SweepConfig:
        """The small grid of ``sweep --quick``; an axis (or setting) in ``overrides`` replaces the preset's (``--quick --low-rank 0.5``)."""
        base = {"repeats": QUICK_REPEATS, **overrides.pop("base", {})}
        return cls(**{**QUICK, **overrides, "base": base})

    def points(self) -> list[SweepPoint]:
        """The grid without meaningless combinations (distillation without low-rank, int8 of fp16, calibration of dynamic)."""
        out = []
        for lr in self.low_rank:
            for steps in self.distill:
                if lr is None and steps is not None:
                    continue
                for prec in self.precision:
                    for q in self.quantize:
                        if q is not None and prec != "fp32":
                            continue
                        for mode in self.int8_mode if q is not None else (None,):
                            methods = self.calib_method if mode in ("static", "auto") else (None,)
                            for method in methods:
                                out.append(SweepPoint(lr, steps, q, mode, method, prec))
        return list(dict.fromkeys(out))

    def run_config(self, point: SweepPoint | None = None, out: Path | None = None) -> Any:
        """The ``RunConfig`` of ``point`` (validated: a bad axis value fails as the main command's flag would).

        A point that neither factorizes nor quantizes takes no ``--calib`` (the main command refuses one there).
        """
        from attn_export.config.run import RunConfig

        opts = dict(self.base, render=False, **(point.run_options() if point else {}))
        compresses = point is not None and (point.low_rank is not None or point.quantize is not None)
        if not compresses:
            opts.pop("calib", None)
        if out is not None:
            opts["out"] = out
        return RunConfig(**opts)

    def recipe(self, point: SweepPoint, threads: int) -> str:
        """The main ``attn-export`` command that rebuilds ``point`` with this sweep's settings."""
        args = ["attn-export"]
        compresses = point.low_rank is not None or point.quantize is not None
        for name, value in {**self.base, **point.run_options(), "threads": threads}.items():
            if value is None or value is False or name in ("out", "render") or (name == "calib" and not compresses):
                continue
            flag = "--" + name.replace("_", "-")
            args += [flag] if value is True else [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        return shlex.join(args)


def _measured(result: Any, point: SweepPoint) -> str:
    """The stage a point stands for: the selected route, else its (only) candidate, else what the plan deploys."""
    plan = result.plan
    if plan.deploy_source.startswith("select:"):  # the selection whose file the plan ships (8-bit, else the encoder form)
        key = plan.deploy_source.split(":", 1)[1]
        sel = next(s for s in plan.selections if s.key == key)
        return str(result.report.selection.get(key, {}).get("stage") or sel.candidates[0])
    return plan.deployed_stage or plan.steps[0].name


def with_calibration(cfg: SweepConfig, folder: Path) -> SweepConfig:
    """``cfg`` with ``--calib`` set where a reference layer of a width without a shipped set needs one (generated, seeded, into ``folder``)."""
    if cfg.base.get("checkpoint") is not None or cfg.base.get("calib") is not None:
        return cfg
    if not any(p.low_rank is not None or p.quantize is not None for p in cfg.points()):
        return cfg
    from attn_export.compress.calib.data import shipped_or_generated

    folder.mkdir(parents=True, exist_ok=True)
    calib = shipped_or_generated(cfg.run_config().resolved_d_model, folder, int(cfg.base.get("seed", 0)))
    return replace(cfg, base={**cfg.base, "calib": calib})


def run_sweep(cfg: SweepConfig, workdir: str | os.PathLike[str] | None = None, progress: Progress | None = None,
              save_models: Path | None = None, calib_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run every grid point as one merged pipeline run; returns the JSON-ready result with the Pareto front.

    ``save_models``: a folder that receives the model of every Pareto point (``<key>.onnx``).
    ``calib_dir``: where a generated calibration set is kept (default: the work folder), so the
    recipes' ``--calib`` still names it after the sweep.
    """
    from attn_export.campaigns.bench.flops import count_module_flops
    from attn_export.pipeline.plan import make_plan
    from attn_export.host.process import ProcessSettings, process_settings
    from attn_export.pipeline.runner import RunSettings, run_plans
    from attn_export.subjects import make_subject
    from attn_export.validate.schema import SCHEMA_VERSIONS

    say = progress or (lambda msg, done, total: log.info("[%d/%d] %s", done, total, msg))
    points = cfg.points()
    with tempfile.TemporaryDirectory(prefix="attn-sweep-") as tmp:
        work = Path(workdir or tmp)
        cfg = with_calibration(cfg, Path(calib_dir) if calib_dir is not None else work)
        configs = [cfg.run_config(p, work / "points" / p.key) for p in points]
        # every point is judged on one subject's data: that of a point that loads calibration data, if any does
        base = next((c for c in configs if c.compresses), configs[0])
        threads = base.resolved_threads
        with process_settings(ProcessSettings(threads=threads)):
            subject = make_subject(base)
            plans = [make_plan(c) for c in configs]
            say(f"building {len({pl.content_key(s.name) for pl in plans for s in pl.steps})} artifacts for {len(points)} configurations", 0, len(points))
            results = run_plans(plans, subject, RunSettings(threads, lambda msg: say(msg, 0, len(points)), warmup=base.warmup, repeats=base.repeats))
        rows = []
        for i, (p, res) in enumerate(zip(points, results)):
            name = _measured(res, p)
            stage, art = res.report.stage(name), res.artifacts[name]
            say(p.key, i + 1, len(points))
            lat = stage.latency_ms
            rows.append({
                "key": p.key, **asdict(p), "stage": name, "accuracy": asdict(stage.accuracy), "passed": stage.passed, "tolerance": stage.tolerance,
                "latency_ms": {"artifact": asdict(lat["artifact"]), "eager": asdict(lat["eager"])}, "speedup_vs_eager": stage.speedup_vs_eager,
                "relative_latency": lat["artifact"].p50 / lat["eager"].p50, "size_bytes": art.size_bytes, "params": art.params,
                "gflop": count_module_flops(art.module, base.seq_len, base.batch).total / 1e9, "recipe": cfg.recipe(p, threads),
                "details": {k: v for k, v in stage.details.items() if k in ("low_rank", "distill", "embedding", "mixed_precision")},
                "artifact": str(art.path) if art.path else None,
            })  # fmt: skip
        pts = [ParetoPoint(r["key"], r["relative_latency"], r["accuracy"]["sqnr_db"]) for r in rows]
        front = [rows[i]["key"] for i in pareto_front(pts)]
        for r in rows:
            r["pareto"] = r["key"] in front
            if save_models is not None and r["pareto"] and r["artifact"]:
                save_models.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(r["artifact"], save_models / f"{r['key']}.onnx")
                r["saved_model"] = str(save_models / f"{r['key']}.onnx")
            r.pop("artifact")
    return {"schema_version": SCHEMA_VERSIONS["sweep"], "kind": "sweep",
            "config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(replace(cfg, base={k: str(v) if isinstance(v, Path) else v
                                                                                                         for k, v in cfg.base.items()})).items()},
            "subject": subject.model_info(), "threads": threads, "accuracy_metric": "sqnr_db",
            "cpu_int8_encoding": next((pl.encoding.to_dict() for pl in plans if pl.encoding is not None), None),
            "points": rows, "pareto": front}  # fmt: skip


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
    """sweep.json (every point, validated by its schema), pareto.md (the front with recipes) and pareto.png, atomically."""
    import json

    from attn_export.validate.plots import plot_pareto
    from attn_export.validate.report import atomic_write_text
    from attn_export.validate.schema import validate_sweep

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    validate_sweep(result, str(out / "sweep.json"))
    files = {"sweep.json": atomic_write_text(out / "sweep.json", json.dumps(result, indent=2) + "\n")}
    lines = [f"# Sweep: Pareto front ({len(result['pareto'])} of {len(result['points'])} configurations)", "",
             "Accuracy: SQNR / cosine of the ONNX Runtime output vs the reference on the report split. Latency: p50, and the",
             "front uses it relative to eager timed round-robin in the same run (robust to machine load drifting during the sweep).",
             "Each recipe is the main command that rebuilds the point.", "",
             "| " + " | ".join(PARETO_COLUMNS) + " |", "|" + "---|" * len(PARETO_COLUMNS)]  # fmt: skip
    lines += ["| " + " | ".join(r[:-1]) + f" | `{r[-1]}` |" for r in pareto_rows(result)]
    files["pareto.md"] = atomic_write_text(out / "pareto.md", "\n".join(lines) + "\n")
    pts = [ParetoPoint(r["key"], r["relative_latency"], r["accuracy"]["sqnr_db"]) for r in result["points"]]
    png = plot_pareto(pts, out / "pareto.png", title="Sweep: accuracy vs latency (ONNX Runtime CPU)", xlabel="latency relative to eager fp32 (p50 ratio, same run)")
    if png is not None:
        files["pareto.png"] = png
    return files
