"""The gate has a row for every precision of the vocabulary, and an fp8 baseline gets fp8's slack
(before, fp8 stages fell back to fp32's: a cosine slack of 1e-6 that no fp8 rebuild meets)."""

from __future__ import annotations

import copy
import json

import pytest

from attn_export.validate import Accuracy, Latency, Report, Stage
from attn_export.validate.gate.check import DEFAULT_CROSS_CLASS_SLACK, DEFAULT_GATE_TOLERANCES, check_report, make_baseline
from attn_export.validate.tolerances import TOLERANCES
from attn_export.vocab.precisions import PRECISIONS

VNNI, AVX2 = "x86-avx512-vnni", "x86-avx2"
_GATED = ("cosine", "sqnr_db", "rel_l2", "max_abs")


def _fp8_report(isa: str = VNNI, cosine: float = 0.9991) -> dict:
    r = Report(model={"layer": "transformer", "d_model": 64, "heads": 4},
               environment={"cpu": {"isa_class": isa, "u8s8_saturates": isa == AVX2, "flags": ["avx2"]}})  # fmt: skip
    r.add(Stage("onnx-fp8", "model.fp8.onnx", "fp8", Accuracy(0.06, 0.012, 0.035, cosine, 28.0),
                {"artifact": Latency(0.5, 0.6, 0.7), "eager": Latency(2.0, 2.2, 2.3)}, 4.0, passed=True))
    return json.loads(json.dumps(r.to_dict()))


@pytest.mark.parametrize("name", list(PRECISIONS))
def test_every_precision_has_a_gate_row_and_a_tolerance_row(name):
    p = PRECISIONS[name]
    assert set(DEFAULT_GATE_TOLERANCES[name]) == set(_GATED) == set(DEFAULT_CROSS_CLASS_SLACK[name])
    assert DEFAULT_GATE_TOLERANCES[name] == {m: dict(s) for m, s in p.gate_slack.items()}
    assert p.tolerance_key in TOLERANCES
    assert set(DEFAULT_GATE_TOLERANCES) == set(PRECISIONS) == set(DEFAULT_CROSS_CLASS_SLACK)


def test_fp8_baseline_gets_the_fp8_slack_not_fp32s():
    base = make_baseline(_fp8_report())
    metrics = base["classes"][VNNI]["stages"]["onnx-fp8"]["metrics"]
    for metric in _GATED:
        slack = {k: v for k, v in metrics[metric].items() if k in ("abs", "rel")}
        assert slack == DEFAULT_GATE_TOLERANCES["fp8"][metric], metric
    assert metrics["cosine"]["abs"] != DEFAULT_GATE_TOLERANCES["fp32"]["cosine"]["abs"]
    assert base["cross_class_slack"]["fp8"] == DEFAULT_CROSS_CLASS_SLACK["fp8"]
    # fp8 is judged by int8's tensor bar (validate/tolerances.py), so it moves as far as int8 may
    assert TOLERANCES["fp8"].tensor == TOLERANCES["int8"].tensor
    assert DEFAULT_GATE_TOLERANCES["fp8"] == DEFAULT_GATE_TOLERANCES["int8"]


def test_fp8_rebuild_within_fp8_slack_passes_and_a_real_drop_fails():
    rep = _fp8_report()
    base = make_baseline(rep)
    tol = DEFAULT_GATE_TOLERANCES["fp8"]["cosine"]["abs"]
    moved = copy.deepcopy(rep)
    moved["stages"][0]["accuracy"]["cosine"] = 0.9991 - 0.5 * tol  # fp32's slack (1e-6) would call this a regression
    assert 0.5 * tol > DEFAULT_GATE_TOLERANCES["fp32"]["cosine"]["abs"]
    assert check_report(moved, base)
    dropped = copy.deepcopy(rep)
    dropped["stages"][0]["accuracy"]["cosine"] = 0.9991 - 2 * tol
    [reg] = check_report(dropped, base).regressions
    assert (reg.stage, reg.metric) == ("onnx-fp8", "cosine") and reg.limit == pytest.approx(0.9991 - tol)


def test_fp8_across_cpu_classes_gets_the_fp8_cross_class_slack():
    base = make_baseline(_fp8_report(VNNI))
    res = check_report(_fp8_report(AVX2), base)
    assert res.cross_class
    cos = next(c for c in res.checks if (c.stage, c.metric) == ("onnx-fp8", "cosine"))
    fp8 = DEFAULT_GATE_TOLERANCES["fp8"]["cosine"]["abs"] + DEFAULT_CROSS_CLASS_SLACK["fp8"]["cosine"]["abs"]
    assert cos.limit == pytest.approx(0.9991 - fp8)
