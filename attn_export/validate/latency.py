"""Latency measurement: warm-up, round-robin repeats, wall and CPU percentiles, and the timing pass.

Every variant is timed in the same process, on the same inputs, with the same thread count,
interleaved round by round so that machine noise hits all of them equally. Each call's
process CPU time is recorded beside its wall time: on a shared machine a variant that waited
for a core shows a wall time its CPU time does not have.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from attn_export.runtime.base import Feed, Runner
from attn_export.validate.report import Latency

__all__ = ["TimingPoint", "TimingResult", "latency_from_samples", "set_threads", "time_pass", "time_runners"]

log = logging.getLogger(__name__)


def set_threads(threads: int) -> None:
    """Give PyTorch the same intra-op thread count ONNX Runtime sessions get."""
    import torch

    torch.set_num_threads(max(1, int(threads)))


def latency_from_samples(samples_s: list[float], batch: int = 1, cpu_s: list[float] | None = None) -> Latency:
    ms = np.asarray(samples_s, dtype=np.float64) * 1e3
    p50 = float(np.percentile(ms, 50))
    return Latency(
        p50=p50, p90=float(np.percentile(ms, 90)), p99=float(np.percentile(ms, 99)), mean=float(ms.mean()), repeats=int(ms.size),
        throughput_per_s=(batch * 1e3 / p50) if p50 > 0 else 0.0, cpu_p50=1e3 * float(np.median(cpu_s)) if cpu_s else None,
    )  # fmt: skip


def time_runners(runners: Mapping[str, Runner], feed: Feed | Sequence[Feed], warmup: int = 3, repeats: int = 20, batch: int = 1,
                 rounds_ms: dict[str, list[float]] | None = None, rounds_cpu_ms: dict[str, list[float]] | None = None) -> dict[str, Latency]:  # fmt: skip
    """Time several runners round-robin; returns name -> Latency (wall and CPU) per call.

    ``feed`` is one input, or a list of them (batches of real texts, each its own shape): a
    round then runs every feed with every runner, the runner that goes first rotating by one
    per feed so that cache state and machine noise hit all alike, and a sample is the round's
    mean time per feed. ``rounds_ms``, when given, receives each runner's wall time per round
    (ms): entry i of two runners was timed in the same round, so their ratio is paired
    against load drifting; ``rounds_cpu_ms`` the same in process CPU time.
    """
    feeds = [feed] if isinstance(feed, Mapping) else list(feed)
    names = list(runners)
    for r in runners.values():
        r.activate()
        for _ in range(warmup):
            for f in feeds:
                r.infer(f)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    turn = 0
    for _ in range(repeats):
        w, c = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
        for f in feeds:
            order = names[turn % len(names):] + names[: turn % len(names)] if len(feeds) > 1 else names
            turn += 1
            for name in order:
                t0, c0 = time.perf_counter(), time.process_time()
                runners[name].infer(f)
                c[name] += time.process_time() - c0
                w[name] += time.perf_counter() - t0
        for name in names:
            wall[name].append(w[name] / len(feeds))
            cpu[name].append(c[name] / len(feeds))
    if rounds_ms is not None:
        rounds_ms.update({n: [1e3 * s for s in wall[n]] for n in names})
    if rounds_cpu_ms is not None:
        rounds_cpu_ms.update({n: [1e3 * s for s in cpu[n]] for n in names})
    return {n: latency_from_samples(wall[n], batch, cpu[n]) for n in names}


@dataclass(frozen=True)
class TimingPoint:
    """One input every runner is timed on: a fixed shape, a batch of real texts, a bench grid point.

    ``repeats`` None: as many round-robin rounds as fit ``budget_s`` (at least ``min_repeats``,
    at most ``max_repeats``), from the first call's time.
    """

    label: str
    feed: Feed
    batch: int  # items per call (the throughput's unit)
    warmup: int = 3
    repeats: int | None = 20
    budget_s: float = 10.0
    min_repeats: int = 3
    max_repeats: int = 20
    details: Mapping[str, object] = field(default_factory=dict)  # e.g. the padding fraction of the real-text batches
    more_feeds: tuple[Feed, ...] = ()  # further inputs of the same workload (the next batches of real texts)

    @property
    def feeds(self) -> list[Feed]:
        """Every input of the point; a sample is the mean time per input."""
        return [self.feed, *self.more_feeds]


@dataclass
class TimingResult:
    """Per point label: runner -> Latency, runner -> peak memory of its first call, and what was skipped and why."""

    latency: dict[str, dict[str, Latency]] = field(default_factory=dict)
    memory: dict[str, dict[str, int | None]] = field(default_factory=dict)
    skipped: list[dict[str, object]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # runner -> why it could not run
    rounds_ms: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # point -> runner -> wall ms of each round


def time_pass(runners: Mapping[str, Callable[[], Runner]], points: list[TimingPoint], measure_memory: bool = False,
              skip: Callable[[str, TimingPoint], str | None] | None = None) -> TimingResult:  # fmt: skip
    """Every runner on every point, round-robin within a point; a runner that fails is reported, not fatal.

    ``runners`` are factories: with ``measure_memory`` a fresh runner per point, so each point's peak memory is its own;
    otherwise one runner per factory serves every point (a session is built once: seconds per int8 model).
    """
    result = TimingResult()
    made: dict[str, Runner] = {}
    for point in points:
        live: dict[str, Runner] = {}
        first: dict[str, float] = {}
        for name, make in runners.items():
            if name in result.failed:
                continue
            why = skip(name, point) if skip else None
            if why:
                result.skipped.append({"point": point.label, "runner": name, "reason": why, **point.details})
                continue
            runner = make() if measure_memory or name not in made else made[name]
            made[name] = runner
            try:
                runner.activate()
                t0 = time.perf_counter()
                if measure_memory:
                    from attn_export.validate.memory import peak_memory_delta

                    runner.infer(point.feed)  # compile/allocate once, then the steady-state peak
                    result.memory.setdefault(point.label, {})[name] = peak_memory_delta(lambda r=runner: [r.infer(f) for f in point.feeds])
                else:
                    for f in point.feeds:
                        runner.infer(f)
                first[name] = time.perf_counter() - t0
            except Exception as err:  # noqa: BLE001 - e.g. torch.compile without a C++ toolchain: reported with its reason
                result.failed[name] = f"{point.label}: {type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"
                runner.deactivate()
                continue
            live[name] = runner
        if not live:
            continue
        repeats = point.repeats
        if repeats is None:
            per_round = sum(first.values()) or 1e-3
            repeats = int(np.clip(point.budget_s / per_round, point.min_repeats, point.max_repeats))
        warm = max(0, point.warmup - 1)  # the first call above counts as one warm-up
        result.latency[point.label] = time_runners(live, point.feeds, warmup=warm, repeats=repeats, batch=point.batch,
                                                   rounds_ms=result.rounds_ms.setdefault(point.label, {}))  # fmt: skip
        if measure_memory:
            for r in live.values():
                r.deactivate()
    for r in made.values() if not measure_memory else ():
        r.deactivate()
    return result
