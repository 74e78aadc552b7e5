"""report.md / report.html: self-contained, rendered for every layer x mask (linear attention
gets a note instead of maps), text from report.json escaped, and the HTML shows its plots in
headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fixtures import LAYER_MASKS

from attn_export.errors import DataError
from attn_export.validate import Accuracy, Latency, Report, Stage
from attn_export.validate.attention_report import attention_section
from attn_export.validate.error_histogram import error_histogram
from attn_export.validate.render import markdown_escape, write_reports

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
    path = tmp_path / "report.json"
    path.write_text(json.dumps(sample_report()))
    files = write_reports(path, tmp_path / "out", attention=None)
    assert "seq_scaling.png" not in files and "attention_maps.png" not in files
    assert files["report.html"].parent == tmp_path / "out"


def _chromium_page(page: str, tmp_path) -> tuple[dict[str, str], dict[str, int]]:
    """Load ``page`` in headless Chromium: (img id -> "WxH:complete" as the browser decoded it, header table id -> its rows)."""
    probe = (
        "<script>window.addEventListener('load',function(){var r=[];"
        "document.querySelectorAll('img').forEach(function(i){r.push(i.id+':'+i.naturalWidth+'x'+i.naturalHeight+':'+i.complete)});"
        "document.querySelectorAll('#header table').forEach(function(t){r.push(t.id+':'+t.rows.length)});"
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
    found = dict(item.split(":", 1) for item in m.group(1).split(";") if item)
    return {k: v for k, v in found.items() if not k.startswith("header-")}, {k: int(v) for k, v in found.items() if k.startswith("header-")}


def _chromium_images(page: str, tmp_path) -> dict[str, str]:
    return _chromium_page(page, tmp_path)[0]


def _assert_loaded(images: dict[str, str]) -> None:
    for img_id, dims in images.items():
        w, h, complete = dims.split(":")[0].split("x") + [dims.split(":")[1]]
        assert int(w) > 100 and int(h) > 100 and complete == "true", f"{img_id} did not load: {dims}"


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install -y chromium)")
def test_html_renders_its_plots_in_headless_chromium(tmp_path):
    files = write_reports(sample_report(), tmp_path, bench_json=sample_bench(), attention=_maps())
    images = _chromium_images(files["report.html"].read_text(), tmp_path)
    assert set(images) == {f"plot-{k}" for k in ("latency", "pareto", "error_histograms", "seq_scaling", "attention_maps")}
    _assert_loaded(images)


def test_report_command(tmp_path):
    from typer.testing import CliRunner

    from attn_export.cli.app import _register, app

    _register()
    path = tmp_path / "report.json"
    path.write_text(json.dumps(sample_report()))
    res = CliRunner().invoke(app, ["report", str(path), "--out", str(tmp_path / "html"), "--no-attention-maps", "--json"])
    assert res.exit_code == 0, res.output
    files = json.loads(res.stdout)
    assert files["report.html"].endswith("report.html") and (tmp_path / "html" / "pareto.png").is_file()


def test_report_command_refuses_bad_paths_in_one_line(tmp_path, capsys):
    from attn_export.cli import main

    path = tmp_path / "report.json"
    path.write_text(json.dumps(sample_report()))
    for args, expected in (
        (["--out", str(path)], f"--out {path}: expected a folder, got a file"),
        (["--bench", str(tmp_path / "missing.json")], f"{tmp_path / 'missing.json'}: expected a bench.json from attn-export bench, got no such file"),
    ):
        assert main(["report", str(path), "--no-attention-maps", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"attn-export: error: {expected}") and err.count("\n") == 1, err
    assert main(["report", str(tmp_path / "nope.json")]) == 2
    assert "expected an attn-export report.json, got no such file" in capsys.readouterr().err


# --- every layer x mask renders (issue 13, class 1) ---------------------------------------------


def _layer_report(layer: str, mask: str, out, **model_extra) -> dict:
    """What the pipeline leaves in --out for a reference layer: its fp32 ONNX model and report.json.

    Built directly (export + one stage) rather than by running the pipeline, to keep this 16-case
    test fast; ``test_pipeline_renders_every_layer_and_mask`` runs the real pipeline (slow), and
    block-sparse and linear reports written by the pipeline failed the same way as these.
    """
    from attn_export.export import export_onnx
    from attn_export.layers import MaskedLayer, build_layer
    from attn_export.pipeline.run import PipelineConfig

    cfg = PipelineConfig(layer=layer, mask=mask, d_model=64, heads=4, seq_len=16, batch=2, repeats=1, warmup=0, out=out)
    kw = {k: v for k, v in model_extra.items() if k in ("block_size", "window")}
    model = MaskedLayer(build_layer(layer, 64, 4, mask=mask, seed=cfg.seed, **kw), mask)
    export_onnx(model, out / "model.onnx", cfg.export_spec())
    r = Report(
        model={"layer": layer, "d_model": 64, "heads": 4, "params": sum(p.numel() for p in model.parameters()), "mask": mask, **model_extra},
        inputs={"batch": 2, "seq_len": model_extra.get("seq_len", 16), "seed": cfg.seed},
    )
    r.add(Stage("onnx-fp32", str(out / "model.onnx"), "fp32", Accuracy(1e-6, 1e-7, 1e-7, 1.0, 140.0),
                {"artifact": Latency(1.0, 1.1, 1.2), "eager": Latency(2.0, 2.1, 2.2)}, 2.0, passed=True,
                tolerance={"max_abs": 1e-4, "rel_l2": 1e-5}))  # fmt: skip
    r.write(out / "report.json")
    return r.to_dict()


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """(layer, mask) -> the files write_reports produced for it; each built once per module."""
    cache: dict[tuple[str, str], dict] = {}

    def get(layer: str, mask: str) -> dict:
        if (layer, mask) not in cache:
            out = tmp_path_factory.mktemp(f"{layer}-{mask}")
            _layer_report(layer, mask, out)
            cache[layer, mask] = write_reports(out / "report.json", out)
        return cache[layer, mask]

    return get


# every layer, and every mask once, in the default suite; the other pairs are slow (each exports a model)
DEFAULT_RENDERS = {("transformer", "padding"), ("transformer", "window"), ("mha", "causal"), ("self-attention", "none"),
                   ("block-sparse", "padding"), ("linear", "causal")}  # fmt: skip
RENDER_CASES = [pytest.param(layer, mask, id=f"{layer}-{mask}", marks=() if (layer, mask) in DEFAULT_RENDERS else pytest.mark.slow)
                for layer, mask in LAYER_MASKS]  # fmt: skip


@pytest.mark.parametrize(("layer", "mask"), RENDER_CASES)
def test_every_layer_and_mask_renders_markdown_and_html(layer, mask, rendered):
    files = rendered(layer, mask)
    md, page = files["report.md"].read_text(), files["report.html"].read_text()
    assert "| onnx-fp32 | fp32 |" in md and "<td>onnx-fp32</td>" in page
    if layer == "linear":  # no softmax probabilities: a note, not maps
        assert "attention_maps.png" not in files
        assert "no attention maps: the linear layer computes no softmax attention probabilities" in md
        assert '<p id="attention-note">no attention maps: the linear layer' in page
    else:
        assert "attention_maps.png" in files and 'id="plot-attention_maps"' in page
        text = md.replace("\\", "")  # Markdown escapes
        assert "attention maps, eager fp32 vs " in text and "per head: within the stage's max_abs bar 0.0001" in text, md
        assert "model.onnx (onnx-fp32, the shipped artifact)" in text or "a decomposed fp32 re-export" in text, md
        assert "no attention maps" not in md


def test_block_sparse_maps_are_block_diagonal_over_several_blocks(tmp_path):
    """block_size 8, L 20: three blocks (the last padded); maps are (1, H, 20, 20), zero off the blocks."""
    report = _layer_report("block-sparse", "padding", tmp_path, block_size=8, seq_len=20)
    sec = attention_section(report, tmp_path)
    assert sec.note == "" and sec.eager_maps.shape == sec.onnx_maps.shape == (1, 4, 20, 20)
    assert "within the stage's max_abs bar 0.0001" in sec.summary and not sec.failed
    block = np.kron(np.eye(3), np.ones((8, 8)))[:20, :20].astype(bool)
    assert not sec.eager_maps[..., ~block].any() and not sec.onnx_maps[..., ~block].any()
    kept = sec.eager_maps[0, :, :15].sum(-1)  # padded tail: keys 15.. masked, the first 15 rows sum to 1
    assert np.allclose(kept, 1.0, atol=1e-5)


def test_a_report_whose_model_is_not_a_reference_layer_gets_a_note(tmp_path):
    rep = sample_report()
    rep["model"] = {"layer": "sentence-encoder[layers]", "d_model": 384, "heads": 12}
    files = write_reports(rep, tmp_path)
    assert "not a reference layer that can be rebuilt" in files["report.md"].read_text()


@pytest.mark.slow
@pytest.mark.parametrize(("layer", "mask"), LAYER_MASKS, ids=[f"{layer}-{mask}" for layer, mask in LAYER_MASKS])
def test_pipeline_renders_every_layer_and_mask(layer, mask, tmp_path):
    from attn_export.pipeline.run import PipelineConfig, run_pipeline

    run_pipeline(PipelineConfig(layer=layer, mask=mask, d_model=64, heads=4, seq_len=16, batch=2, repeats=1, warmup=0, out=tmp_path))
    md = (tmp_path / "report.md").read_text()
    assert (tmp_path / "report.html").is_file() and "## Stages" in md
    assert ((tmp_path / "attention_maps.png").is_file()) == (layer != "linear")


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install -y chromium)")
@pytest.mark.parametrize(("layer", "mask"), [("linear", "causal"), ("block-sparse", "padding")])
def test_linear_and_block_sparse_reports_render_in_headless_chromium(layer, mask, rendered, tmp_path):
    files = rendered(layer, mask)
    images = _chromium_images(files["report.html"].read_text(), tmp_path)
    expected = {"plot-latency", "plot-pareto"} | ({"plot-attention_maps"} if layer != "linear" else set())
    assert set(images) == expected
    _assert_loaded(images)


# --- report.md escapes what comes from report.json (issue 13, class 10) ---------------------------


def test_markdown_escapes_html_and_table_syntax(tmp_path):
    markdown_it = pytest.importorskip("markdown_it", reason="markdown-it-py (a rich dependency) renders the Markdown")
    rep = sample_report()
    rep["notes"] = ["<script>alert(1)</script> and <img src=x onerror=alert(2)>", "a | b", "[click](javascript:alert(3))"]
    rep["stages"][0]["name"] = "onnx|fp32 <b>bold</b>"
    rep["environment"] = {"host": "<iframe src=evil>", "cpu": {"isa_class": "x86-avx2", "flags": ["avx2", "fma"]}}
    files = write_reports(rep, tmp_path, attention=None)
    md = files["report.md"].read_text()
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(md)  # commonmark passes raw HTML through
    for tag in ("<script", "<img src=x", "<iframe", "<b>bold", 'href="javascript'):
        assert tag not in rendered, f"{tag} injected into the rendered report.md"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered and "a | b" in rendered
    rows = [r for r in re.findall(r"<tr>(.*?)</tr>", rendered, re.S) if r.count("<td") + r.count("<th") != 2]  # the header's are (fact, value)
    assert len(rows) == 1 + 3 and all(r.count("<td") + r.count("<th") == 12 for r in rows), rows
    assert "onnx|fp32 &lt;b&gt;bold&lt;/b&gt;" in rows[1]
    assert "| CPU | x86-avx2 (avx2, fma) |" in md.replace("\\", "") and "| host | &lt;iframe src=evil&gt; |" in md
    page = files["report.html"].read_text()
    assert "<script>alert" not in page and "<iframe" not in page


def test_markdown_escape_is_one_line_and_inert():
    assert markdown_escape("a\nb\r\nc") == "a b c"
    assert markdown_escape("*x* _y_ `z` ~w~ \\") == "\\*x\\* \\_y\\_ \\`z\\` \\~w\\~ \\\\"
    assert markdown_escape("1.5x & <ok>") == "1.5x &amp; &lt;ok&gt;"


def test_malformed_report_or_bench_is_one_line(tmp_path):
    bad = sample_report()
    bad["stages"][0]["accuracy"]["cosine"] = "high"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(DataError, match=r"report\.json: stages\[onnx-fp32\]\.accuracy\.cosine: expected a number, got \"high\""):
        write_reports(path, tmp_path / "out")
    (tmp_path / "bench.json").write_text(json.dumps({"results": [{"variant": "x", "batch": "1", "seq": 128}]}))
    path.write_text(json.dumps(sample_report()))
    with pytest.raises(DataError, match=r"bench\.json: results\[0\]\.batch: expected an integer"):
        write_reports(path, tmp_path / "out", bench_json=tmp_path / "bench.json")
    assert not (tmp_path / "out" / "report.md").exists()


# --- the verdict is the first thing a browser shows (issue 23) -------------------------------------

_LAYOUT_PROBE = (
    "<script>window.addEventListener('load',function(){var v=document.getElementById('verdict').getBoundingClientRect();"
    "var imgs=[];document.querySelectorAll('img').forEach(function(i){var r=i.getBoundingClientRect();imgs.push([i.id,r.right,i.naturalWidth])});"
    "var p=document.createElement('pre');p.id='layout';p.textContent=JSON.stringify({verdict:[v.left,v.top,v.right,v.bottom],"
    "view:[window.innerWidth,window.innerHeight],scroll:document.documentElement.scrollWidth,imgs:imgs});document.body.appendChild(p)});</script>"
)


def _chromium(args: list[str], tmp_path) -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
           "--virtual-time-budget=5000", "--window-size=1280,800", *args]  # fmt: skip
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120).stdout


def _first_screen(page, tmp_path) -> tuple[dict, np.ndarray]:
    """(layout of the page at 1280x800 as the browser laid it out, the screenshot's pixels)."""
    from PIL import Image

    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>", _LAYOUT_PROBE + "</body>"))
    m = re.search(r'<pre id="layout">([^<]*)</pre>', _chromium(["--dump-dom", probed.as_uri()], tmp_path))
    assert m, "layout probe did not run in chromium"
    shot = tmp_path / "first-screen.png"
    _chromium([f"--screenshot={shot}", page.as_uri()], tmp_path)
    return json.loads(m.group(1).replace("&quot;", '"')), np.asarray(Image.open(shot).convert("RGB"), dtype=np.int16)


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install -y chromium)")
@pytest.mark.parametrize("kind", ["layer", "checkpoint"])
def test_the_verdict_is_visible_in_the_first_screen_and_nothing_overflows(kind, rendered, tmp_path):
    from test_headline import checkpoint_report

    if kind == "layer":
        page = rendered("transformer", "padding")["report.html"]  # a real export, with its attention maps
    else:
        page = write_reports(checkpoint_report().to_dict(), tmp_path / "ckpt", attention=None)["report.html"]
    layout, pixels = _first_screen(page, tmp_path)
    (left, top, right, bottom), (width, height) = layout["verdict"], layout["view"]
    assert width == 1280 and height >= 600, layout["view"]  # the window minus what headless Chromium keeps for its own frame
    assert 0 <= top and bottom <= height / 2 and 0 <= left < right <= width, layout  # the whole line, in the top half of the first screen
    assert layout["scroll"] <= width, "the page scrolls sideways at 1280 px"
    assert layout["imgs"] and all(r <= width for _, r, _ in layout["imgs"]), layout["imgs"]
    assert pixels.shape[:2] == (800, 1280)
    box = pixels[int(top) + 2 : int(bottom) - 2, int(left) + 2 : int(right) - 2]
    pass_box, pass_text = np.array([0xE6, 0xF4, 0xEA]), np.array([0x1A, 0x7F, 0x37])  # report.html's CSS for a PASS verdict
    assert np.mean(np.abs(box - pass_box).sum(-1) < 12) > 0.5, "the verdict box is not painted where the DOM puts it"
    assert np.sum(np.abs(box - pass_text).sum(-1) < 60) > 30, "no PASS text drawn in the verdict box"


# --- the header: labelled tables, one row per fact (issue 33) --------------------------------------

MINILM_HEADER = Path(__file__).parent / "data" / "minilm_report_header.json"


def _minilm_report() -> dict:
    """The checkpoint fixture's stages under the model, inputs and environment a real MiniLM int8 run recorded."""
    from test_headline import checkpoint_report

    report = checkpoint_report().to_dict()
    header = json.loads(MINILM_HEADER.read_text())
    return {**report, **{k: header[k] for k in ("model", "inputs", "environment")}}


def _md_header(md: str) -> str:
    return md[md.index("\n\n", md.index("**PASS**")) : md.index("## Stages")]


def test_the_header_is_labelled_tables_one_fact_a_row_without_dict_syntax(tmp_path):
    files = write_reports(_minilm_report(), tmp_path, attention=None)
    md = files["report.md"].read_text()
    head = _md_header(md)
    for token in ("{", "}", "True", "False", "None", "=["):
        assert token not in head, f"{token!r} in report.md's header:\n{head}"
    text = head.replace("\\", "")
    for row in ("| Model | |", "| Inputs | |", "| Environment | |", "| family | bert |", "| pooling | mean+normalize (1_Pooling/config.json) |",
                "| checkpoint | minilm (", "| shape | d_model 384, 12 heads, 6 layers |", "| parameters | 22.6 M |",
                "| lengths judged (tokens) | 320 texts: min 14, p50 26, p90 35, max 64 |",
                "| timed on | real texts (batch 8, 40 batches, 22% padding); fixed (batch 8, 79% padding) |",
                "| CPU | AMD EPYC (x86_64), 2 cores, x86-avx512-vnni (avx2, avx512f, avx512bw, avx512_vnni) |",
                "| versions | attn_export 0.1.0, python 3.11.7, torch 2.13.0+cpu, onnx 1.23.2, onnxruntime 1.32.0, numpy 2.4.6 |"):  # fmt: skip
        assert row in text, f"{row!r} not in report.md's header:\n{text}"
    assert "| fidelity to the reference | PASS: min cosine 1.000000, max |diff| 3.3e-06 on " in text  # rounded here; exact in report.json
    assert all(line.count(" | ") == 1 for line in text.strip().splitlines() if line.startswith("| ") and "---" not in line)  # two columns
    page = files["report.html"].read_text()
    for key in ("model", "inputs", "environment"):
        assert f'<table class="facts" id="header-{key}"><caption>{key.capitalize()}</caption>' in page
    assert "<tr><th>family</th><td>bert</td></tr>" in page and "<dt>" not in page


def test_a_key_no_row_reads_still_shows_flattened_and_readable(tmp_path):
    report = _minilm_report()
    report["environment"]["gpu"] = {"name": "H200", "mig": False, "driver": None, "clocks_mhz": [1980, 2619.5]}
    head = _md_header(write_reports(report, tmp_path, attention=None)["report.md"].read_text()).replace("\\", "")
    assert "| gpu · name | H200 |" in head and "| gpu · mig | no |" in head and "| gpu · driver | - |" in head, head
    assert "| gpu · clocks mhz | 1980, 2620 |" in head or "| gpu · clocks_mhz | 1980, 2620 |" in head, head
    assert "{" not in head and "None" not in head and "False" not in head


def test_a_layer_report_header_reads_the_same_way(rendered):
    head = _md_header(rendered("transformer", "padding")["report.md"].read_text()).replace("\\", "")
    assert "| subject | transformer |" in head and "| shape | d_model 64, 4 heads |" in head and "| mask | padding |" in head, head
    assert "{" not in head and "True" not in head and "None" not in head


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install -y chromium)")
def test_a_checkpoint_report_shows_its_header_tables_and_every_plot_in_headless_chromium(tmp_path):
    from attn_export.validate.attention_report import AttentionSection

    eager, onnx = _maps()
    section = AttentionSection(eager, onnx, "int8-dynamic (layer 5)", "attention maps, the user's model vs model.int8.onnx")
    files = write_reports(_minilm_report(), tmp_path, attention=section)
    images, tables = _chromium_page(files["report.html"].read_text(), tmp_path)
    assert set(images) >= {"plot-latency", "plot-attention_maps"}, images
    _assert_loaded(images)
    assert set(tables) == {"header-model", "header-inputs", "header-environment"} and min(tables.values()) >= 5, tables
