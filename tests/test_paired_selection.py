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


@pytest.mark.parametrize("padded_ms, built", [(10.0, "packed"), (8.0, "padded"), (6.5, "padded")])
def test_the_encoder_form_is_decided_on_the_fp32_twins_before_any_8bit_route_is_built(padded_ms, built, monkeypatch):
    """--checkpoint --quantize int8 on ORT CPU: the fp32 twins first, then the 8-bit routes of the winning form only;
    static is planned padded only there (its packed twin runs unfused), so a packed win leaves per-token alone."""
    from attn_export.config.run import RunConfig
    from attn_export.pipeline.form_first import decide_form, form_first
    from attn_export.pipeline.plan import make_plan
    from attn_export.validate.latency import TimingPoint

    plan = make_plan(RunConfig(checkpoint="minilm", quantize="int8"))
    assert [s.name for s in plan.steps] == ["onnx-fp32", "onnx-fp32-packed", "int8-static", "int8-per-token", "int8-per-token-packed"]
    assert "unfused" in plan.skipped["int8-static-packed"]
    assert form_first(plan) == "onnx-fp32-packed"
    clock = _Clock(2.0)
    monkeypatch.setattr(time, "perf_counter", clock)
    point = TimingPoint("real texts", {"x": np.zeros(1)}, batch=8, more_feeds=({"x": np.zeros(1)},) * 3)

    class _Art:
        def __init__(self, ms: float) -> None:
            self.ms = ms

        def make_runner(self) -> _Runner:
            return _Runner(clock, self.ms)

    class _Subject:
        def timing_points(self, warmup: int, repeats: int) -> list[TimingPoint]:
            return [point]

    dropped = decide_form(plan, {"onnx-fp32": _Art(padded_ms), "onnx-fp32-packed": _Art(10.0)}, _Subject(), lambda m: None)
    names = [s.name for s in plan.steps]
    if built == "packed":  # a tie or a packed win: per-token packed only, static (padded only) dropped with the padded routes
        assert names == ["onnx-fp32-packed", "int8-per-token-packed"], names
        assert {"int8-static", "int8-per-token", "onnx-fp32"} <= set(plan.skipped) and "padded graph takes" in plan.skipped["int8-static"]
    else:  # the padded graph clearly faster (texts filling --seq-len): the padded routes
        assert names == ["onnx-fp32", "int8-static", "int8-per-token"], names
    assert set(dropped) == set(plan.skipped) - {"int8-static-packed", "int8-torchao"}, (dropped, plan.skipped)
    assert plan.selections[0].key == "form" and plan.selections[0].candidates == (names[0],)  # the fp32 form that was measured faster
    assert plan.form_decision["built"] == built and plan.selections[-1].candidates == tuple(n for n in names if n.startswith("int8"))
