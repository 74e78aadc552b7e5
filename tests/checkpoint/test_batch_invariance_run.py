"""Issue 40: whatever ships for a checkpoint gives a text the same answer alone and in any batch, the report and the
gate say so, and a route whose answer moves with its batch mates (dynamic int8) is judged but never shipped.

A tiny random-init sentence-transformers model (2 layers, hidden 32) keeps it to seconds; the figure's own
arithmetic is tested in tests/validate/test_batch_invariance.py, MiniLM's in docs/quantization.md."""

from __future__ import annotations

import copy
import json

import pytest
from fixtures import st_checkpoint

from attn_export.config.run import RunConfig
from attn_export.pipeline.runner import run
from attn_export.validate.batch_invariance import INVARIANCE_BAR
from attn_export.validate.gate.check import _invariance_checks


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The tiny model with real models' trait: FFN2 inputs (GELU outputs) whose range differs from text to text, so one
    activation range per batch (dynamic int8) depends on the batch mates (MiniLM's layer 0 FFN2, docs/quantization.md)."""
    from safetensors.torch import load_file, save_file

    folder = st_checkpoint(tmp_path_factory.mktemp("inv") / "st")
    weights = load_file(folder / "model.safetensors")
    for layer in (0, 1):
        weights[f"encoder.layer.{layer}.intermediate.dense.weight"] *= 400.0
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def _run(folder, out, mode):
    cfg = RunConfig(checkpoint=str(folder), quantize="int8", int8_mode=mode, out=out, repeats=1, warmup=0, batch=4, seq_len=16,
                    threads=1, render=False, max_texts=48, encoder_form="packed")  # fmt: skip
    run(cfg)
    return json.loads((out / "report.json").read_text())


def test_the_shipped_int8_is_batch_invariant_and_the_gate_checks_it(folder, tmp_path):
    report = _run(folder, tmp_path / "auto", "auto")
    entry = report["selection"]["int8"]
    assert entry["route"] in ("per-token", "static"), entry["reason"]
    stage = next(s for s in report["stages"] if s["name"] == entry["stage"])
    figure = stage["details"]["batch_invariance"]
    assert figure["passed"] and figure["min_cosine"] >= INVARIANCE_BAR and figure["texts"] > 1, figure
    assert {(b["batch"], b["order"]) for b in figure["batchings"]} == {(8, "file order"), (8, "shuffled"), (32, "file order"), (32, "shuffled")}
    assert stage["details"]["select_split"]["batch_invariance"]["passed"]  # what the selection read
    checks = [c for c in _invariance_checks(report) if c.stage == entry["stage"]]
    assert checks and all(c.ok for c in checks)
    moved = copy.deepcopy(report)  # the same report with the shipped model's answer moving with its batch mates
    next(s for s in moved["stages"] if s["name"] == entry["stage"])["details"]["batch_invariance"].update(min_cosine=0.9968, passed=False)
    failing = [c for c in _invariance_checks(moved) if c.stage == entry["stage"]]
    assert failing and not any(c.ok for c in failing) and "batch mates" in failing[0].message


def test_a_route_whose_answer_moves_with_its_batch_mates_is_never_shipped(folder, tmp_path):
    report = _run(folder, tmp_path / "dynamic", "dynamic")
    stages = {s["name"]: s for s in report["stages"]}
    dyn = [s for n, s in stages.items() if n.startswith("int8-dynamic")]
    assert dyn and all(not s["details"]["select_split"]["batch_invariance"]["passed"] for s in dyn), [
        s["details"]["select_split"]["batch_invariance"]["min_cosine"] for s in dyn]
    assert report["selection"]["int8"]["route"] is None and "batch invariance" in report["selection"]["int8"]["reason"]
    assert report["verdict"]["passed"] is False
