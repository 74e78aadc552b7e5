"""The committed CI baselines: well-formed, they catch a lowered int8 cosine, and the pipelines meet them (slow)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from attn_export.validate.gate import BASELINE_FORMAT, METRIC_DIRECTIONS, check_report

BASELINE_DIR = Path(__file__).resolve().parents[1] / "baselines"
BASELINES = sorted(BASELINE_DIR.glob("*.json"))
# baseline file -> the attn-export flags of the pipeline it gates (what .ci/run runs)
PIPELINES = {"default_report_baseline.json": [], "int8_report_baseline.json": ["--quantize", "int8"]}


def _report_from(base: dict) -> dict:
    return {"stages": [{"name": n, "precision": s["precision"], "passed": s.get("passed"), "speedup_vs_eager": s.get("speedup_vs_eager"),
                        "accuracy": {m: v["value"] for m, v in s["metrics"].items()}} for n, s in base["stages"].items()]}  # fmt: skip


@pytest.mark.parametrize("path", BASELINES, ids=[p.name for p in BASELINES])
def test_baseline_is_well_formed_and_accepts_its_own_figures(path):
    base = json.loads(path.read_text())
    assert base["format"] == BASELINE_FORMAT and base["stages"]
    for name, stage in base["stages"].items():
        assert stage["metrics"], name
        for metric, spec in stage["metrics"].items():
            assert spec["direction"] == METRIC_DIRECTIONS[metric] and {"value"} <= set(spec), (name, metric)
    assert check_report(_report_from(base), base, latency_margin=0.0)


def test_int8_baseline_catches_a_lowered_cosine():
    base = json.loads((BASELINE_DIR / "int8_report_baseline.json").read_text())
    int8 = [n for n, s in base["stages"].items() if s["precision"] == "int8"]
    assert int8, "the int8 baseline has no int8 stage"
    report = _report_from(base)
    for stage in report["stages"]:
        if stage["name"] == int8[0]:
            spec = base["stages"][int8[0]]["metrics"]["cosine"]
            stage["accuracy"]["cosine"] = spec["value"] - 2 * spec["abs"]
    result = check_report(report, base)
    assert [(c.stage, c.metric) for c in result.regressions] == [(int8[0], "cosine")]
    assert check_report(copy.deepcopy(_report_from(base)), base)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_pipeline_meets_its_committed_baseline(name, tmp_path):
    from attn_export.cli import main

    assert main([*PIPELINES[name], "--out", str(tmp_path), "--quiet", "--repeats", "3"]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    result = check_report(report, json.loads((BASELINE_DIR / name).read_text()))
    assert result, str(result)
