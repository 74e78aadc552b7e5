"""The CI gate: passes on the unchanged report, fails on a lowered int8 cosine, a missing stage or a slower ratio."""

from __future__ import annotations

import copy
import json

import pytest

from attn_export.errors import DataError
from attn_export.validate import Accuracy, Latency, Report, Stage
from attn_export.validate.gate import BASELINE_FORMAT, check_report, make_baseline


def _report() -> dict:
    r = Report(model={"layer": "transformer", "d_model": 64, "heads": 4})
    r.add(Stage("onnx-fp32", "model.onnx", "fp32", Accuracy(2e-6, 3e-7, 1e-6, 0.9999999999, 120.0),
                {"artifact": Latency(1.0, 1.2, 1.3), "eager": Latency(2.0, 2.2, 2.3)}, 2.0, passed=True))
    r.add(Stage("onnx-int8", "model.int8.onnx", "int8", Accuracy(0.05, 0.01, 0.03, 0.9995, 30.5),
                {"artifact": Latency(0.5, 0.6, 0.7), "eager": Latency(2.0, 2.2, 2.3)}, 4.0, passed=True))
    return json.loads(json.dumps(r.to_dict()))


def test_unchanged_report_passes():
    rep = _report()
    base = make_baseline(rep)
    assert base["format"] == BASELINE_FORMAT
    res = check_report(rep, base)
    assert res, str(res)
    assert len(res.checks) == 2 * 4 + 0  # 4 metrics per stage, no latency unless asked
    assert "PASS" in str(res)


def test_lowered_int8_cosine_fails_with_a_diff_table():
    rep = _report()
    base = make_baseline(rep)
    tol = base["stages"]["onnx-int8"]["metrics"]["cosine"]["abs"]
    bad = copy.deepcopy(rep)
    bad["stages"][1]["accuracy"]["cosine"] = 0.9995 - 2 * tol
    res = check_report(bad, base)
    assert not res
    [reg] = res.regressions
    assert (reg.stage, reg.metric) == ("onnx-int8", "cosine")
    assert reg.limit == pytest.approx(0.9995 - tol)
    text = str(res)
    assert "onnx-int8" in text and "REGRESSION" in text and "FAIL: 1 regression" in text
    # just inside the slack still passes
    ok = copy.deepcopy(rep)
    ok["stages"][1]["accuracy"]["cosine"] = 0.9995 - 0.5 * tol
    assert check_report(ok, base)


def test_error_metrics_may_only_grow_by_their_slack():
    rep = _report()
    base = make_baseline(rep, tolerances={"fp32": {"rel_l2": {"rel": 0.5}}, "int8": {"rel_l2": {"abs": 0.01}}})
    worse = copy.deepcopy(rep)
    worse["stages"][0]["accuracy"]["rel_l2"] = 1.6e-6  # > 1e-6 * 1.5
    worse["stages"][1]["accuracy"]["rel_l2"] = 0.035  # < 0.03 + 0.01
    res = check_report(worse, base)
    assert [(c.stage, c.metric) for c in res.regressions] == [("onnx-fp32", "rel_l2")]


def test_missing_stage_nan_and_failed_stage_are_regressions():
    rep = _report()
    base = make_baseline(rep)
    gone = copy.deepcopy(rep)
    gone["stages"] = gone["stages"][:1]
    res = check_report(gone, base)
    assert [(c.stage, c.metric) for c in res.regressions] == [("onnx-int8", "stage")]
    nan = copy.deepcopy(rep)
    nan["stages"][0]["accuracy"]["cosine"] = float("nan")
    nan["stages"][0]["passed"] = False
    res = check_report(nan, base)
    assert {(c.stage, c.metric) for c in res.regressions} == {("onnx-fp32", "cosine"), ("onnx-fp32", "passed")}


def test_new_stages_are_listed_not_failed():
    rep = _report()
    base = make_baseline(rep)
    more = copy.deepcopy(rep)
    more["stages"].append(dict(more["stages"][0], name="onnx-fp16", precision="fp16"))
    res = check_report(more, base)
    assert res and res.new_stages == ["onnx-fp16"]
    assert "onnx-fp16" in str(res)


def test_latency_ratio_only_with_a_margin():
    rep = _report()
    base = make_baseline(rep)
    slow = copy.deepcopy(rep)
    slow["stages"][1]["speedup_vs_eager"] = 3.0  # baseline 4.0
    assert check_report(slow, base)  # latency not checked by default
    assert check_report(slow, base, latency_margin=0.3)  # 3.0 >= 4.0 * 0.7
    res = check_report(slow, base, latency_margin=0.2)  # 3.0 < 3.2
    assert [(c.stage, c.metric) for c in res.regressions] == [("onnx-int8", "speedup_vs_eager")]
    base["latency_margin"] = 0.2  # the baseline file may carry its own margin
    assert not check_report(slow, base)
    with pytest.raises(DataError):
        check_report(rep, base, latency_margin=1.5)


def test_update_keeps_hand_edited_slack():
    rep = _report()
    base = make_baseline(rep)
    base["stages"]["onnx-int8"]["metrics"]["cosine"]["abs"] = 0.01
    newer = copy.deepcopy(rep)
    newer["stages"][1]["accuracy"]["cosine"] = 0.9990
    updated = make_baseline(newer, previous=base)
    assert updated["stages"]["onnx-int8"]["metrics"]["cosine"] == {"value": 0.9990, "direction": "higher", "abs": 0.01}


def test_wrong_format_is_a_data_error():
    with pytest.raises(DataError, match="update-baseline"):
        check_report(_report(), {"stages": {}})


def test_check_command_passes_unchanged_fails_lowered_int8_cosine(tmp_path):
    import xml.etree.ElementTree as ET

    from test_sweep import _app
    from typer.testing import CliRunner

    app, runner = _app(), CliRunner()
    rep = _report()
    good, bad, base = tmp_path / "report.json", tmp_path / "bad.json", tmp_path / "baselines" / "b.json"
    good.write_text(json.dumps(rep))
    res = runner.invoke(app, ["check", str(good), "--baseline", str(base), "--update-baseline"])
    assert res.exit_code == 0 and base.is_file(), res.output
    res = runner.invoke(app, ["check", str(good), "--baseline", str(base), "--junit", str(tmp_path / "ok.xml")])
    assert res.exit_code == 0 and "PASS" in res.stdout
    tol = json.loads(base.read_text())["stages"]["onnx-int8"]["metrics"]["cosine"]["abs"]
    lowered = copy.deepcopy(rep)
    lowered["stages"][1]["accuracy"]["cosine"] -= 2 * tol
    bad.write_text(json.dumps(lowered))
    res = runner.invoke(app, ["check", str(bad), "--baseline", str(base), "--junit", str(tmp_path / "bad.xml")])
    assert res.exit_code == 1
    assert "onnx-int8" in res.stdout and "cosine" in res.stdout and "REGRESSION" in res.stdout
    suite = ET.parse(tmp_path / "bad.xml").getroot().find("testsuite")
    assert suite.get("failures") == "1"
    res = runner.invoke(app, ["check", str(bad), "--baseline", str(base), "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["passed"] is False
    res = runner.invoke(app, ["check", str(bad), "--baseline", str(base), "--quiet"])
    assert res.stdout.strip() == "FAIL: 1 regression (8 checks, 2 stages)"
    res = runner.invoke(app, ["check", str(good), "--baseline", str(tmp_path / "missing.json")])
    assert isinstance(res.exception, DataError) and "--update-baseline" in str(res.exception)
