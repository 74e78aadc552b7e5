"""The committed CI baselines: well-formed (format 1 or 2), they catch a lowered int8 cosine, and
the pipelines meet them (slow)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from attn_export.validate.gate.check import DEFAULT_CROSS_CLASS_SLACK, METRIC_DIRECTIONS, check_report
from attn_export.validate.schema import BaselineV1, validate_baseline

BASELINE_DIR = Path(__file__).resolve().parents[1] / "baselines"
BASELINES = sorted(BASELINE_DIR.glob("*.json"))
# baseline file -> the attn-export flags of the pipeline it gates (what .ci/run runs)
PIPELINES = {"default_report_baseline.json": [], "int8_report_baseline.json": ["--quantize", "int8"]}


def _entries(base: dict) -> dict[str, dict]:
    """CPU class -> stages (a format-1 file is one entry of class "unknown")."""
    if isinstance(validate_baseline(base, "baseline"), BaselineV1):
        return {"unknown": base["stages"]}
    return {cls: entry["stages"] for cls, entry in base["classes"].items()}


def _report_from(stages: dict, cls: str) -> dict:
    env = {} if cls == "unknown" else {"cpu": {"isa_class": cls}}
    return {"environment": env, "stages": [
        {"name": n, "precision": s["precision"], "passed": s.get("passed"), "speedup_vs_eager": s.get("speedup_vs_eager"),
         "accuracy": {m: v["value"] for m, v in s["metrics"].items()}} for n, s in stages.items()]}  # fmt: skip


@pytest.mark.parametrize("path", BASELINES, ids=[p.name for p in BASELINES])
def test_baseline_is_well_formed_and_accepts_its_own_figures(path):
    base = json.loads(path.read_text())
    for cls, stages in _entries(base).items():
        assert stages, cls
        for name, stage in stages.items():
            assert stage["metrics"], name
            for metric, spec in stage["metrics"].items():
                assert spec["direction"] == METRIC_DIRECTIONS[metric] and {"value"} <= set(spec), (name, metric)
        assert check_report(_report_from(stages, cls), base, latency_margin=0.0)


@pytest.mark.parametrize("path", BASELINES, ids=[p.name for p in BASELINES])
def test_committed_baselines_are_within_the_slack_bounds(path):
    from attn_export.validate.gate.check import check_slack_bounds

    check_slack_bounds(json.loads(path.read_text()), str(path))  # raises DataError past MAX_SLACK


def test_int8_baseline_catches_a_lowered_cosine():
    base = json.loads((BASELINE_DIR / "int8_report_baseline.json").read_text())
    for cls, stages in _entries(base).items():
        int8 = [n for n, s in stages.items() if s["precision"] == "int8"]
        assert int8, f"the int8 baseline has no int8 stage for class {cls}"
        report = _report_from(stages, cls)
        result = check_report(report, base)
        assert result
        spec = stages[int8[0]]["metrics"]["cosine"]
        # like with like the stage's own slack applies; a format-1 ("unknown") entry is compared
        # with the cross-class slack on top
        slack = spec["abs"] + (DEFAULT_CROSS_CLASS_SLACK["int8"]["cosine"]["abs"] if result.cross_class else 0.0)
        for stage in report["stages"]:
            if stage["name"] == int8[0]:
                stage["accuracy"]["cosine"] = spec["value"] - 2 * slack
        result = check_report(report, base)
        assert [(c.stage, c.metric) for c in result.regressions] == [(int8[0], "cosine")]
        assert check_report(copy.deepcopy(_report_from(stages, cls)), base)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_pipeline_meets_its_committed_baseline(name, tmp_path):
    from attn_export.cli import main

    assert main([*PIPELINES[name], "--out", str(tmp_path), "--quiet", "--repeats", "3"]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    result = check_report(report, json.loads((BASELINE_DIR / name).read_text()))
    assert result, str(result)
