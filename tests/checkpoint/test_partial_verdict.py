"""Issue 33 through the CLI: a planted int8 route that passes the report split and fails long texts filling --seq-len.

The plant is a route that behaves well on short texts and badly on long ones: ONNX Runtime's outputs of the int8
artifacts are bent whenever a batch holds a text longer than --max-len (only the long texts judged beside the report
split do). When every int8 route is bent, the run ships the fastest anyway and says PARTIAL, exit 3, naming the data;
``--accept-partial`` ships it with exit 0 and report.json records it. When only the per-token route is bent, the
selection falls back to the static route, which passes every judged data set: a PASS.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fixtures import wordpiece_tokenizer
from hf_models import build, save

from attn_export.runtime.ort import OrtRunner

MAX_LEN, SEQ_LEN = 16, 32  # --seq-len beyond every judged text: long texts filling 32 tokens are judged beside the report split
RUN = ["--quantize", "int8", "--encoder-form", "padded", "--max-len", str(MAX_LEN), "--seq-len", str(SEQ_LEN),
       "--batch", "2", "--max-texts", "8", "--repeats", "1", "--warmup", "0", "--threads", "1"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-init BERT saved by transformers (the same model every run: the reference is its own library's)."""
    folder = tmp_path_factory.mktemp("tiny-bert")
    return save(build("bert", vocab_size=wordpiece_tokenizer(folder)), folder)


def _plant(monkeypatch: pytest.MonkeyPatch, bent: tuple[str, ...]) -> list[str]:
    """Bend the sentence embeddings of the artifacts whose file name ends with one of ``bent`` on batches holding a long text."""
    real = OrtRunner._infer
    hits: list[str] = []

    def planted(self: OrtRunner, feed: dict) -> dict:
        out = real(self, feed)
        path = str(getattr(self._loader, "path", ""))
        if path.endswith(bent) and int(np.asarray(feed["attention_mask"]).sum(axis=1).max()) > MAX_LEN:
            emb = out["sentence_embedding"]
            out["sentence_embedding"] = emb + 0.8 * np.linalg.norm(emb, axis=-1, keepdims=True) * np.roll(emb, 1, axis=-1) / (
                np.linalg.norm(emb, axis=-1, keepdims=True) + 1e-12)  # fmt: skip
            hits.append(Path(path).name)
        return out

    monkeypatch.setattr(OrtRunner, "_infer", planted)
    return hits


def _main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from attn_export.cli import main

    code = main(args)
    return code, capsys.readouterr().out


def test_a_route_failing_long_texts_is_partial_with_exit_3(tiny_bert, tmp_path, monkeypatch, capsys):
    hits = _plant(monkeypatch, ("model.int8-per-token.onnx", "model.int8-static.onnx"))
    code, out = _main(["--checkpoint", str(tiny_bert), *RUN, "--out", str(tmp_path)], capsys)
    assert hits, "the plant never saw a long text"
    first = out.splitlines()[0]
    assert code == 3, out[-2000:]
    assert first.startswith("PARTIAL | model.int8.onnx (int8-"), first
    assert f"fails on long texts filling {SEQ_LEN} tokens: mean cosine" in first and "ships model.int8.onnx" in first
    assert "no route passes every judged data set" in first and "speed-up" in first and "size " in first
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verdict"]["state"] == "PARTIAL" and report["verdict"]["passed"] is False and "accept_partial" not in report["verdict"]
    shipped = report["selection"]["int8"]["stage"]
    sets = next(s for s in report["stages"] if s["name"] == shipped)["details"]["judged_sets"]
    assert [(s["role"], s["passed"]) for s in sets] == [("report split", True), ("beside", False)], sets
    assert (tmp_path / "report.md").read_text().splitlines()[0].startswith("**PARTIAL** · model.int8.onnx (int8-")


@pytest.mark.slow
def test_accept_partial_ships_it_with_exit_0_and_the_report_records_it(tiny_bert, tmp_path, monkeypatch, capsys):
    _plant(monkeypatch, ("model.int8-per-token.onnx", "model.int8-static.onnx"))
    code, out = _main(["--checkpoint", str(tiny_bert), *RUN, "--out", str(tmp_path), "--accept-partial"], capsys)
    assert code == 0, out[-2000:]
    assert out.splitlines()[0].startswith("PARTIAL | ") and "(shipped anyway: --accept-partial)" in out.splitlines()[0]
    verdict = json.loads((tmp_path / "report.json").read_text())["verdict"]
    assert verdict["accept_partial"] is True and verdict["passed"] is True and verdict["state"] == "PARTIAL"


@pytest.mark.slow
def test_the_selection_falls_back_to_a_route_passing_every_judged_data_set(tiny_bert, tmp_path, monkeypatch, capsys):
    hits = _plant(monkeypatch, ("model.int8-per-token.onnx",))
    code, out = _main(["--checkpoint", str(tiny_bert), *RUN, "--out", str(tmp_path)], capsys)
    assert hits
    first = out.splitlines()[0]
    assert code == 0 and first.startswith("PASS | ships model.int8.onnx (int8-static"), first
    assert "among the routes passing every judged data set (int8-per-token fails on long texts" in first, first
