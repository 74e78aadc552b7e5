"""Evaluate one artifact against eager: accuracy on every validation batch, latency side by side.

This is the one place that turns a runner into a report ``Stage``; every pipeline stage
(fp32 ONNX, fp16, int8, low-rank, TensorRT) goes through it, so figures are comparable.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from attn_export.runtime.base import Feed, Runner
from attn_export.validate.compare import compare_outputs
from attn_export.validate.error_histogram import error_histogram
from attn_export.validate.latency import time_runners
from attn_export.validate.metrics import accuracy
from attn_export.validate.report import Latency, Stage
from attn_export.validate.tolerances import Tolerance

__all__ = ["evaluate_stage", "reference_outputs"]

log = logging.getLogger(__name__)


def reference_outputs(reference: Runner, feeds: Sequence[Feed]) -> list[dict[str, np.ndarray]]:
    """Eager outputs for each validation feed (computed once, shared by every stage)."""
    return [reference.infer(f) for f in feeds]


def evaluate_stage(
    name: str,
    candidate: Runner,
    reference: Runner,
    accuracy_feeds: Sequence[Feed],
    reference_outs: Sequence[dict[str, np.ndarray]],
    latency_feed: Feed,
    *,
    precision: str,
    tolerance: Tolerance,
    artifact: str | None,
    size_bytes: int | None,
    params: int | None = None,
    output: str | None = None,
    warmup: int = 3,
    repeats: int = 20,
    batch: int = 1,
    eager_latency: Latency | None = None,
) -> Stage:
    """Accuracy on all ``accuracy_feeds`` (concatenated) and latency of candidate vs eager.

    ``output`` picks which output carries the accuracy figures (default: the first).
    ``eager_latency`` reuses an eager timing from this run instead of timing eager again.
    """
    refs, outs = [], []
    for feed, ref in zip(accuracy_feeds, reference_outs):
        got = candidate.infer(feed)
        key = output or next(iter(ref))
        refs.append(ref[key].ravel())
        outs.append((got[key] if key in got else next(iter(got.values()))).ravel())
    ref_all, out_all = np.concatenate(refs), np.concatenate(outs)
    acc = accuracy(ref_all, out_all)
    verdict = compare_outputs({"y": ref_all}, {"y": out_all}, tolerance)
    runners = {"artifact": candidate} if eager_latency else {"artifact": candidate, "eager": reference}
    lat = time_runners(runners, latency_feed, warmup=warmup, repeats=repeats, batch=batch)
    if eager_latency:
        lat["eager"] = eager_latency
    speedup = lat["eager"].p50 / lat["artifact"].p50 if lat["artifact"].p50 > 0 else None
    stage = Stage(
        name=name,
        artifact=artifact,
        precision=precision,
        accuracy=acc,
        latency_ms=lat,
        speedup_vs_eager=speedup,
        size_bytes=size_bytes,
        params=params,
        passed=bool(verdict),
        tolerance=tolerance.to_dict(),
        details={"error_histogram": error_histogram(ref_all, out_all), "worst": str(verdict)},
    )
    log.info("%s: %s", name, verdict)
    return stage
