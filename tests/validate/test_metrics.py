"""Accuracy metrics, tolerances and comparison results."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attn_export.validate import TOLERANCES, Tolerance, accuracy, compare_outputs, sqnr_db
from attn_export.validate.latency import latency_from_samples, time_runners
from attn_export.validate.report import Report, Stage, load_report


def test_metrics_on_known_values():
    ref = np.array([3.0, 4.0])
    out = np.array([3.0, 3.0])
    acc = accuracy(ref, out)
    assert acc.max_abs == 1.0 and acc.mean_abs == 0.5
    assert math.isclose(acc.rel_l2, 1 / 5)
    assert math.isclose(acc.cosine, 21 / (5 * math.sqrt(18)))
    assert math.isclose(acc.sqnr_db, 10 * math.log10(25 / 1))


def test_identical_outputs_have_capped_sqnr():
    x = np.ones(4)
    assert sqnr_db(x, x) == 300.0
    assert accuracy(x, x).cosine == 1.0


def test_nan_output_fails_every_tolerance():
    acc = accuracy(np.ones(3), np.array([1.0, np.nan, 1.0]))
    for tol in (spec.tensor for spec in TOLERANCES.values()):
        assert tol.violations(acc) == ["output contains NaN/Inf"]


def test_tolerance_violations_name_the_metric():
    acc = accuracy(np.ones(10), np.ones(10) * 1.1)
    v = Tolerance(max_abs=0.01, rel_l2=0.5, cosine_min=0.9).violations(acc)
    assert len(v) == 1 and v[0].startswith("max_abs")


def test_compare_reports_where_outputs_differ():
    ref = {"y": np.zeros((2, 3, 4))}
    out = {"y": np.zeros((2, 3, 4))}
    out["y"][1, 2, 3] = 0.5
    res = compare_outputs(ref, out, {"": Tolerance(max_abs=1e-3), "other": Tolerance(max_abs=1.0)})
    assert not res
    assert "worst at [1, 2, 3]" in str(res) and "FAIL" in str(res)
    ok = compare_outputs(ref, out, {"y": Tolerance(max_abs=1.0)})  # per-output override
    assert ok


def test_latency_percentiles():
    lat = latency_from_samples([0.001] * 9 + [0.010], batch=8)
    assert lat.p50 == pytest.approx(1.0) and lat.p99 > 5.0 and lat.repeats == 10
    assert lat.throughput_per_s == pytest.approx(8000.0)
    with_cpu = latency_from_samples([0.002] * 4, batch=1, cpu_s=[0.001] * 4)
    assert with_cpu.cpu_p50 == pytest.approx(1.0) and lat.cpu_p50 is None  # CPU time per call beside the wall time


def test_report_roundtrip(tmp_path):
    r = Report(model={"layer": "transformer"})
    r.add(Stage(name="onnx-fp32", artifact="m.onnx", precision="fp32", accuracy=accuracy(np.ones(2), np.ones(2))))
    path = r.write(tmp_path / "report.json")
    data = load_report(path)
    assert data["stages"][0]["accuracy"]["cosine"] == pytest.approx(1.0)
    assert not list(tmp_path.glob(".*tmp"))  # atomic write left nothing behind


class _Recorder:
    """A runner that records which feed it ran, and in what order relative to the others."""

    def __init__(self, name: str, log: list[tuple[str, int]]) -> None:
        self.name, self.log, self.active = name, log, False

    def activate(self) -> None:
        self.active = True

    def infer(self, feed):
        self.log.append((self.name, int(feed["i"][0])))
        return {}


def test_time_runners_on_many_feeds_runs_every_feed_side_by_side_in_rotating_order():
    log: list[tuple[str, int]] = []
    runners = {n: _Recorder(n, log) for n in ("a", "b", "c")}
    feeds = [{"i": np.array([i])} for i in range(4)]
    timing = time_runners(runners, feeds, warmup=1, repeats=2)
    assert all(r.active for r in runners.values())
    timed = log[3 * len(feeds):]  # after one warm-up pass
    assert len(timed) == 3 * len(feeds) * 2  # runners x feeds x repeats
    firsts = [timed[k][0] for k in range(0, len(timed), 3)]
    assert firsts[:3] == ["a", "b", "c"], "the first runner of each feed rotates"
    assert all({timed[k + j][1] for j in range(3)} == {timed[k][1]} for k in range(0, len(timed), 3)), "every runner runs a feed before the next feed"
    for lat in timing.values():
        assert lat.repeats == 2 and lat.p50 >= 0 and lat.cpu_p50 is not None and lat.cpu_p50 >= 0
