"""What every pipeline stage shares: the eager reference, its inputs and outputs, and timing.

A stage builds an artifact and hands a runner to ``StageContext.evaluate``; accuracy is
always against the *original* eager fp32 layer on the same validation feeds, and latency is
always timed side by side with that eager layer, so every stage's figures are comparable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attn_export.runtime import EagerRunner, OrtRunner, Runner, SessionFromOnnx
from attn_export.runtime.base import Feed
from attn_export.validate.evaluate import evaluate_stage
from attn_export.validate.report import Report, Stage
from attn_export.validate.tolerances import Tolerance

__all__ = ["StageContext", "Progress"]

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass
class StageContext:
    """Shared state of one run. ``feeds``/``refs``: accuracy data; ``latency_feed``: timing input."""

    eager: EagerRunner
    feeds: list[Feed]
    refs: list[dict[str, np.ndarray]]
    latency_feed: Feed
    out: Path
    report: Report
    threads: int
    batch: int
    warmup: int = 3
    repeats: int = 20
    say: Progress = field(default=lambda msg: log.info(msg))

    def ort(self, path: str | Path, name: str = "onnxruntime") -> OrtRunner:
        return OrtRunner(SessionFromOnnx(path, providers=["cpu"], intra_op_threads=self.threads), name=name)

    def evaluate(
        self,
        name: str,
        runner: Runner,
        *,
        precision: str,
        tolerance: Tolerance,
        artifact: str | Path | None,
        size_bytes: int | None,
        params: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> Stage:
        """Measure ``runner`` against eager, append the stage to the report, return it."""
        self.say(f"validating {name} ({self.repeats} timed runs beside eager)")
        stage = evaluate_stage(
            name,
            runner,
            self.eager,
            self.feeds,
            self.refs,
            self.latency_feed,
            precision=precision,
            tolerance=tolerance,
            artifact=None if artifact is None else str(artifact),
            size_bytes=size_bytes,
            params=params,
            warmup=self.warmup,
            repeats=self.repeats,
            batch=self.batch,
        )
        stage.details.update(details or {})
        a = stage.accuracy
        self.say(
            f"{name}: cosine {a.cosine:.6f}, rel L2 {a.rel_l2:.2e}, "
            f"{stage.speedup_vs_eager:.2f}x vs eager, {'PASS' if stage.passed else 'FAIL'}"
        )
        return self.report.add(stage)
