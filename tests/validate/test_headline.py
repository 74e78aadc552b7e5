"""The verdict line every report leads with (console, report.md, report.html), and checkpoint figures in every form."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest

from attn_export.validate import Accuracy, Latency, Report, Stage
from attn_export.validate.attention_report import describe_maps
from attn_export.validate.headline import format_tolerance, headline, shipped, wilson_interval
from attn_export.validate.render import write_reports

INT8_TOL = {"rel_l2": 0.05, "cosine_min": 0.999}


def layer_int8_report(passed: bool = True) -> Report:
    """What ``attn-export --quantize int8`` writes: fp32 export, two int8 routes, one selected as model.int8.onnx."""
    r = Report(model={"layer": "transformer", "d_model": 64, "heads": 4, "subject": "layer"},
               inputs={"batch": 8, "seq_len": 128, "seed": 0, "accuracy_data": "validation split of /opt/x/data/synthetic_d512.npz (8 sequences)"})  # fmt: skip
    eager = Latency(170.0, 180.0, 190.0)
    for name, prec, cos, p50, tol in (("onnx-fp32", "fp32", 1.0, 85.0, {"max_abs": 1e-4, "rel_l2": 1e-5}),
                                      ("int8-static", "int8", 0.99993, 34.0, INT8_TOL), ("int8-dynamic", "int8", 0.99995, 29.9, INT8_TOL)):  # fmt: skip
        r.add(Stage(name, f"out/model.{name}.onnx", prec, Accuracy(0.05, 0.01, 0.0099, cos, 40.0), {"artifact": Latency(p50, p50, p50), "eager": eager},
                    170.0 / p50, size_bytes=3 * 2**20, passed=True, tolerance=tol))  # fmt: skip
    r.selection["int8"] = {"route": "dynamic", "reason": "int8-dynamic is the fastest route meeting its tolerance (29.90 ms)", "tried": [],
                           "preference": ["dynamic", "static"], "band": 0.1, "stage": "int8-dynamic", "artifact": "out/model.int8.onnx"}  # fmt: skip
    r.verdict["passed"] = passed
    if not passed:
        r.verdict["failures"] = ["int8-dynamic met its tolerance on the select split but not on the report split: cosine 0.99 < 0.999"]
    return r


def checkpoint_report() -> Report:
    r = Report(model={"layer": "sentence-encoder[encoder]", "d_model": 384, "heads": 12, "subject": "encoder", "name": "minilm"},
               inputs={"batch": 8, "seq_len": 128, "accuracy_data": "320 held-out texts of text:text/en+zh+de+es+fr (report split)"})  # fmt: skip
    eager = Latency(300.0, 310.0, 320.0)
    for name, prec, emb, p50 in (("onnx-fp32", "fp32", (1.0, 1.0, 1.0), 180.0), ("int8-dynamic", "int8", (0.99712, 0.98812, 0.996875), 90.0)):
        r.add(Stage(name, f"out/model.{name}.onnx", prec, Accuracy(1e-3, 1e-4, 1e-3, emb[0], 40.0), {"artifact": Latency(p50, p50, p50), "eager": eager},
                    300.0 / p50, size_bytes=23 * 10**6, passed=True, tolerance={"min_mean_cosine": 0.99, "min_top1_agreement": 0.95},
                    details={"embedding": {"mean_cosine": emb[0], "min_cosine": emb[1], "top1_neighbor_agreement": emb[2], "num_texts": 320.0}}))  # fmt: skip
    r.selection["int8"] = {"route": "dynamic", "reason": "int8-dynamic is the only route meeting its tolerance", "tried": [], "preference": [],
                           "band": 0.1, "stage": "int8-dynamic", "artifact": "out/model.int8.onnx"}  # fmt: skip
    r.verdict["passed"] = True
    return r


def _console(report: Report, tmp_path) -> str:
    from rich.console import Console

    from attn_export.cli.summary import print_summary

    buf = io.StringIO()
    print_summary(report, tmp_path, Console(file=buf, width=300, color_system=None))
    return buf.getvalue()


def _first_html_element(page: str) -> str:
    return re.search(r"<body>(<[^>]+>)", page).group(1)


def test_the_headline_names_verdict_file_reason_accuracy_data_and_speedup():
    line = str(headline(layer_int8_report().to_dict()))
    assert line.startswith("PASS | ships model.int8.onnx (int8-dynamic is the fastest route meeting its tolerance (29.90 ms))"), line
    assert "on validation split of synthetic_d512.npz (8 sequences): cosine 0.999950, rel_l2 9.90e-03 (bar: rel_l2 <= 0.05, cosine >= 0.999)" in line
    assert "speed-up 5.69x vs eager PyTorch (29.90 vs 170.00 ms p50, timed side by side, batch 8 x 128 tokens)" in line


def test_a_failed_run_leads_with_fail_and_why():
    line = str(headline(layer_int8_report(passed=False).to_dict()))
    assert line.startswith("FAIL | int8-dynamic met its tolerance on the select split but not on the report split"), line


def test_nothing_ships_when_no_route_met_its_tolerance():
    r = layer_int8_report(passed=False).to_dict()
    r["selection"]["int8"] = {"route": None, "reason": "no route met the int8 tolerance on the select split", "tried": []}
    line = headline(r)
    assert line.file is None and "nothing ships: no int8 route met its tolerance" in str(line)


def test_without_a_selection_the_end_of_the_chain_ships():
    r = layer_int8_report().to_dict()
    del r["selection"]["int8"]
    r["stages"] = r["stages"][:1] + [dict(r["stages"][1], name="lowrank", artifact="out/model.lowrank.onnx", precision="fp32")]
    assert shipped(r).file == "model.lowrank.onnx" and "the end of the compression chain" in shipped(r).why
    r["stages"] = r["stages"][:1]
    assert shipped(r).file == "model.onnx-fp32.onnx" and "the plain export" in shipped(r).why


def test_checkpoint_headline_carries_min_cosine_top1_with_its_interval_and_the_data():
    line = str(headline(checkpoint_report().to_dict()))
    assert ("sentence embeddings vs the original on 320 held-out texts of text:text/en+zh+de+es+fr (report split): mean cosine 0.997120, "
            "min 0.988120, top-1 neighbour 99.7% (95% CI 98.3-99.9%, 320 texts)") in line, line  # fmt: skip


def test_wilson_interval_matches_the_closed_form():
    lo, hi = wilson_interval(1.0, 320)
    assert hi == pytest.approx(1.0) and lo == pytest.approx(320 / (320 + 1.96**2), rel=1e-9)  # k = n: lower bound n / (n + z^2)
    lo, hi = wilson_interval(0.5, 100)
    assert (lo, hi) == pytest.approx((0.4038, 0.5962), abs=1e-4)  # the textbook value
    assert format_tolerance({"min_min_cosine": 0.98, "unknown": 1}) == "min cosine >= 0.98"


@pytest.mark.parametrize("make", [layer_int8_report, checkpoint_report], ids=["layer", "checkpoint"])
def test_every_report_form_opens_with_the_verdict(make, tmp_path):
    report = make()
    line = headline(report.to_dict())
    console = _console(report, tmp_path)
    assert console.splitlines()[0] == str(line), console[:400]
    files = write_reports(report.to_dict(), tmp_path, attention=None)
    md = files["report.md"].read_text().splitlines()
    assert md[0].startswith("**PASS** · ships model.int8.onnx") and md[2] == "# attn-export report", md[:3]
    page = files["report.html"].read_text()
    assert _first_html_element(page) == '<p id="verdict" class="verdict PASS-box">', page[:300]
    assert "ships model.int8.onnx" in page[: page.index("<h1>")]


def test_checkpoint_reports_show_min_cosine_and_top1_in_every_form(tmp_path):
    report = checkpoint_report()
    console = _console(report, tmp_path)
    header = next(ln for ln in console.splitlines() if "stage" in ln and "precision" in ln)
    assert all(col in header for col in ("mean cos", "min cos", "top-1")), header
    row = next(ln for ln in console.splitlines() if "int8-dynamic" in ln and "PASS" in ln and "0.988120" in ln)
    assert "99.7%" in row and "0.997120" in row
    files = write_reports(report.to_dict(), tmp_path, attention=None)
    md = files["report.md"].read_text()
    assert "| stage | precision | mean cosine | min cosine | top-1 |" in md and "| int8-dynamic | int8 | 0.997120 | 0.988120 | 99.7% |" in md
    page = files["report.html"].read_text()
    assert "<th>min cosine</th><th>top-1</th>" in page and "<td>0.988120</td><td>99.7%</td>" in page


def test_sizes_are_binary_units_labelled_as_such(tmp_path):
    report = layer_int8_report()
    console = _console(report, tmp_path)
    assert "3.0 MiB" in console and " MB" not in console
    md = write_reports(report.to_dict(), tmp_path, attention=None)["report.md"].read_text()
    assert "| 3.0 MiB |" in md and " MB " not in md


def test_attention_maps_fail_only_above_the_shipped_stage_s_own_absolute_bar():
    rng = np.random.default_rng(0)
    eager = rng.random((1, 2, 8, 8))
    eager /= eager.sum(-1, keepdims=True)
    int8_like = eager + 1e-3 * rng.standard_normal(eager.shape)  # what an int8 model does to the probabilities
    text, failed = describe_maps(eager, int8_like, "model.int8.onnx (int8-dynamic, the shipped artifact)", None)  # int8: no max_abs bar
    assert not failed and "FAIL" not in text and "diagnostic" in text and "model.int8.onnx" in text
    text, failed = describe_maps(eager, int8_like, "model.onnx (onnx-fp32, the shipped artifact)", 1e-4)  # fp32: max_abs 1e-4
    assert failed and "FAIL: above the stage's max_abs bar 0.0001" in text
    text, failed = describe_maps(eager, eager + 1e-7, "model.onnx (onnx-fp32, the shipped artifact)", 1e-4)
    assert not failed and "within the stage's max_abs bar 0.0001" in text
