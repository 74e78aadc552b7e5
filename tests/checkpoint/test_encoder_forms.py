"""``--encoder-form``: the plan builds both forms where it should, and a run ships the form it measured faster.

The packed form's numerics are tested in tests/layers/test_packed.py and, per family, in
test_families.py; here the planner's choice of forms and a whole ``--encoder-form auto`` run:
both forms judged, the ``form`` selection writing ``model.onnx``, the int8 selection taking the
routes of both forms, and the real-text batches the selections decided on named in the report.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from attn_export.config.run import RunConfig
from attn_export.pipeline.plan import make_plan
from attn_export.pipeline.runner import run


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_auto_plans_both_forms_on_onnx_runtime_and_one_where_the_other_cannot_ship():
    both = make_plan(RunConfig(checkpoint="minilm", quantize="int8", int8_mode="dynamic"))
    names = [s.name for s in both.steps]
    assert names == ["onnx-fp32", "onnx-fp32-packed", "int8-dynamic", "int8-dynamic-packed"], names  # the fp32 twins first: form_first
    files = {s.name: s.filename for s in both.steps}
    assert files["onnx-fp32"] == "model.padded.onnx" and files["onnx-fp32-packed"] == "model.packed.onnx"
    form, int8 = both.selections[0], both.selections[1]
    assert form.key == "form" and set(form.candidates) == {"onnx-fp32", "onnx-fp32-packed"} and form.filename == "model.onnx"
    assert set(int8.candidates) == {"int8-dynamic", "int8-dynamic-packed"}
    for cfg, reason in ((RunConfig(checkpoint="minilm", quantize="int8", target="tensorrt"), "--encoder-form auto: padded"),
                        (RunConfig(checkpoint="minilm", low_rank=0.5), "with --low-rank/--distill")):  # fmt: skip
        plan = make_plan(cfg)
        assert not any(s.name.endswith("-packed") for s in plan.steps) and all(sel.key != "form" for sel in plan.selections)
        assert any(reason in n for n in plan.notes), plan.notes  # the report says why one form only
    packed = make_plan(RunConfig(checkpoint="minilm", encoder_form="packed"))
    assert [s.filename for s in packed.steps] == ["model.onnx"] and packed.fp32_spec.encoder_form == "packed"


@pytest.mark.parametrize("flag", ["padded", "packed"])
def test_a_forced_form_is_refused_for_a_layer(flag):
    from attn_export.errors import ConfigError

    with pytest.raises(ConfigError, match="--encoder-form applies to a --checkpoint run"):
        RunConfig(encoder_form=flag)


def test_an_auto_run_judges_both_forms_and_ships_the_selected_file(tmp_path):
    """fp32 only (the int8 selection's candidates from both forms are the plan's, checked above; an int8 run of both
    forms is bench/real_text.py's and the docs' run): both exports judged, the faster meeting its tolerance is model.onnx."""
    out = tmp_path / "out"
    cfg = RunConfig(checkpoint="minilm", out=out, repeats=1, warmup=0, batch=2, seq_len=32, threads=2, render=False, max_texts=16)
    run(cfg)
    report = json.loads((out / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    assert set(stages) == {"onnx-fp32", "onnx-fp32-packed"} and all(s["passed"] for s in stages.values())
    pad, pac = stages["onnx-fp32"]["details"]["embedding"], stages["onnx-fp32-packed"]["details"]["embedding"]
    assert pac["mean_cosine"] == pytest.approx(pad["mean_cosine"], abs=1e-6) and pac["min_cosine"] > 0.99999, (pad, pac)
    form = report["selection"]["form"]
    assert {t["stage"] for t in form["tried"]} == {"onnx-fp32", "onnx-fp32-packed"} and "--encoder-form auto" in form["why_these"]
    fastest = min(form["tried"], key=lambda t: t["p50_ms"])["stage"]
    assert form["stage"] == fastest or "within 10%" in form["reason"], form  # ties within the band go to the preferred form
    shipped = {"onnx-fp32": out / "model.padded.onnx", "onnx-fp32-packed": out / "model.packed.onnx"}[form["stage"]]
    assert _sha(out / "model.onnx") == _sha(shipped) == form["sha256"]
    real = report["inputs"]["timed_on"][0]  # the first input decides the selections
    assert real["label"] == "real texts" and real["batch"] == 2 and real["texts"] == 2 * real["batches"] and 0.0 <= real["padding_fraction"] < 1.0
