"""The ``attn-export`` job: build a layer, compress it, export it, validate every artifact.

``run_pipeline(PipelineConfig(...))`` is what the CLI calls. Each step appends a ``Stage``
to the report (see ``attn_export.stages``), so compression and engine stages plug in
without changing the schema:

    onnx-<precision>  -> lowrank -> lowrank+distill -> int8-{static,dynamic,torchao}
    -> static TensorRT check -> engine -> Jetson bundle / Triton repository
"""

from __future__ import annotations

import logging
import os
import platform
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from attn_export import __version__
from attn_export.errors import ConfigError
from attn_export.export import ExportSpec, export_onnx
from attn_export.export.targets import TARGETS, Target, export_spec_for, get_target
from attn_export.layers import LAYER_NAMES, MaskedLayer, build_layer, supported_masks
from attn_export.layers.projections import check_heads
from attn_export.runtime import EagerRunner
from attn_export.runtime.base import Feed
from attn_export.runtime.trt_spec import EngineSpec, ShapeProfile
from attn_export.stages.context import Progress, StageContext
from attn_export.validate.evaluate import reference_outputs
from attn_export.validate.latency import set_threads
from attn_export.validate.report import Report
from attn_export.validate.tolerances import tolerance_for

__all__ = ["PipelineConfig", "run_pipeline", "random_feeds", "split_feeds", "check_output_dir"]

log = logging.getLogger(__name__)


@dataclass
class PipelineConfig:
    """Everything one ``attn-export`` run needs; validated before any work starts."""

    layer: str = "transformer"
    d_model: int = 512
    heads: int = 8
    mask: str = "padding"
    seq_len: int = 128
    batch: int = 8
    opset: int | None = None  # None: the target's opset
    attention: str | None = None  # None: the target's attention form
    precision: str = "fp32"
    out: Path = field(default_factory=lambda: Path("attn-export-out"))
    seed: int = 0
    threads: int | None = None
    warmup: int = 3
    repeats: int = 20
    validation_batches: int = 2
    # compression
    low_rank: float | None = None
    low_rank_method: str = "activation"
    low_rank_targets: str = "q,k,v,o"
    distill: int | None = None
    quantize: str | None = None
    int8_mode: str = "auto"
    calib: Path | None = None
    calib_method: str = "minmax"
    smoothquant: float | None = None
    # deployment
    target: str = "ort-cpu"
    trt_version: str | None = None
    engine: EngineSpec | None = None
    build_engine: bool = False
    bundle: Path | None = None
    triton: Path | None = None
    render: bool = True  # report.md + self-contained report.html with plots

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if self.layer not in LAYER_NAMES:
            raise ConfigError(f"unknown layer {self.layer!r}; choose one of {', '.join(LAYER_NAMES)}")
        if self.mask not in supported_masks(self.layer):
            raise ConfigError(
                f"layer {self.layer!r} supports --mask {'|'.join(supported_masks(self.layer))}, got {self.mask!r}"
            )
        for name in ("seq_len", "batch", "repeats", "validation_batches"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ConfigError(f"--warmup must be >= 0, got {self.warmup}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {self.threads}")
        check_heads(self.d_model, self.heads)
        if self.target not in TARGETS:
            raise ConfigError(f"expected --target in {', '.join(TARGETS)}, got {self.target!r}")
        if self.quantize not in (None, "int8"):
            raise ConfigError(f"expected --quantize int8, got {self.quantize!r}")
        if self.low_rank is not None and not 0.0 < self.low_rank < 1.0:
            raise ConfigError(f"expected --low-rank RATIO in (0, 1), got {self.low_rank}; use e.g. --low-rank 0.5")
        if self.distill is not None and self.low_rank is None:
            raise ConfigError("--distill trains a compressed student; add --low-rank RATIO")
        if self.distill is not None and self.distill < 1:
            raise ConfigError(f"expected --distill STEPS >= 1, got {self.distill}")
        if self.calib is not None and not self.compresses:
            raise ConfigError("--calib is used by --low-rank/--distill/--quantize; add one of them or drop --calib")
        if self.bundle is not None and self.target != "jetson":
            raise ConfigError(f"--bundle writes a Jetson bundle; add --target jetson (got --target {self.target})")
        if self.build_engine and not self.target_info.is_tensorrt:
            raise ConfigError(f"--build-engine needs a TensorRT target; use --target tensorrt or jetson (got {self.target})")
        if self.quantize and self.int8_mode not in ("auto", "static", "dynamic", "torchao"):
            raise ConfigError(f"expected --int8-mode auto|static|dynamic|torchao, got {self.int8_mode!r}")
        self.export_spec()  # validates attention/opset/precision

    @property
    def compresses(self) -> bool:
        return self.low_rank is not None or self.quantize is not None

    @property
    def target_info(self) -> Target:
        return get_target(self.target)

    def export_spec(self, precision: str | None = None) -> ExportSpec:
        overrides: dict[str, object] = {}
        if self.attention is not None:
            overrides["attention"] = self.attention
        if self.opset is not None:
            overrides["opset"] = self.opset
        if "attention" in overrides and "opset" not in overrides:
            overrides["opset"] = None  # let the form pick its opset
        return export_spec_for(self.target_info, precision or self.precision, **overrides)

    def engine_spec(self) -> EngineSpec:
        """The engine options; the default profile covers 1x1 .. 4x the run's shapes."""
        precision = "int8" if self.quantize else self.precision
        spec = self.engine or EngineSpec(precision=precision)
        if spec.profiles is None:
            opt = (self.batch, self.seq_len)
            spec = EngineSpec(**{**spec.__dict__, "profiles": ShapeProfile((1, 1), opt, (4 * self.batch, 4 * self.seq_len))})
        if spec.precision != precision:
            spec = EngineSpec(**{**spec.__dict__, "precision": precision})
        return spec

    @property
    def resolved_threads(self) -> int:
        return self.threads or os.cpu_count() or 1


def check_output_dir(out: Path) -> None:
    """Fail before any work if ``out`` cannot be created or written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
            pass
    except OSError as err:
        raise ConfigError(f"output directory {out} is not writable ({err.strerror}); pass a writable --out DIR") from None


def random_feeds(layer: MaskedLayer, batch: int, seq: int, d_model: int, seed: int, count: int) -> list[Feed]:
    """Inputs at the run's shapes (not the export example's), padded tails included."""
    rng = np.random.default_rng(seed)
    feeds: list[Feed] = []
    for _ in range(count):
        feed: dict[str, np.ndarray] = {"x": rng.standard_normal((batch, seq, d_model)).astype(np.float32)}
        if layer.mask == "padding":
            lengths = rng.integers(max(1, seq // 2), seq + 1, size=batch)
            feed["key_padding_mask"] = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
        feeds.append(feed)
    return feeds


def split_feeds(layer: MaskedLayer, x: np.ndarray, key_padding_mask: np.ndarray | None, batch: int) -> list[Feed]:
    """Cut a validation split into feeds of ``batch`` sequences."""
    feeds: list[Feed] = []
    for start in range(0, len(x), batch):
        feed: dict[str, np.ndarray] = {"x": np.ascontiguousarray(x[start : start + batch], dtype=np.float32)}
        if layer.mask == "padding":
            kpm = key_padding_mask[start : start + batch] if key_padding_mask is not None else np.ones(feed["x"].shape[:2])
            feed["key_padding_mask"] = np.ascontiguousarray(kpm, dtype=np.int32)
        feeds.append(feed)
    return feeds


def _environment(threads: int) -> dict[str, object]:
    import onnxruntime

    return {
        "attn_export": __version__,
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
    }


def run_pipeline(cfg: PipelineConfig, progress: Progress | None = None) -> Report:
    """Run every requested stage; writes the artifacts and report.json into ``cfg.out``."""
    say = progress or (lambda msg: log.info(msg))
    check_output_dir(cfg.out)
    threads = cfg.resolved_threads
    set_threads(threads)
    target = cfg.target_info
    say(f"building {cfg.layer} (d_model={cfg.d_model}, heads={cfg.heads}, mask={cfg.mask}, seed={cfg.seed})")
    layer = MaskedLayer(build_layer(cfg.layer, cfg.d_model, cfg.heads, mask=cfg.mask, seed=cfg.seed), cfg.mask)
    params = sum(p.numel() for p in layer.parameters())
    data = None
    if cfg.compresses:
        from attn_export.compress import default_calibration_path, load_calibration

        calib_path = cfg.calib or default_calibration_path(cfg.d_model)
        data = load_calibration(calib_path, cfg.d_model)
        say(f"calibration data: {data.describe()}")
    report = Report(
        model={"layer": cfg.layer, "d_model": cfg.d_model, "heads": cfg.heads, "params": params, "mask": cfg.mask},
        inputs={
            "batch": cfg.batch,
            "seq_len": cfg.seq_len,
            "seed": cfg.seed,
            "accuracy_data": f"validation split of {data.source}" if data else "random normal",
            "latency_data": f"random normal [{cfg.batch}, {cfg.seq_len}, {cfg.d_model}]",
        },
        environment=_environment(threads),
    )
    report.environment["target"] = target.name
    eager = EagerRunner(layer, layer.input_names, ["y"], name="eager-fp32")
    if data is not None:
        feeds = split_feeds(layer, data.val.x, data.val.key_padding_mask, cfg.batch)
    else:
        feeds = random_feeds(layer, cfg.batch, cfg.seq_len, cfg.d_model, cfg.seed + 1, cfg.validation_batches)
    latency_feed = random_feeds(layer, cfg.batch, cfg.seq_len, cfg.d_model, cfg.seed + 2, 1)[0]
    ctx = StageContext(
        eager, feeds, reference_outputs(eager, feeds), latency_feed, cfg.out, report, threads, cfg.batch,
        cfg.warmup, cfg.repeats, say,
    )  # fmt: skip

    spec = cfg.export_spec()
    model_path = cfg.out / "model.onnx"
    say(f"exporting {model_path} (target {target.name}: {spec.attention}, {spec.precision}, opset {spec.resolved_opset})")
    result = export_onnx(layer, model_path, spec)
    say(f"exported: {result.describe()}")
    base = ctx.evaluate(
        f"onnx-{spec.precision}", ctx.ort(model_path, "ort-cpu"), precision=spec.precision,
        tolerance=tolerance_for(spec.precision), artifact=model_path, size_bytes=result.size_bytes, params=params,
        details={"export": result.to_dict(), "runtime": {"backend": "onnxruntime", "providers": ["CPUExecutionProvider"]}},
    )  # fmt: skip
    deploy_onnx, deploy_precision = str(model_path), cfg.precision

    if data is not None:
        deploy_onnx, deploy_precision = _compress(cfg, ctx, layer, data, spec, base, deploy_onnx, deploy_precision)

    if target.is_tensorrt:
        from attn_export.stages.deploy import (
            build_and_validate_engine,
            check_for_target,
        )

        engine_spec = cfg.engine_spec()
        trt_version = cfg.trt_version or target.trt_version or "10.14"
        report.selection.setdefault("deploy", {})["onnx"] = deploy_onnx
        report.selection["deploy"]["trt_check"] = check_for_target(ctx, deploy_onnx, target, engine_spec, trt_version)
        if cfg.build_engine:
            build_and_validate_engine(ctx, deploy_onnx, engine_spec, f"trt-{engine_spec.precision}")
        if cfg.bundle is not None:
            from attn_export.stages.deploy import write_bundle

            write_bundle(ctx, deploy_onnx, cfg.bundle, engine_spec, deploy_precision, trt_version)
    if cfg.triton is not None:
        from attn_export.stages.deploy import write_triton

        engine_path = str(Path(deploy_onnx).with_suffix(".engine")) if cfg.build_engine else None
        write_triton(ctx, deploy_onnx, cfg.triton, cfg.engine_spec(), engine_path)
    report.write(cfg.out / "report.json")
    if cfg.render:
        from attn_export.validate.render import write_reports

        say("rendering report.md and report.html")
        write_reports(cfg.out / "report.json", cfg.out)
    return report


def _compress(
    cfg: PipelineConfig, ctx: StageContext, layer: MaskedLayer, data, spec: ExportSpec, base, deploy_onnx: str, deploy_precision: str
) -> tuple[str, str]:
    """Low-rank, distillation and int8 stages; returns the ONNX model to deploy and its precision."""
    from attn_export.compress import DistillConfig, LowRankConfig, StaticQuantSpec
    from attn_export.stages.compress import LOSSY_TOLERANCE, run_distill, run_low_rank
    from attn_export.stages.int8 import run_int8, select_int8

    fp32_spec = cfg.export_spec("fp32") if spec.precision != "fp32" else spec
    subject, subject_onnx, prefix = layer, deploy_onnx, "int8"
    if spec.precision != "fp32":
        subject_onnx = str(ctx.out / "model.fp32.onnx")
        export_onnx(layer, subject_onnx, fp32_spec)
    if cfg.low_rank is not None:
        config = LowRankConfig(rank_ratio=cfg.low_rank, method=cfg.low_rank_method, targets=tuple(cfg.low_rank_targets.split(",")))
        student = run_low_rank(ctx, layer, data, config, fp32_spec, base)
        if cfg.distill is not None:
            student = run_distill(ctx, layer, student, data, DistillConfig(steps=cfg.distill, seed=cfg.seed), fp32_spec)
        subject, subject_onnx, prefix = student.layer, student.onnx_path, "lowrank-int8"
        deploy_onnx, deploy_precision = subject_onnx, "fp32"
    if cfg.quantize == "int8":
        static_spec = StaticQuantSpec(
            method=cfg.calib_method, smoothquant_alpha=cfg.smoothquant,
            quantize_attention_bmm=cfg.target_info.quantize_attention_bmm,
        )  # fmt: skip
        tolerance = tolerance_for("int8") if subject is layer else LOSSY_TOLERANCE
        stages = run_int8(
            ctx, subject, subject_onnx, data, cfg.int8_mode, static_spec, cfg.target_info, tolerance, fp32_spec, prefix
        )
        best = select_int8(ctx, stages, key="int8")
        if best is not None:
            deploy_onnx, deploy_precision = ctx.report.selection["int8"]["artifact"], "int8"
    return deploy_onnx, deploy_precision
