"""The verdict answers the question the command asked (issue 33): with --quantize the headline names the 8-bit model
with its figures on every judged data set, and a shipped model that fails one of them is PARTIAL (exit 3), not PASS,
in the console, report.md, report.html and the gate alike; --accept-partial ships it, recorded."""

from __future__ import annotations

import copy
import io
import json

from attn_export.validate import Accuracy, Latency, Report, Stage
from attn_export.validate.gate.check import check_report, make_baseline
from attn_export.validate.headline import headline
from attn_export.validate.render import write_reports
from attn_export.validate.verdict import EXIT_CODES, FAIL, PARTIAL, PASS, judged_sets, shipped, verdict_of

BAR = {"min_mean_cosine": 0.99, "min_top1_agreement": 0.95}
LONG = "long texts filling 128 tokens"


def _emb(mean: float, top1: float = 1.0, n: int = 320) -> dict:
    return {"mean_cosine": mean, "min_cosine": mean - 0.01, "top1_neighbor_agreement": top1, "num_texts": float(n)}


def minilm_int8_report(long_mean: float = 0.971874) -> Report:
    """What `attn-export --checkpoint minilm --quantize int8` writes: the fp32 form selection (model.onnx) listed first,
    the int8 one (model.int8.onnx) second, the int8 route judged on the report split and on long texts beside it."""
    r = Report(model={"layer": "sentence-encoder[encoder]", "subject": "encoder", "name": "minilm"},
               inputs={"batch": 8, "seq_len": 128, "accuracy_data": "320 held-out texts of text:text/en+zh (report split)"})  # fmt: skip
    eager = Latency(69.17, 70.0, 71.0)
    for name, prec, mean, long_m, p50, size in (("onnx-fp32-packed", "fp32", 1.0, 1.0, 38.78, 90_695_040),
                                                ("int8-dynamic-packed", "int8", 0.997081, long_mean, 17.82, 23_206_221)):  # fmt: skip
        long_v = [] if long_m >= 0.99 else [f"mean cosine {long_m:.6f} < 0.99"]
        r.add(Stage(name, f"/tmp/m8/model.{name}.onnx", prec, Accuracy(0.05, 0.01, 0.07, mean, 22.0), {"artifact": Latency(p50, p50, p50), "eager": eager}, 69.17 / p50,
                    size_bytes=size, passed=True, tolerance=BAR,
                    details={"embedding": _emb(mean), "violations": [],
                             "also_judged_on": {LONG: {"embedding": _emb(long_m, 0.875, 16), "passed": not long_v, "violations": long_v}}}))  # fmt: skip
    r.selection["form"] = {"route": "onnx-fp32-packed", "reason": "onnx-fp32-packed is the fastest route meeting its tolerance (38.78 ms)",
                           "stage": "onnx-fp32-packed", "artifact": "/tmp/m8/model.onnx", "precision": "fp32", "ships": False}  # fmt: skip
    r.selection["int8"] = {"route": "dynamic", "reason": "int8-dynamic-packed is the fastest route meeting its tolerance (17.82 ms)",
                           "stage": "int8-dynamic-packed", "artifact": "/tmp/m8/model.int8.onnx", "precision": "int8", "ships": True}  # fmt: skip
    r.verdict["passed"] = True
    return r


def minilm_int8(long_mean: float = 0.971874) -> dict:
    return json.loads(json.dumps(minilm_int8_report(long_mean).to_dict()))


def test_with_quantize_the_headline_names_the_8bit_model_its_figures_on_every_data_set_speed_and_size():
    line = headline(minilm_int8(long_mean=0.995))
    text = str(line)
    assert text.startswith("PASS | ships model.int8.onnx (int8-dynamic-packed is the fastest route"), text
    assert "on 320 held-out texts of text:text/en+zh (report split): mean cosine 0.997081" in text and " pass; " in text
    assert f"on {LONG}: mean cosine 0.995000" in text and "speed-up 3.88x" in text and "size 22.1 MiB" in text
    assert line.below == ["fp32 form: model.onnx (onnx-fp32-packed is the fastest route meeting its tolerance (38.78 ms))"]


def test_a_shipped_model_failing_long_texts_is_partial_with_exit_3_not_a_bare_pass():
    report = minilm_int8()
    verdict = verdict_of(report)
    assert (verdict.state, verdict.exit_code, EXIT_CODES[PARTIAL]) == (PARTIAL, 3, 3)
    assert verdict.misses == [f"model.int8.onnx (int8-dynamic-packed) fails on {LONG}: mean cosine 0.971874 < 0.99"]
    text = str(headline(report))
    assert text.startswith(f"PARTIAL | model.int8.onnx (int8-dynamic-packed) fails on {LONG}: mean cosine 0.971874 < 0.99 (exit 3;"), text
    assert f"on {LONG}: mean cosine 0.971874, min 0.961874, top-1 neighbour 87.5%" in text and "FAIL (mean cosine 0.971874 < 0.99)" in text
    report["verdict"]["accept_partial"] = True
    accepted = verdict_of(report)
    assert (accepted.state, accepted.exit_code, accepted.ok) == (PARTIAL, 0, True)
    assert "(shipped anyway: --accept-partial)" in str(headline(report))


def test_failures_still_fail_and_a_clean_run_passes():
    report = minilm_int8()
    report["verdict"]["failures"] = ["selection int8: no candidate met its tolerance on the select split"]
    assert (verdict_of(report).state, verdict_of(report).exit_code) == (FAIL, 1)
    assert (verdict_of(minilm_int8(0.995)).state, verdict_of(minilm_int8(0.995)).exit_code) == (PASS, 0)


def test_judged_sets_are_read_from_the_report_and_derived_for_older_ones():
    report = minilm_int8()
    stage = report["stages"][1]
    derived = judged_sets(stage, report)
    assert [(s.data, s.role, s.passed) for s in derived] == [("320 held-out texts of text:text/en+zh (report split)", "report split", True),
                                                            (LONG, "beside", False)]  # fmt: skip
    stage["details"]["judged_sets"] = [dict(s.to_dict(), passed=True) for s in derived]  # what a run stores: the stored list wins
    assert verdict_of(report).state == PASS


def test_old_reports_without_ships_name_the_8bit_selection_not_the_fp32_form():
    report = minilm_int8(0.995)
    for entry in report["selection"].values():
        entry.pop("ships")
    assert shipped(report).file == "model.int8.onnx"


def test_console_md_and_html_lead_with_the_same_partial_line(tmp_path):
    from rich.console import Console

    from attn_export.cli.summary import print_summary

    report = minilm_int8()
    line = headline(report)
    buf = io.StringIO()
    print_summary(minilm_int8_report(), tmp_path, Console(file=buf, width=400, color_system=None))
    lines = buf.getvalue().splitlines()
    assert lines[0] == str(line) and lines[1] == line.below[0], lines[:2]
    files = write_reports(report, tmp_path, attention=None)
    md = files["report.md"].read_text().splitlines()
    assert md[0].startswith("**PARTIAL** · model.int8.onnx (int8-dynamic-packed) fails on long texts"), md[:3]
    assert "ships model.int8.onnx" in md[0] and md[2].startswith("- fp32 form: model.onnx"), md[:5]
    page = files["report.html"].read_text()
    assert '<p id="verdict" class="verdict PARTIAL-box"><b class="PARTIAL">PARTIAL</b>' in page and "ships model.int8.onnx" in page[: page.index("<h1>")]


def test_the_gate_applies_the_same_rule():
    report = minilm_int8()
    base = make_baseline(minilm_int8(0.995))
    result = check_report(report, base)
    bad = [c for c in result.checks if not c.ok]
    assert [(c.stage, c.metric) for c in bad] == [("int8-dynamic-packed", "judged data sets")], str(result)
    assert "PARTIAL: model.int8.onnx (int8-dynamic-packed) fails on long texts" in bad[0].message and "--accept-partial" in bad[0].message
    accepted = copy.deepcopy(report)
    accepted["verdict"]["accept_partial"] = True
    res = check_report(accepted, base)
    assert res and any(c.metric == "judged data sets" and c.message.startswith("accepted with --accept-partial") for c in res.checks), str(res)


def test_the_runner_records_the_verdict_and_what_the_user_accepted():
    from types import SimpleNamespace

    from attn_export.pipeline.runner import RunResult, _verdict

    for accept, code in ((False, 3), (True, 0)):
        report = minilm_int8_report()
        _verdict(report, SimpleNamespace(accept_partial=accept))
        assert report.verdict["state"] == PARTIAL and report.verdict["passed"] is accept, report.verdict
        assert report.verdict.get("accept_partial", False) is accept and report.verdict["partial"][0].startswith("model.int8.onnx")
        assert RunResult(report, plan=None).exit_code == code  # type: ignore[arg-type]
