"""Latency measurement: warm-up, repeats, percentiles, throughput, and a side-by-side speedup.

Eager and the artifact are timed in the same process, on the same inputs, with the same
thread count, and interleaved round by round so that machine noise hits both equally.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from attn_export.runtime.base import Feed, Runner
from attn_export.validate.report import Latency

__all__ = ["FeedTiming", "latency_from_samples", "time_callable", "time_runners", "time_runners_on_feeds", "time_runners_with_cpu", "set_threads"]


def set_threads(threads: int) -> None:
    """Give PyTorch the same intra-op thread count ONNX Runtime sessions get."""
    import torch

    torch.set_num_threads(max(1, int(threads)))


def latency_from_samples(samples_s: list[float], batch: int = 1) -> Latency:
    ms = np.asarray(samples_s, dtype=np.float64) * 1e3
    p50 = float(np.percentile(ms, 50))
    return Latency(
        p50=p50,
        p90=float(np.percentile(ms, 90)),
        p99=float(np.percentile(ms, 99)),
        mean=float(ms.mean()),
        repeats=int(ms.size),
        throughput_per_s=(batch * 1e3 / p50) if p50 > 0 else 0.0,
    )


def time_callable(fn: Callable[[], object], warmup: int = 3, repeats: int = 20, batch: int = 1) -> Latency:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return latency_from_samples(samples, batch)


def time_runners(
    runners: Mapping[str, Runner], feed: Feed, warmup: int = 3, repeats: int = 20, batch: int = 1
) -> dict[str, Latency]:
    """Time several runners round-robin on one feed; returns name -> Latency."""
    for r in runners.values():
        r.activate()
        for _ in range(warmup):
            r.infer(feed)
    samples: dict[str, list[float]] = {n: [] for n in runners}
    for _ in range(repeats):
        for name, r in runners.items():
            t0 = time.perf_counter()
            r.infer(feed)
            samples[name].append(time.perf_counter() - t0)
    return {n: latency_from_samples(s, batch) for n, s in samples.items()}


def time_runners_with_cpu(
    runners: Mapping[str, Runner], feed: Feed, warmup: int = 3, repeats: int = 20, batch: int = 1
) -> dict[str, dict[str, object]]:
    """``time_runners`` plus each runner's median process CPU time per call (``cpu_ms_p50``).

    CPU time tells a slow variant from a starved one on a shared machine.
    """
    for r in runners.values():
        r.activate()
        for _ in range(warmup):
            r.infer(feed)
    wall: dict[str, list[float]] = {n: [] for n in runners}
    cpu: dict[str, list[float]] = {n: [] for n in runners}
    for _ in range(repeats):
        for name, r in runners.items():
            t0, c0 = time.perf_counter(), time.process_time()
            r.infer(feed)
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - t0)
    return {n: {"latency": latency_from_samples(wall[n], batch), "cpu_ms_p50": 1e3 * float(np.median(cpu[n]))} for n in runners}


@dataclass(frozen=True)
class FeedTiming:
    """One runner over a list of feeds, per repeat: mean wall and process-CPU ms per feed."""

    wall_ms: tuple[float, ...]  # one entry per repeat
    cpu_ms: tuple[float, ...]

    def to_dict(self) -> dict[str, list[float]]:
        return {"wall_ms": list(self.wall_ms), "cpu_ms": list(self.cpu_ms)}


def time_runners_on_feeds(
    runners: Mapping[str, Runner], feeds: Sequence[Feed], repeats: int = 3, warmup: int = 1, rounds: int = 1
) -> dict[str, FeedTiming]:
    """Time runners side by side over many feeds (real batches of different shapes).

    Every feed is run by every runner before the next feed, in an order that rotates by one
    runner per feed, so machine noise and cache state hit all runners alike. A repeat is
    ``rounds`` passes over ``feeds``; each repeat gives each runner's mean wall and CPU time
    per feed, so the spread over repeats shows. ``warmup`` passes go first, untimed.
    """
    names = list(runners)
    for r in runners.values():
        r.activate()
    for _ in range(warmup):
        for feed in feeds:
            for r in runners.values():
                r.infer(feed)
    out: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in names}
    turn = 0
    for _ in range(repeats):
        wall = dict.fromkeys(names, 0.0)
        cpu = dict.fromkeys(names, 0.0)
        for _ in range(rounds):
            for feed in feeds:
                order = names[turn % len(names):] + names[: turn % len(names)]
                turn += 1
                for name in order:
                    t0, c0 = time.perf_counter(), time.process_time()
                    runners[name].infer(feed)
                    cpu[name] += time.process_time() - c0
                    wall[name] += time.perf_counter() - t0
        calls = max(1, rounds * len(feeds))
        for name in names:
            out[name][0].append(1e3 * wall[name] / calls)
            out[name][1].append(1e3 * cpu[name] / calls)
    return {n: FeedTiming(tuple(w), tuple(c)) for n, (w, c) in out.items()}
