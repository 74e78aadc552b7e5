"""Documented layers run end to end and render (class 1); reports render text as text (class 10);
``--update-baseline`` never drops what the report lacks (class 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rel_helpers import TINY, good_report, run_cli, write_json


@pytest.mark.parametrize(("layer", "mask"), [("linear", "causal"), ("block-sparse", "padding")],
                         ids=["c01-linear-causal-renders", "c01-block-sparse-padding-renders"])  # fmt: skip
def test_documented_layers_run_and_render(layer: str, mask: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    o = run_cli([*TINY, "--layer", layer, "--mask", mask, "--out", out, "--quiet"], capsys, tmp_path)
    assert o.code == 0, o.err
    assert "Traceback" not in o.err
    html = (out / "report.html").read_text(encoding="utf-8")
    assert (out / "report.md").stat().st_size > 0 and "<img" in html
    report = json.loads((out / "report.json").read_text())
    assert report["model"]["layer"] == layer and report["verdict"]["passed"] is True


def test_c10_report_md_and_html_render_report_text_as_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = good_report()
    r["notes"] = ["<script>alert('note')</script>", "| a | table | breaker |"]
    r["stages"][0]["details"]["violations"] = ["<img src=x onerror=alert(1)>"]
    src = write_json(tmp_path / "r.json", r)
    o = run_cli(["report", src, "--out", tmp_path / "out", "--no-attention-maps", "--quiet"], capsys, tmp_path)
    assert o.code == 0, o.err
    md = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    html = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "<script>alert" not in md and "<script>alert" not in html
    assert "alert('note')" in md or "alert(&#x27;note&#x27;)" in md or "alert(&#39;note&#39;)" in md, "the note is still shown"


def test_c03_update_baseline_keeps_metrics_the_report_lacks_unless_pruned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full = write_json(tmp_path / "full.json", good_report())
    baseline = tmp_path / "baseline.json"
    assert run_cli(["check", full, "--baseline", baseline, "--update-baseline", "-q"], capsys, tmp_path).code == 0
    partial = good_report()
    partial["stages"][1]["accuracy"] = None
    lacking = write_json(tmp_path / "partial.json", partial)
    o = run_cli(["check", lacking, "--baseline", baseline, "--update-baseline"], capsys, tmp_path)
    assert o.code == 0, o.err
    stages = json.loads(baseline.read_text())["classes"]["x86-avx2"]["stages"]
    assert set(stages["onnx-int8"]["metrics"]) == {"cosine", "sqnr_db", "rel_l2", "max_abs"}, "metrics dropped silently"
    assert "kept from the previous baseline" in o.out
    o = run_cli(["check", lacking, "--baseline", baseline, "--update-baseline", "--prune"], capsys, tmp_path)
    assert o.code == 0 and "removed (--prune)" in o.out
    assert json.loads(baseline.read_text())["classes"]["x86-avx2"]["stages"]["onnx-int8"]["metrics"] == {}
