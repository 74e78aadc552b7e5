"""Every valid ``--mask`` x ``--attention`` combination writes its full report (issue 20, class 17).

The ``long-seq`` form runs a window mask as a Loop over query blocks with its Softmax inside
the Loop body; the attention-map graph used to expose that Softmax as a graph output, which
ONNX Runtime refuses ("Graph output ... does not exist"), and the run lost its whole output at
rendering. Each case is a whole run through ``attn_export.pipeline.runner.run`` with ``render=True``
(the CLI's code path), at d_model 16. The failing combinations (long-seq with a window at
L = 16 and 600) run in the default suite; every layer x mask x form, and ``--attention auto``
at L = 8192, are ``slow`` (about 8 s a run here, 64 runs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attn_export.config.run import RunConfig
from attn_export.pipeline.runner import run
from attn_export.vocab.choices import ATTENTION_FORMS, LAYER_MASKS

REPORT_FILES = {"model.onnx", "report.json", "report.md", "report.html", "latency.png", "run.json"}


def _run_and_check(tmp_path: Path, layer: str, mask: str, attention: str, seq_len: int) -> str:
    cfg = RunConfig(layer=layer, mask=mask, attention=attention, d_model=16, heads=2, seq_len=seq_len, batch=1, repeats=1, warmup=0,
                    threads=1, validation_batches=1, out=tmp_path / "out")  # fmt: skip
    result = run(cfg)
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert REPORT_FILES <= files, sorted(files)
    md = (tmp_path / "out" / "report.md").read_text()
    if layer == "linear":  # no softmax probabilities: the report says so instead of drawing maps
        assert "no attention maps" in md
    else:
        assert "attention_maps.png" in files and "attention maps, eager fp32 vs" in md and "PASS" in md, md[-600:]
    assert all(s.passed for s in result.report.stages if s.passed is not None), [(s.name, s.passed) for s in result.report.stages]
    return md


@pytest.mark.parametrize("seq_len", [16, 600], ids=["c17-long-seq-window-at-16", "c17-long-seq-window-at-600"])
def test_long_seq_with_a_window_mask_writes_its_full_report(seq_len: int, tmp_path: Path) -> None:
    md = _run_and_check(tmp_path, "transformer", "window", "long-seq", seq_len)
    assert "a decomposed fp32 re-export of the layer (model.onnx fuses its attention, so its probabilities cannot be read)" in md


COMBINATIONS = [(layer, mask, form) for layer, masks in LAYER_MASKS.items() for mask in masks for form in ATTENTION_FORMS]


@pytest.mark.slow
@pytest.mark.parametrize(("layer", "mask", "form"), COMBINATIONS, ids=[f"c17-{lay}-{m}-{f}" for lay, m, f in COMBINATIONS])
def test_every_layer_mask_and_attention_form_writes_its_full_report(layer: str, mask: str, form: str, tmp_path: Path) -> None:
    _run_and_check(tmp_path, layer, mask, form, 16)


@pytest.mark.slow
def test_c17_attention_auto_at_8192_with_a_window_writes_its_full_report(tmp_path: Path) -> None:
    md = _run_and_check(tmp_path, "transformer", "window", "auto", 8192)
    assert "long-seq" in md
