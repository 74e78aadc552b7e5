"""The ``attn-export`` job: build a layer, export it, validate every artifact against eager.

``run_pipeline(PipelineConfig(...))`` is what the CLI calls. Each step appends a ``Stage``
to the report, so compression and engine stages plug in without changing the schema.
"""

from __future__ import annotations

import logging
import os
import platform
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from attn_export import __version__
from attn_export.errors import ConfigError
from attn_export.export import ExportSpec, export_onnx
from attn_export.layers.projections import check_heads
from attn_export.layers import LAYER_NAMES, MaskedLayer, build_layer, supported_masks
from attn_export.runtime import EagerRunner, OrtRunner, SessionFromOnnx
from attn_export.runtime.base import Feed
from attn_export.validate.evaluate import evaluate_stage, reference_outputs
from attn_export.validate.latency import set_threads
from attn_export.validate.report import Report
from attn_export.validate.tolerances import tolerance_for

__all__ = ["PipelineConfig", "run_pipeline", "random_feeds", "check_output_dir"]

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass
class PipelineConfig:
    """Everything one ``attn-export`` run needs; validated before any work starts."""

    layer: str = "transformer"
    d_model: int = 512
    heads: int = 8
    mask: str = "padding"
    seq_len: int = 128
    batch: int = 8
    opset: int | None = None
    attention: str = "decomposed"
    precision: str = "fp32"
    out: Path = field(default_factory=lambda: Path("attn-export-out"))
    seed: int = 0
    threads: int | None = None
    warmup: int = 3
    repeats: int = 20
    validation_batches: int = 2

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
        self.export_spec()  # validates attention/opset/precision

    def export_spec(self) -> ExportSpec:
        return ExportSpec(attention=self.attention, opset=self.opset, precision=self.precision)

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


def random_feeds(
    layer: MaskedLayer, batch: int, seq: int, d_model: int, seed: int, count: int
) -> list[Feed]:
    """Validation inputs at the run's shapes (not the export example's), padded tails included."""
    rng = np.random.default_rng(seed)
    feeds: list[Feed] = []
    for _ in range(count):
        feed: dict[str, np.ndarray] = {"x": rng.standard_normal((batch, seq, d_model)).astype(np.float32)}
        if layer.mask == "padding":
            lengths = rng.integers(max(1, seq // 2), seq + 1, size=batch)
            feed["key_padding_mask"] = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
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
    """Export the configured layer and validate it on ONNX Runtime CPU; writes report.json."""
    say = progress or (lambda msg: log.info(msg))
    check_output_dir(cfg.out)
    threads = cfg.resolved_threads
    set_threads(threads)
    say(f"building {cfg.layer} (d_model={cfg.d_model}, heads={cfg.heads}, mask={cfg.mask}, seed={cfg.seed})")
    layer = MaskedLayer(build_layer(cfg.layer, cfg.d_model, cfg.heads, mask=cfg.mask, seed=cfg.seed), cfg.mask)
    params = sum(p.numel() for p in layer.parameters())
    report = Report(
        model={"layer": cfg.layer, "d_model": cfg.d_model, "heads": cfg.heads, "params": params, "mask": cfg.mask},
        inputs={"batch": cfg.batch, "seq_len": cfg.seq_len, "seed": cfg.seed, "data": "random normal"},
        environment=_environment(threads),
    )
    eager = EagerRunner(layer, layer.input_names, ["y"], name="eager-fp32")
    feeds = random_feeds(layer, cfg.batch, cfg.seq_len, cfg.d_model, cfg.seed + 1, cfg.validation_batches)
    refs = reference_outputs(eager, feeds)

    spec = cfg.export_spec()
    model_path = cfg.out / "model.onnx"
    say(f"exporting {model_path} ({spec.attention}, {spec.precision}, opset {spec.resolved_opset})")
    result = export_onnx(layer, model_path, spec)
    say(f"exported: {result.describe()}")
    ort_runner = OrtRunner(SessionFromOnnx(model_path, providers=["cpu"], intra_op_threads=threads), name="ort-cpu")
    say(f"validating on ONNX Runtime CPU ({cfg.repeats} timed runs, {threads} threads)")
    stage = evaluate_stage(
        f"onnx-{spec.precision}",
        ort_runner,
        eager,
        feeds,
        refs,
        feeds[0],
        precision=spec.precision,
        tolerance=tolerance_for(spec.precision),
        artifact=str(model_path),
        size_bytes=result.size_bytes,
        params=params,
        warmup=cfg.warmup,
        repeats=cfg.repeats,
        batch=cfg.batch,
    )
    stage.details["export"] = result.to_dict()
    stage.details["runtime"] = {"backend": "onnxruntime", "providers": ["CPUExecutionProvider"]}
    report.add(stage)
    report.write(cfg.out / "report.json")
    return report


def config_dict(cfg: PipelineConfig) -> dict[str, object]:
    d = asdict(cfg)
    d["out"] = str(cfg.out)
    return d
