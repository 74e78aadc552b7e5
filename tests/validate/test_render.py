"""report.md / report.html: self-contained, and the HTML shows its plots in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from attn_export.validate import Accuracy, Latency, Report, Stage
from attn_export.validate.error_histogram import error_histogram
from attn_export.validate.render import write_reports

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), shutil.which("google-chrome")) if p), None)


def sample_report() -> dict:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(4096)
    r = Report(model={"layer": "transformer", "d_model": 64, "heads": 4}, inputs={"batch": 2, "seq_len": 16})
    for name, prec, noise, p50 in (("onnx-fp32", "fp32", 1e-7, 1.0), ("onnx-fp16", "fp16", 1e-3, 0.8), ("onnx-int8", "int8", 2e-2, 0.5)):
        out = ref + noise * rng.standard_normal(ref.size)
        cos = float(ref @ out / np.linalg.norm(ref) / np.linalg.norm(out))
        sq = float(10 * np.log10((ref @ ref) / ((ref - out) @ (ref - out))))
        r.add(Stage(name, f"{name}.onnx", prec, Accuracy(float(np.abs(ref - out).max()), 0.0, noise, cos, sq),
                    {"artifact": Latency(p50, p50 * 1.1, p50 * 1.2), "eager": Latency(1.5, 1.6, 1.7)}, 1.5 / p50,
                    size_bytes=1 << 20, passed=True, details={"error_histogram": error_histogram(ref, out)}))
    r.notes.append("fp16 <ran> on CPU & is slow")  # escaped in HTML
    return r.to_dict()


def sample_bench() -> dict:
    rows = []
    for v, k in (("eager-fp32", 1.0), ("ort-fp32-decomposed", 0.7)):
        for seq in (128, 256, 512):
            rows.append({"variant": v, "batch": 1, "seq": seq, "latency_ms": {"p50": k * seq / 100, "p90": k * seq / 90}, "peak_mem_bytes": seq * 4096})
    return {"results": rows}


def _maps():
    rng = np.random.default_rng(1)
    e = rng.random((1, 2, 8, 8)).astype(np.float32)
    e /= e.sum(-1, keepdims=True)
    return e, e + 1e-6


def test_markdown_and_html_are_self_contained(tmp_path):
    files = write_reports(sample_report(), tmp_path, bench_json=sample_bench(), attention=_maps())
    assert set(files) == {"report.md", "report.html", "latency.png", "pareto.png", "error_histograms.png", "seq_scaling.png", "attention_maps.png"}
    md = files["report.md"].read_text()
    assert "| onnx-int8 | int8 |" in md and "![" in md and "(pareto.png)" in md
    page = files["report.html"].read_text()
    assert page.count('src="data:image/png;base64,') == 5
    assert not re.search(r'(src|href)="(?!data:)', page), "report.html references an external asset"
    assert "&lt;ran&gt;" in page and "<ran>" not in page
    for name in ("latency.png", "pareto.png"):
        assert files[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_from_json_file_without_maps(tmp_path):
    import json

    path = tmp_path / "report.json"
    path.write_text(json.dumps(sample_report()))
    files = write_reports(path, tmp_path / "out", attention=None)
    assert "seq_scaling.png" not in files and "attention_maps.png" not in files
    assert files["report.html"].parent == tmp_path / "out"


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install -y chromium)")
def test_html_renders_its_plots_in_headless_chromium(tmp_path):
    files = write_reports(sample_report(), tmp_path, bench_json=sample_bench(), attention=_maps())
    page = files["report.html"].read_text()
    probe = (
        "<script>window.addEventListener('load',function(){var r=[];"
        "document.querySelectorAll('img').forEach(function(i){r.push(i.id+':'+i.naturalWidth+'x'+i.naturalHeight+':'+i.complete)});"
        "var p=document.createElement('pre');p.id='probe';p.textContent=r.join(';');document.body.appendChild(p)});</script>"
    )
    probed = tmp_path / "probe.html"
    probed.write_text(page.replace("</body>", probe + "</body>"))
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom", probed.as_uri(),
    ]  # fmt: skip
    dom = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'<pre id="probe">([^<]*)</pre>', dom)
    assert m, f"probe script did not run; chromium printed: {dom[:300]!r}"
    images = dict(item.split(":", 1) for item in m.group(1).split(";"))
    assert set(images) == {f"plot-{k}" for k in ("latency", "pareto", "error_histograms", "seq_scaling", "attention_maps")}
    for img_id, dims in images.items():
        w, h, complete = dims.split(":")[0].split("x") + [dims.split(":")[1]]
        assert int(w) > 100 and int(h) > 100 and complete == "true", f"{img_id} did not load: {dims}"


def test_report_command(tmp_path):
    import json

    from test_sweep import _app
    from typer.testing import CliRunner

    path = tmp_path / "report.json"
    path.write_text(json.dumps(sample_report()))
    res = CliRunner().invoke(_app(), ["report", str(path), "--out", str(tmp_path / "html"), "--no-attention-maps", "--json"])
    assert res.exit_code == 0, res.output
    files = json.loads(res.stdout)
    assert files["report.html"].endswith("report.html") and (tmp_path / "html" / "pareto.png").is_file()
