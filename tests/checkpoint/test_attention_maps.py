"""A checkpoint report's attention maps (issue 33): one layer's heads, the user's model (transformers, eager) against
the exported ONNX file, on one real text; a fused attention form has no probabilities to read, so the run's padded
stage stands in and says so, and with none the report is one line naming why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import SMALL_RUN, saved_with_wordpiece

from attn_export.checkpoint.attention_maps import checkpoint_attention_section, one_text
from attn_export.config.run import RunConfig

RUN = SMALL_RUN


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_with_wordpiece("bert", tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def exported(bert: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    """(the subject, its padded decomposed export, its packed export: com.microsoft.MultiHeadAttention per layer)."""
    from attn_export.checkpoint.export import export_encoder
    from attn_export.export import ExportSpec
    from attn_export.subjects.encoder import EncoderSubject

    out = tmp_path_factory.mktemp("maps")
    subject = EncoderSubject(RunConfig(checkpoint=str(bert), out=out / "run", **RUN))
    export_encoder(subject.encoder, out / "model.padded.onnx", ExportSpec(attention="decomposed"))
    export_encoder(
        subject.encoder, out / "model.packed.onnx", ExportSpec(attention="ort-contrib", encoder_form="packed")
    )
    return subject, out / "model.padded.onnx", out / "model.packed.onnx"


def _report(*stages: tuple[str, Path]) -> dict:
    """The last ONNX stage ships (``validate.headline.shipped`` without a selection)."""
    return {
        "model": {"checkpoint": "tiny"},
        "stages": [{"name": n, "artifact": str(p), "precision": "fp32", "details": {}} for n, p in stages],
    }


def test_the_shipped_file_s_maps_match_the_user_s_model_on_one_real_text(exported):
    subject, padded, _ = exported
    inputs = subject.map_inputs()
    assert inputs.layer == 1 and inputs.text and 8 <= inputs.tokens["input_ids"].shape[1] <= 32
    sec = checkpoint_attention_section(subject.reference, inputs, _report(("onnx-fp32", padded)), padded.parent)
    assert sec.note == "" and sec.eager_maps.shape == sec.onnx_maps.shape == (
        1,
        4,
        *inputs.tokens["input_ids"].shape[1:] * 2,
    )
    assert np.abs(sec.eager_maps - sec.onnx_maps).max() < 1e-5, (
        "the exported layer-1 probabilities are not the reference's"
    )
    ids, mask = inputs.tokens["input_ids"], inputs.tokens["attention_mask"]
    assert np.array_equal(sec.eager_maps, subject.reference.attentions(ids, mask)[1])  # transformers' own layer 1
    assert not np.allclose(sec.onnx_maps, subject.reference.attentions(ids, mask)[0], atol=1e-3), (
        "layer 0 would pass as well"
    )
    text = sec.summary.replace("\\", "")
    assert (
        "the user's model (transformers, eager) vs model.padded.onnx (onnx-fp32, the shipped artifact), layer 1, on '"
        in text
    ), text
    assert sec.label == "onnx-fp32 (layer 1)"


def test_a_fused_shipped_file_gets_the_padded_stage_standing_in_and_says_why(exported):
    subject, padded, packed = exported
    report = _report(("onnx-fp32", padded), ("onnx-fp32-packed", packed))
    sec = checkpoint_attention_section(subject.reference, subject.map_inputs(), report, padded.parent)
    assert sec.eager_maps is not None and np.abs(sec.eager_maps - sec.onnx_maps).max() < 1e-5
    assert ("model.padded.onnx (onnx-fp32), standing in for the shipped model.packed.onnx (model.packed.onnx computes attention in "
            "com.microsoft.MultiHeadAttention, which does not output its probabilities)") in sec.summary, sec.summary  # fmt: skip


def test_with_no_file_exposing_probabilities_the_report_says_why_in_one_line(exported):
    subject, _, packed = exported
    sec = checkpoint_attention_section(
        subject.reference, subject.map_inputs(), _report(("onnx-fp32-packed", packed)), packed.parent
    )
    assert sec.eager_maps is None and "\n" not in sec.note
    assert sec.note == ("no attention maps: model.packed.onnx computes attention in com.microsoft.MultiHeadAttention, which does not output "
                        "its probabilities; a --encoder-form padded --attention decomposed export has one Softmax per layer to read them from")  # fmt: skip


def test_one_text_takes_a_readable_real_text():
    ids = np.arange(3 * 40).reshape(3, 40)
    mask = np.zeros((3, 40), np.int64)
    mask[0, :4], mask[1, :12], mask[2, :40] = 1, 1, 1
    feed, text = one_text(["a", "b", "c"], ids, mask, None)
    assert text == "b" and feed["input_ids"].shape == (1, 12) and set(feed) == {"input_ids", "attention_mask"}
    mask[1, :] = 0
    mask[1, :2] = 1
    feed, text = one_text(["a", "b", "c"], ids, mask, None)
    assert text == "a" and feed["input_ids"].shape == (1, 4)  # nothing of 8..32 tokens: the first text


@pytest.mark.slow  # a whole run (~25 s); the default suite's tagger run (test_head_judge) checks its maps
def test_a_checkpoint_run_s_report_has_attention_maps_or_says_why(bert: Path, tmp_path: Path):
    """The acceptance of issue 33 through the CLI: ``--encoder-form auto`` ships the packed (fused) form, so the padded stage stands in."""
    from attn_export.cli import main

    run = [
        "--max-len",
        "32",
        "--seq-len",
        "16",
        "--batch",
        "2",
        "--max-texts",
        "16",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--quiet",
    ]
    assert main(["--checkpoint", str(bert), "--out", str(tmp_path / "out"), *run]) == 0
    md = (tmp_path / "out" / "report.md").read_text().replace("\\", "")
    assert "## Attention maps per head: eager vs exported" in md
    assert (
        "(attention_maps.png)" in md and "attention maps, the user's model (transformers, eager) vs " in md
    ) or "no attention maps: " in md, md
    assert (tmp_path / "out" / "attention_maps.png").is_file() == ("no attention maps" not in md)


def test_layer_n_of_a_checkpoint_draws_its_own_heads_from_the_hidden_states_entering_it(bert: Path, tmp_path: Path):
    """``--layers N``: the exported file is layer N alone (inputs x, key_padding_mask); its one Softmax is layer N's."""
    from attn_export.export import ExportSpec
    from attn_export.subjects.encoder_layer import EncoderLayerSubject

    subject = EncoderLayerSubject(RunConfig(checkpoint=str(bert), layers="1", out=tmp_path / "run", **RUN))
    subject.export(subject.module, tmp_path / "model.onnx", ExportSpec(attention="decomposed"))
    inputs = subject.map_inputs()
    assert (inputs.layer, inputs.softmax_index, inputs.softmax_count) == (1, 0, 1) and set(inputs.onnx_feed) == {
        "x",
        "key_padding_mask",
    }
    sec = checkpoint_attention_section(
        subject.reference, inputs, _report(("onnx-fp32", tmp_path / "model.onnx")), tmp_path
    )
    assert sec.note == "" and np.abs(sec.eager_maps - sec.onnx_maps).max() < 1e-5, sec.note
