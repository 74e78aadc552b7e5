"""Selection under timing noise (issue 40): the same inputs ship the same route at load 0 and at load 4.

The runners here cost a fixed time per call on a deterministic clock (``time.perf_counter`` replaced), and
"load" multiplies every call by a factor that drifts over time and jitters per call, as a shared 2-core
machine does. Timing goes through the real round-robin (``validate.latency.time_runners``) and the
real selection (``pipeline.select.select_route`` with paired rounds and more rounds on demand)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from attn_export.pipeline.select import Candidate, select_route
from attn_export.validate.latency import time_runners
from attn_export.validate.paired import CLEAR, SLOWER, TIED, UNDECIDED, compare_rounds

PREFERENCE = ("per-token", "static")


class _Clock:
    """Seconds that pass only when a fake runner runs: cost x the load at that moment."""

    def __init__(self, load: float, seed: int = 0) -> None:
        self.now, self.load, self.rng = 0.0, load, np.random.default_rng(seed)

    def __call__(self) -> float:
        return self.now

    def spend(self, cost_s: float) -> None:
        drift = 1.0 + self.load * (0.5 + 0.5 * math.sin(self.now * 7.0))  # the other jobs come and go
        self.now += cost_s * drift * float(self.rng.uniform(0.85, 1.15))  # and every call jitters


class _Runner:
    def __init__(self, clock: _Clock, cost_ms: float) -> None:
        self.clock, self.cost = clock, cost_ms / 1e3

    def activate(self) -> None: ...
    def deactivate(self) -> None: ...

    def infer(self, feed):
        self.clock.spend(self.cost)
        return {}


def _pick(costs: dict[str, float], load: float, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[dict]]:
    """What ships when stages with these per-call costs (ms) are timed at ``load`` and selected."""
    clock = _Clock(load)
    monkeypatch.setattr(time, "perf_counter", clock)
    feeds = [{"x": np.zeros(1)}] * 4
    runners = {name: _Runner(clock, ms) for name, ms in costs.items()}
    rounds: dict[str, list[float]] = {}
    lat = time_runners(runners, feeds, warmup=1, repeats=6, rounds_ms=rounds)

    def more(a: str, b: str) -> tuple[list[float], list[float]]:
        extra: dict[str, list[float]] = {}
        time_runners({a: runners[a], b: runners[b]}, feeds, warmup=0, repeats=6, rounds_ms=extra)
        return extra[a], extra[b]

    cands = [Candidate(n, n.split("-")[1] if "per" not in n else "per-token", lat[n].p50, True, 0.999, rounds_ms=tuple(rounds[n]),
                       form="packed" if n.endswith("packed") else "padded") for n in costs]  # fmt: skip
    result = select_route(cands, PREFERENCE, more_rounds=more)
    assert result.chosen is not None and result.margins, result
    return result.chosen.stage, result.margins


@pytest.mark.parametrize("costs, expected", [
    ({"int8-per-token": 10.0, "int8-per-token-packed": 10.1, "int8-static": 9.9, "int8-static-packed": 10.05}, "int8-per-token-packed"),
    ({"int8-per-token": 6.0, "int8-per-token-packed": 10.0, "int8-static": 9.0, "int8-static-packed": 10.0}, "int8-per-token"),
    ({"int8-per-token": 12.0, "int8-per-token-packed": 10.0, "int8-static": 12.0, "int8-static-packed": 7.0}, "int8-static-packed"),
], ids=["tie-goes-to-the-preferred-padding-free-route", "padded-clearly-faster", "static-clearly-faster"])  # fmt: skip
def test_the_same_route_ships_at_load_0_and_at_load_4(costs, expected, monkeypatch):
    quiet, margins = _pick(costs, 0.0, monkeypatch)
    loaded, _ = _pick(costs, 4.0, monkeypatch)
    assert quiet == loaded == expected, (quiet, loaded)
    assert {"challenger", "incumbent", "ratio", "interval", "rounds", "outcome"} <= set(margins[0])


def test_paired_rounds_see_through_a_load_that_hits_both_alike():
    load = np.geomspace(1, 5, 12)  # the machine gets 5x slower during the timing
    assert compare_rounds(9.0 * load, 10.0 * load).outcome == CLEAR  # 10% faster in every round: clear despite the drift
    assert compare_rounds(10.0 * load, 10.1 * load).outcome == TIED
    assert compare_rounds(12.0 * load, 10.0 * load).outcome == SLOWER
    assert compare_rounds([9.0, 9.1], [10.0, 10.0]).outcome == UNDECIDED  # two rounds decide nothing
    assert compare_rounds([9.0, 9.1], [10.0, 10.0], final=True).outcome == TIED  # the budget spent: the incumbent stays


def test_without_paired_rounds_the_old_band_rule_decides():
    cands = [Candidate("a", "static", 10.0, True, 0.99), Candidate("b", "per-token", 10.5, True, 0.99)]
    result = select_route(cands, PREFERENCE)
    assert result.chosen.stage == "b" and not result.margins
