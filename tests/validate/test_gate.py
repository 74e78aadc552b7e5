"""The CI gate: passes on the unchanged report, fails on a lowered int8 cosine, a missing stage or a
slower ratio; refuses reports and baselines that would fool it; compares CPU classes like with like."""

from __future__ import annotations

import copy
import json

import pytest

from attn_export.errors import DataError
from attn_export.validate import Accuracy, Latency, Report, Stage
from attn_export.validate.gate.check import (
    BASELINE_FORMAT,
    DEFAULT_CROSS_CLASS_SLACK,
    DEFAULT_GATE_TOLERANCES,
    MAX_SLACK,
    check_report,
    make_baseline,
    update_baseline,
)

VNNI, AVX2 = "x86-avx512-vnni", "x86-avx2"


def _report(isa: str | None = VNNI, saturates: bool | None = None) -> dict:
    env = {} if isa is None else {"cpu": {"isa_class": isa, "u8s8_saturates": isa == AVX2 if saturates is None else saturates, "flags": ["avx2"]}}
    r = Report(model={"layer": "transformer", "d_model": 64, "heads": 4}, environment=env)
    r.add(Stage("onnx-fp32", "model.onnx", "fp32", Accuracy(2e-6, 3e-7, 1e-6, 0.9999999999, 120.0),
                {"artifact": Latency(1.0, 1.2, 1.3), "eager": Latency(2.0, 2.2, 2.3)}, 2.0, passed=True))
    r.add(Stage("onnx-int8", "model.int8.onnx", "int8", Accuracy(0.05, 0.01, 0.03, 0.9995, 30.5),
                {"artifact": Latency(0.5, 0.6, 0.7), "eager": Latency(2.0, 2.2, 2.3)}, 4.0, passed=True))
    return json.loads(json.dumps(r.to_dict()))


def _stamped(rep: dict, folder) -> dict:
    """``rep`` as a run leaves it: each artifact in ``folder`` (beside the report), its sha256 recorded."""
    import hashlib

    for stage in rep["stages"]:
        path = folder / stage["artifact"]
        path.write_bytes(f"the model of {stage['name']}".encode())
        stage["artifact"] = str(path)
        stage["details"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return rep


def _int8(base: dict, cls: str = VNNI) -> dict:
    return base["classes"][cls]["stages"]["onnx-int8"]


def test_unchanged_report_passes_and_says_which_class_it_compared():
    rep = _report()
    base = make_baseline(rep)
    assert base["format"] == BASELINE_FORMAT == "attn-export-baseline/2"
    assert list(base["classes"]) == [VNNI] and base["classes"][VNNI]["recorded"]["isa_class"] == VNNI
    res = check_report(rep, base)
    assert res, str(res)
    assert len(res.checks) == 2 * 4  # 4 metrics per stage, no latency unless asked
    assert (res.report_class, res.baseline_class, res.cross_class, res.notices) == (VNNI, VNNI, False, [])
    text = str(res)
    assert text.splitlines()[0] == f"baseline: class {VNNI} (same class as this report)"
    assert res.summary() == f"PASS (8 checks, 2 stages; CPU class {VNNI})"


def test_lowered_int8_cosine_fails_with_a_diff_table():
    rep = _report()
    base = make_baseline(rep)
    tol = _int8(base)["metrics"]["cosine"]["abs"]
    bad = copy.deepcopy(rep)
    bad["stages"][1]["accuracy"]["cosine"] = 0.9995 - 2 * tol
    res = check_report(bad, base)
    assert not res
    [reg] = res.regressions
    assert (reg.stage, reg.metric) == ("onnx-int8", "cosine")
    assert reg.limit == pytest.approx(0.9995 - tol)
    text = str(res)
    assert "onnx-int8" in text and "REGRESSION" in text and "FAIL: 1 regression" in text
    ok = copy.deepcopy(rep)  # just inside the slack still passes
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


def test_missing_stage_and_failed_stage_are_regressions():
    rep = _report()
    base = make_baseline(rep)
    gone = copy.deepcopy(rep)
    gone["stages"] = gone["stages"][:1]
    res = check_report(gone, base)
    assert [(c.stage, c.metric) for c in res.regressions] == [("onnx-int8", "stage")]
    failed = copy.deepcopy(rep)
    failed["stages"][0]["passed"] = False
    res = check_report(failed, base)
    assert [(c.stage, c.metric) for c in res.regressions] == [("onnx-fp32", "passed")]


def test_a_stage_the_run_skipped_with_a_reason_is_reported_not_failed():
    rep = _report()
    base = make_baseline(rep)
    skipped = copy.deepcopy(rep)
    skipped["stages"] = skipped["stages"][:1]
    skipped["selection"]["skipped_stages"] = {"onnx-int8": "slower than eager fp32 on this CPU; --with-torchao times it"}
    res = check_report(skipped, base)
    assert res, str(res)
    assert any("onnx-int8 was not produced" in n for n in res.notices) and "skipped by the run" in str(res)
    everything = copy.deepcopy(skipped)  # but a run that skipped every stage compared nothing
    everything["stages"] = []
    everything["selection"]["skipped_stages"]["onnx-fp32"] = "skipped"
    assert not check_report(everything, base)


def test_a_check_that_compares_no_metric_fails():
    """Nothing passes on nothing: stages tracked for presence only are not a comparison."""
    rep = _report()
    base = make_baseline(rep)
    for stage in base["classes"][VNNI]["stages"].values():
        stage["metrics"] = {}
        stage.pop("passed")
    res = check_report(rep, base)
    assert not res
    [reg] = res.regressions
    assert (reg.stage, reg.metric) == ("(all)", "comparisons") and "nothing compared" in reg.message
    base["classes"][VNNI]["stages"]["onnx-int8"]["metrics"] = make_baseline(rep)["classes"][VNNI]["stages"]["onnx-int8"]["metrics"]
    assert check_report(rep, base), "one stage with metrics is a comparison"


def _edit(base: dict, path: str, value: object) -> dict:
    out = copy.deepcopy(base)
    *head, last = path.split(".")
    node = out
    for k in head:
        node = node[k]
    node[last] = value
    return out


@pytest.mark.parametrize("path", ["cross_class_slack.int8.cosine.abs", f"classes.{VNNI}.stages.onnx-int8.metrics.cosine.abs",
                                  f"classes.{VNNI}.stages.onnx-fp32.metrics.rel_l2.rel", "cross_class_slack.fp32.sqnr_db.abs"])  # fmt: skip
def test_slack_beyond_the_bound_is_refused_naming_the_field(path):
    """A finite 1e300 used to pass a report at cosine 0.5 (infinity was already refused)."""
    rep = _report()
    bad = _edit(make_baseline(rep), path, 1e300)
    for call in (lambda: check_report(rep, bad), lambda: update_baseline(rep, bad)):
        with pytest.raises(DataError) as err:
            call()
        text = str(err.value)
        assert f"baseline: {path}: expected at most" in text and "got 1e+300" in text and "\n" not in text, text
    metric, key = path.split(".")[-2:]
    assert check_report(rep, _edit(make_baseline(rep), path, MAX_SLACK[metric][key])), "the bound itself is accepted"


def test_a_format_1_baseline_is_bounded_too():
    rep = _report()
    v1 = {"format": "attn-export-baseline/1", "stages": {"onnx-int8": {"metrics": {"cosine": {"value": 0.9995, "direction": "higher", "abs": 0.5}}}}}
    with pytest.raises(DataError, match=r"baseline: stages\.onnx-int8\.metrics\.cosine\.abs: expected at most 0\.01 .*, got 0\.5"):
        check_report(rep, v1)


def test_at_the_widest_slack_the_gate_allows_a_cosine_of_half_fails():
    """Every slack at its bound, across CPU classes (own + cross-class): the limit stays within 0.04 of the baseline."""
    base = make_baseline(_report(VNNI))
    for stage in base["classes"][VNNI]["stages"].values():
        for metric, spec in stage["metrics"].items():
            spec.update(MAX_SLACK[metric])
    base["cross_class_slack"] = {p: {m: dict(MAX_SLACK[m]) for m in ("cosine", "sqnr_db", "rel_l2", "max_abs")} for p in ("fp32", "int8")}
    rep = _report(AVX2)
    rep["stages"][1]["accuracy"]["cosine"] = 0.5
    res = check_report(rep, base)
    assert res.cross_class and not res
    [reg] = res.regressions
    assert (reg.stage, reg.metric) == ("onnx-int8", "cosine") and 0.9995 - reg.limit <= 0.04 + 1e-12


def test_the_default_slack_is_within_the_bounds():
    for table in (DEFAULT_GATE_TOLERANCES, DEFAULT_CROSS_CLASS_SLACK):
        for precision, metrics in table.items():
            for metric, spec in metrics.items():
                assert all(v <= MAX_SLACK[metric][k] for k, v in spec.items()), (precision, metric, spec)


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
    for margin in (1.5, -0.1, float("inf"), float("nan")):
        with pytest.raises(DataError, match="latency"):
            check_report(rep, base, latency_margin=margin)


def test_update_keeps_hand_edited_slack():
    rep = _report()
    base = make_baseline(rep)
    _int8(base)["metrics"]["cosine"]["abs"] = 0.01
    newer = copy.deepcopy(rep)
    newer["stages"][1]["accuracy"]["cosine"] = 0.9990
    updated = make_baseline(newer, previous=base)
    assert _int8(updated)["metrics"]["cosine"] == {"value": 0.9990, "direction": "higher", "abs": 0.01}


def test_wrong_format_is_a_data_error():
    with pytest.raises(DataError, match="update-baseline"):
        check_report(_report(), {"stages": {}})


# --- what must never fool the gate ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("stage", "metric", "value", "expected"),
    [
        (1, "cosine", float("inf"), "a finite number, got inf"),
        (0, "rel_l2", float("-inf"), "a finite number, got -inf"),
        (1, "max_abs", -1.0, "a number >= 0, got -1.0"),
        (0, "sqnr_db", float("nan"), "a finite number (the stage's output was not finite), got nan"),
        (1, "cosine", 1.5, "a number in [-1, 1], got 1.5"),
        (1, "cosine", "high", 'a number, got "high"'),
        (1, "rel_l2", None, None),  # null is "not reported": a missing metric, a regression, not an error
    ],
)
def test_non_finite_or_impossible_metrics_are_refused_naming_stage_and_metric(stage, metric, value, expected):
    rep = _report()
    base = make_baseline(rep)
    bad = copy.deepcopy(rep)
    bad["stages"][stage]["accuracy"][metric] = value
    name = bad["stages"][stage]["name"]
    if expected is None:
        res = check_report(bad, base)
        assert [(c.stage, c.metric, c.message) for c in res.regressions] == [(name, metric, "metric missing from the report")]
        return
    with pytest.raises(DataError) as info:
        check_report(bad, base, report_name="report.json")
    msg = str(info.value)
    assert msg.startswith(f"report.json: stages[{name}].accuracy.{metric}: expected {expected}")
    assert "\n" not in msg and "; " in msg
    with pytest.raises(DataError):  # and it is never recorded either
        update_baseline(bad, base)


def test_all_three_of_issue_13_at_once_is_refused():
    bad = _report()
    bad["stages"][0]["accuracy"].update(cosine=float("inf"), rel_l2=float("-inf"), max_abs=-1)
    with pytest.raises(DataError, match=r"stages\[onnx-fp32\]\.accuracy\.\w+: expected .* \(and 2 more problems\)"):
        check_report(bad, make_baseline(_report()))


@pytest.mark.parametrize(
    ("baseline", "where"),
    [
        ({"format": "attn-export-baseline/1", "stages": {}}, "baseline: stages: expected at least one stage, got {}"),
        ({"format": "attn-export-baseline/2", "classes": {}}, "baseline: classes: expected at least one CPU class entry, got {}"),
        ({"format": "attn-export-baseline/2", "classes": {VNNI: {"stages": {}}}}, f"baseline: classes.{VNNI}.stages: expected at least one stage"),
    ],
    ids=["v1", "v2-no-class", "v2-empty-class"],
)
def test_an_empty_baseline_is_refused_unless_allowed(baseline, where):
    with pytest.raises(DataError, match="--allow-empty") as info:
        check_report(_report(), baseline)
    assert str(info.value).startswith(where)
    res = check_report(_report(), baseline, allow_empty=True)
    assert res and len(res.checks) == 0 and any("empty" in n for n in res.notices)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"abs": float("inf")}, r"metrics\.cosine\.abs: expected a finite number, got inf"),
        ({"abs": -0.1}, r"metrics\.cosine\.abs: expected a value >= 0"),
        ({"rel": float("nan")}, r"metrics\.cosine\.rel: expected a finite number, got nan"),
        ({"direction": "sideways"}, r"metrics\.cosine\.direction: expected one of 'higher' or 'lower', got \"sideways\""),
        ({"direction": "lower"}, r"metrics: expected direction 'higher' for cosine, got 'lower'"),
        ({"value": "high"}, r"metrics\.cosine\.value: expected a number, got \"high\""),
        ({"value": None}, r"metrics\.cosine\.value: expected a number, got null"),
        ({"abss": 0.1}, r"metrics\.cosine\.abss: expected no such key"),
    ],
    ids=["abs-inf", "abs-negative", "rel-nan", "sideways", "wrong-direction", "value-str", "value-null", "typo"],
)
def test_baseline_slack_and_direction_are_validated(edit, expected):
    base = make_baseline(_report())
    _int8(base)["metrics"]["cosine"].update(edit)
    with pytest.raises(DataError, match=rf"^b\.json: classes\.{VNNI}\.stages\.onnx-int8\.{expected}") as info:
        check_report(_report(), base, baseline_name="b.json")
    assert "\n" not in str(info.value)


def test_malformed_baselines_are_one_line():
    base = make_baseline(_report())
    for mutate in (
        lambda b: b.update(classes=[]),
        lambda b: b["classes"][VNNI].update(stages="x"),
        lambda b: _int8(b).update(metrics={"cosin": {"value": 1.0}}),
        lambda b: b.update(latency_margin=2),
        lambda b: b.update(cross_class_slack={"int8": {"cosine": {"abs": float("inf")}}}),
    ):
        bad = copy.deepcopy(base)
        mutate(bad)
        with pytest.raises(DataError) as info:
            check_report(_report(), bad)
        assert "\n" not in str(info.value) and str(info.value).startswith("baseline: ")


# --- --update-baseline never drops what the report lacks, unless --prune ----------------------------


def test_update_from_a_report_without_accuracy_keeps_every_metric():
    rep = _report()
    base = make_baseline(rep)
    bare = copy.deepcopy(rep)
    for s in bare["stages"]:
        s["accuracy"] = None
    up = update_baseline(bare, base)
    assert up.baseline["classes"][VNNI]["stages"] == base["classes"][VNNI]["stages"]
    assert "onnx-int8/cosine" in up.kept and len(up.kept) == 8
    assert "--prune removes them" in up.describe()
    assert check_report(rep, up.baseline)  # still checks all 8 metrics
    assert len(check_report(rep, up.baseline).checks) == 8


def test_update_keeps_stages_missing_from_the_report_and_prune_removes_them():
    rep = _report()
    base = make_baseline(rep)
    fewer = copy.deepcopy(rep)
    fewer["stages"] = fewer["stages"][:1]
    fewer["stages"][0]["accuracy"]["sqnr_db"] = None
    up = update_baseline(fewer, base)
    assert set(up.baseline["classes"][VNNI]["stages"]) == {"onnx-fp32", "onnx-int8"}
    assert up.kept == ["onnx-fp32/sqnr_db", "onnx-int8"] and up.removed == []
    pruned = update_baseline(fewer, base, prune=True)
    assert set(pruned.baseline["classes"][VNNI]["stages"]) == {"onnx-fp32"}
    assert "sqnr_db" not in pruned.baseline["classes"][VNNI]["stages"]["onnx-fp32"]["metrics"]
    assert pruned.removed == ["onnx-fp32/sqnr_db", "onnx-int8"] and "removed (--prune)" in pruned.describe()


def test_update_of_an_empty_report_is_refused():
    rep = _report()
    rep["stages"] = []
    with pytest.raises(DataError, match="at least one stage to record"):
        update_baseline(rep)


# --- baselines per instruction-set class (issue 9) -----------------------------------------------


def _avx2_report(cosine: float = 0.999141) -> dict:
    """Issue 9's AVX2 measurement: static int8 cosine 0.999932 (VNNI) -> 0.999141 (U8S8 saturation)."""
    rep = _report(AVX2)
    rel = (2 * (1 - cosine)) ** 0.5
    rep["stages"][1]["accuracy"].update(cosine=cosine, rel_l2=rel, sqnr_db=-20 * __import__("math").log10(rel), max_abs=0.15)
    return rep


def _vnni_report() -> dict:
    rep = _report(VNNI)
    rep["stages"][1]["accuracy"].update(cosine=0.999932, rel_l2=0.01166, sqnr_db=38.67, max_abs=0.055)
    return rep


def test_update_writes_only_the_current_class_and_the_gate_compares_like_with_like():
    base = make_baseline(_vnni_report())
    vnni_entry = copy.deepcopy(base["classes"][VNNI])
    base = make_baseline(_avx2_report(), previous=base)
    assert set(base["classes"]) == {VNNI, AVX2}
    assert base["classes"][VNNI] == vnni_entry  # the other class is untouched
    assert base["classes"][AVX2]["recorded"]["u8s8_saturates"] is True
    res = check_report(_avx2_report(), base)
    assert res and (res.baseline_class, res.cross_class) == (AVX2, False)
    res = check_report(_vnni_report(), base)
    assert res and (res.baseline_class, res.cross_class) == (VNNI, False)
    # AVX2-level accuracy on a VNNI machine is a regression: the VNNI entry is compared, tightly
    vnni_but_worse = _avx2_report()
    vnni_but_worse["environment"]["cpu"] = {"isa_class": VNNI, "u8s8_saturates": False}
    res = check_report(vnni_but_worse, base)
    assert not res and res.baseline_class == VNNI
    assert {c.metric for c in res.regressions} >= {"cosine", "sqnr_db", "rel_l2"}


def test_another_class_is_compared_with_the_cross_class_slack_and_a_notice():
    base = make_baseline(_vnni_report())
    same_class = copy.deepcopy(_avx2_report())
    same_class["environment"]["cpu"] = _vnni_report()["environment"]["cpu"]
    assert not check_report(same_class, base)  # like with like, AVX2's figures would fail...
    res = check_report(_avx2_report(), base)  # ...but on an AVX2 CPU they are compared across classes
    assert res, str(res)
    assert (res.report_class, res.baseline_class, res.cross_class) == (AVX2, VNNI, True)
    [notice] = res.notices
    assert f"no entry for this report's CPU class {AVX2}" in notice and "cross-class slack" in notice and "--update-baseline" in notice
    assert "cross-class" in res.summary() and "notice: the baseline has no entry" in str(res)
    cos = next(c for c in res.checks if (c.stage, c.metric) == ("onnx-int8", "cosine"))
    assert cos.limit == pytest.approx(0.999932 - 2e-4 - DEFAULT_CROSS_CLASS_SLACK["int8"]["cosine"]["abs"])
    broken = _avx2_report(cosine=0.99)  # a real regression still fails across classes
    assert not check_report(broken, base)


def test_cross_class_skips_latency_ratios_with_a_notice():
    base = make_baseline(_vnni_report())
    slow = _avx2_report()
    slow["stages"][1]["speedup_vs_eager"] = 0.5
    res = check_report(slow, base, latency_margin=0.1)
    assert res and not any(c.metric == "speedup_vs_eager" for c in res.checks)
    assert any("latency ratios are not compared across CPU classes" in n for n in res.notices)


def test_cross_class_slack_can_be_set_in_the_file():
    base = make_baseline(_vnni_report())
    base["cross_class_slack"]["int8"]["cosine"] = {"abs": 1e-5}
    res = check_report(_avx2_report(), base)
    assert [(c.stage, c.metric) for c in res.regressions] == [("onnx-int8", "cosine")]


def test_the_closest_recorded_class_is_chosen_deterministically():
    base = make_baseline(_vnni_report())
    base = make_baseline(_avx2_report(), previous=base)
    amx = _vnni_report()
    amx["environment"]["cpu"] = {"isa_class": "x86-amx", "u8s8_saturates": False}
    assert check_report(amx, base).baseline_class == VNNI  # same saturation behaviour
    sse = _avx2_report()
    sse["environment"]["cpu"] = {"isa_class": "x86-sse", "u8s8_saturates": True}
    assert check_report(sse, base).baseline_class == AVX2
    arm = _vnni_report()
    arm["environment"]["cpu"] = {"isa_class": "arm-dotprod"}
    assert check_report(arm, base).baseline_class == AVX2  # no saturation info, no arm entry: by name


def test_a_report_without_a_cpu_class_is_compared_across_classes_with_a_notice():
    base = make_baseline(_vnni_report())
    res = check_report(_report(isa=None), base)
    assert res.cross_class and res.report_class == "unknown"
    assert "records no CPU class" in res.notices[0]


def test_format_1_files_are_read_as_class_unknown_and_upgraded_on_update():
    v1 = {"format": "attn-export-baseline/1", "model": {"layer": "transformer"}, "latency_margin": 0.25, "stages": {
        "onnx-int8": {"precision": "int8", "passed": True, "speedup_vs_eager": 4.0, "metrics": {
            "cosine": {"value": 0.999932, "direction": "higher", "abs": 0.0002}}}}}  # fmt: skip
    res = check_report(_avx2_report(), v1)  # issue 9's failing case: now a notice, not a spurious fail
    assert res and (res.baseline_class, res.cross_class) == ("unknown", True)
    assert "unknown CPU class (format 1)" in res.notices[0]
    up = update_baseline(_avx2_report(), v1)
    assert up.baseline["format"] == "attn-export-baseline/2" and up.baseline["latency_margin"] == 0.25
    assert sorted(up.baseline["classes"]) == ["unknown", AVX2]
    assert up.baseline["classes"][AVX2]["stages"]["onnx-int8"]["metrics"]["cosine"]["abs"] == 0.0002  # slack carried over
    assert "onnx-fp32" in up.baseline["classes"][AVX2]["stages"]
    pruned = update_baseline(_avx2_report(), v1, prune=True)
    assert list(pruned.baseline["classes"]) == [AVX2] and "class unknown (the format-1 entry)" in pruned.removed


def test_result_json_names_the_classes():
    res = check_report(_avx2_report(), make_baseline(_vnni_report()))
    d = json.loads(json.dumps(res.to_dict()))
    assert (d["report_class"], d["baseline_class"], d["cross_class"], d["passed"]) == (AVX2, VNNI, True, True)
    assert d["notices"] and len(d["checks"]) == 8


# --- the command -----------------------------------------------------------------------------------


def test_check_command_passes_unchanged_fails_lowered_int8_cosine(tmp_path):
    import xml.etree.ElementTree as ET

    from test_sweep import _app
    from typer.testing import CliRunner

    app, runner = _app(), CliRunner()
    rep = _stamped(_report(), tmp_path)
    good, bad, base = tmp_path / "report.json", tmp_path / "bad.json", tmp_path / "baselines" / "b.json"
    good.write_text(json.dumps(rep))
    res = runner.invoke(app, ["check", str(good), "--baseline", str(base), "--update-baseline"])
    assert res.exit_code == 0 and base.is_file(), res.output
    assert f"recorded CPU class {VNNI}" in res.stdout
    res = runner.invoke(app, ["check", str(good), "--baseline", str(base), "--junit", str(tmp_path / "ok.xml")])
    assert res.exit_code == 0 and "PASS" in res.stdout and f"baseline: class {VNNI}" in res.stdout
    tol = _int8(json.loads(base.read_text()))["metrics"]["cosine"]["abs"]
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
    assert res.stdout.strip() == f"FAIL: 1 regression (10 checks, 2 stages; CPU class {VNNI})"  # 8 metrics, 2 artifact hashes
    res = runner.invoke(app, ["check", str(good), "--baseline", str(tmp_path / "missing.json")])
    assert isinstance(res.exception, DataError) and "--update-baseline" in str(res.exception)


def _main(args, capsys):
    from attn_export.cli import main

    code = main(args)
    return code, capsys.readouterr()


def test_check_command_refusals_are_one_line_exit_2(tmp_path, capsys):
    rep = _stamped(_report(), tmp_path)
    good, base = tmp_path / "report.json", tmp_path / "b.json"
    good.write_text(json.dumps(rep))
    assert _main(["check", str(good), "--baseline", str(base), "--update-baseline"], capsys)[0] == 0
    cases = {
        "inf.json": lambda r: r["stages"][1]["accuracy"].update(cosine=float("inf")),
        "str.json": lambda r: r.update(stages="x"),
        "null.json": lambda r: r["stages"][0].update(latency_ms=None),
    }
    for name, mutate in cases.items():
        bad = copy.deepcopy(rep)
        mutate(bad)
        (tmp_path / name).write_text(json.dumps(bad))
        code, out = _main(["check", str(tmp_path / name), "--baseline", str(base)], capsys)
        assert code == 2 and out.err.startswith(f"attn-export: error: {tmp_path / name}: stages") and out.err.count("\n") == 1, out.err
    (tmp_path / "empty.json").write_text(json.dumps({"format": "attn-export-baseline/1", "stages": {}}))
    code, out = _main(["check", str(good), "--baseline", str(tmp_path / "empty.json")], capsys)
    assert code == 2 and "--allow-empty" in out.err
    assert _main(["check", str(good), "--baseline", str(tmp_path / "empty.json"), "--allow-empty"], capsys)[0] == 0
    (tmp_path / "notjson.json").write_bytes(b"\xff\x00")
    code, out = _main(["check", str(good), "--baseline", str(tmp_path / "notjson.json")], capsys)
    assert code == 2 and "undecodable" in out.err
    code, out = _main(["check", str(good), "--baseline", str(base), "--junit", str(tmp_path)], capsys)
    assert code == 2 and "--junit" in out.err and "directory" in out.err
    code, out = _main(["check", str(good), "--baseline", str(tmp_path), "--update-baseline"], capsys)
    assert code == 2 and "--baseline" in out.err
    code, out = _main(["check", str(good), "--baseline", str(base), "--prune"], capsys)
    assert code == 2 and "--prune only applies with --update-baseline" in out.err
    code, out = _main(["check", str(good), "--baseline", str(base), "--junit", "/proc/attn-export-test/gate.xml"], capsys)
    assert code == 2 and out.err.startswith("attn-export: error: --junit /proc/attn-export-test/gate.xml") and len(out.err.splitlines()) == 1


def test_update_baseline_command_keeps_metrics_and_prunes_on_request(tmp_path, capsys):
    rep = _stamped(_report(), tmp_path)
    good, bare, base = tmp_path / "report.json", tmp_path / "bare.json", tmp_path / "b.json"
    good.write_text(json.dumps(rep))
    assert _main(["check", str(good), "--baseline", str(base), "--update-baseline"], capsys)[0] == 0
    before = json.loads(base.read_text())
    no_acc = copy.deepcopy(rep)
    no_acc["stages"][1]["accuracy"] = None
    bare.write_text(json.dumps(no_acc))
    code, out = _main(["check", str(bare), "--baseline", str(base), "--update-baseline"], capsys)
    assert code == 0 and "kept from the previous baseline" in out.out and "onnx-int8/cosine" in out.out
    assert _int8(json.loads(base.read_text()))["metrics"] == _int8(before)["metrics"]
    code, out = _main(["check", str(bare), "--baseline", str(base), "--update-baseline", "--prune", "--json"], capsys)
    assert code == 0 and "onnx-int8/cosine" in json.loads(out.out)["removed"]
    assert _int8(json.loads(base.read_text()))["metrics"] == {}
