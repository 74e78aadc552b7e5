"""The ``attn-export`` command: the no-argument default job and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from attn_export.cli import main


def test_no_arguments_runs_default_job(tmp_path):
    """A fresh user types ``attn-export``: default layer, ONNX Runtime CPU, report written."""
    proc = subprocess.run(
        [sys.executable, "-m", "attn_export.cli"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out_dir = tmp_path / "attn-export-out"
    assert (out_dir / "model.onnx").is_file()
    report = json.loads((out_dir / "report.json").read_text())
    assert {k: report["model"][k] for k in ("layer", "d_model", "heads", "mask")} == {"layer": "transformer", "d_model": 512, "heads": 8, "mask": "padding"}
    assert report["model"]["params"] == 4 * (512 * 512 + 512) + 2 * 512 * 2048 + 2048 + 512 + 4 * 512
    stage = report["stages"][0]
    for key in ("name", "artifact", "precision", "accuracy", "latency_ms", "speedup_vs_eager", "size_bytes"):
        assert key in stage
    assert set(stage["accuracy"]) == {"max_abs", "mean_abs", "rel_l2", "cosine", "sqnr_db"}
    assert {"p50", "p90", "p99"} <= set(stage["latency_ms"]["artifact"]) and "eager" in stage["latency_ms"]
    assert stage["accuracy"]["max_abs"] <= 1e-4 and stage["passed"] is True
    assert "onnx-fp32" in proc.stdout and "PASS" in proc.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--heads", "7"], "heads must divide d_model"),
        (["--layer", "nope"], "unknown --layer"),
        (["--seq-len", "0"], "expected --seq-len in [1,"),
        (["--mask", "window", "--layer", "block-sparse"], "supports --mask"),
        (["--attention", "flash"], "expected --attention"),
        (["--batch", "x"], "--batch"),
        (["--no-such-flag"], "No such option"),
    ],
)
def test_bad_arguments_fail_in_one_line_without_partial_output(tmp_path, capsys, args, needle):
    out = tmp_path / "out"
    rc = main([*args, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc != 0
    assert len(err.splitlines()) == 1 and err.startswith("attn-export: error:") and needle in err, err
    assert not (out / "model.onnx").exists()


def test_unwritable_out_dir(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    rc = main(["--out", str(blocker / "sub"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "is a file" in err and len(err.splitlines()) == 1
    assert not (blocker / "sub").exists()


def test_int8_run_lists_every_artifact_and_writes_no_carriage_returns_to_a_log(tmp_path):
    """``attn-export --quantize int8 > log 2>&1``: a CI log gets no ``\\r`` redraws, and the last
    lines name every file written, so nobody has to open report.json to find the model."""
    log_path = tmp_path / "log"
    with log_path.open("wb") as log:
        proc = subprocess.run([sys.executable, "-m", "attn_export.cli", "--quantize", "int8", "--repeats", "2", "--warmup", "0", "--out", "out"],
                              cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, timeout=900)  # fmt: skip
    text = log_path.read_bytes().decode()
    assert proc.returncode == 0, text[-3000:]
    assert "\r" not in text
    lines = text.rstrip().splitlines()
    listed = [ln.strip() for ln in lines[lines.index("wrote:") + 1 :]]
    assert listed and all((tmp_path / p).exists() for p in listed), listed
    names = {os.path.basename(p) for p in listed}
    assert {"model.onnx", "model.int8.onnx", "report.json", "report.md", "report.html", "latency.png"} <= names, names
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert {os.path.basename(s["artifact"]) for s in report["stages"] if s["artifact"]} <= names
    assert any(ln.startswith("int8 selection: ") for ln in lines)
    # the answer first, and a passing run says FAIL nowhere (issue 23: "attention maps (artifact): FAIL" under a PASS)
    assert lines[0].startswith("PASS | ships model.int8.onnx (int8-"), lines[0]
    md, page = (tmp_path / "out" / "report.md").read_text(), (tmp_path / "out" / "report.html").read_text()
    assert md.splitlines()[0].startswith("**PASS** · ships model.int8.onnx") and '<body><p id="verdict" class="verdict PASS-box">' in page
    for where, content in (("console", text), ("report.md", md), ("report.html", page[page.index("<body>") :])):  # the CSS names a FAIL class
        assert "FAIL" not in content, f"{where} of a passing run says FAIL: {content[content.find('FAIL') - 200 : content.find('FAIL') + 100]}"
    assert "attention maps, eager fp32 vs model.int8.onnx" in md.replace("\\", "")
