"""Issue 19 end to end: the user's model is the judge, the user's texts are the data, a wrong re-implementation never passes.

The runs here go through the CLI or ``runner.run`` as a user's would: a checkpoint folder
saved by transformers (a tiny random RoBERTa with a word-level tokenizer), and MiniLM with a
user's text file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_models import build, save

from attn_export.cli import main
from attn_export.config.run import RunConfig
from attn_export.pipeline.runner import run

# one export (--encoder-form padded): these runs are about the judge and the pooling, not the forms (test_encoder_forms.py)
TINY_RUN = ["--max-len", "32", "--repeats", "1", "--warmup", "0", "--batch", "2", "--seq-len", "16", "--max-texts", "16", "--threads", "1",
            "--encoder-form", "padded"]


def _tokenizer(folder: Path, vocab: int = 100, pad: int = 1) -> None:
    """A word-level tokenizer.json within the tiny model's vocabulary (ids 0..vocab-1), RoBERTa's special ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = {"<s>": 0, "<pad>": pad, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tok.save(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def tiny_roberta(tmp_path_factory) -> Path:
    folder = save(build("roberta"), tmp_path_factory.mktemp("roberta"))
    _tokenizer(folder)
    return folder


def test_a_roberta_checkpoint_passes_against_transformers_and_says_so(tiny_roberta, tmp_path):
    assert main(["--checkpoint", str(tiny_roberta), "--out", str(tmp_path / "out"), "--quiet", *TINY_RUN]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    model = report["model"]
    assert model["family"] == "roberta" and model["reference"].startswith("transformers RobertaModel")
    assert model["fidelity"]["passed"] and model["fidelity"]["outputs"]["last_hidden_state"]["min_cosine"] >= 0.9999
    assert model["pooling"]["source"] == "default mean"


def test_a_broken_reimplementation_is_refused_with_exit_2_and_one_line(tiny_roberta, tmp_path, capsys, monkeypatch):
    """Put issue 19's RoBERTa bug back (positions without the padding_idx + 1 offset): the run must refuse, never PASS."""
    from attn_export.layers.encoder import BertEmbeddings

    monkeypatch.setattr(BertEmbeddings, "position_ids", lambda self, input_ids: torch.arange(input_ids.shape[1]))  # BERT's arange(S)
    assert main(["--checkpoint", str(tiny_roberta), "--out", str(tmp_path / "out"), *TINY_RUN]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not reproduce transformers RobertaModel" in err and "min cosine" in err, err
    assert not (tmp_path / "out").exists()


def test_pooling_flag_overrides_the_model_and_the_report_names_its_source(tiny_roberta, tmp_path):
    assert main(["--checkpoint", str(tiny_roberta), "--pooling", "cls", "--out", str(tmp_path / "out"), "--quiet", *TINY_RUN]) == 0
    pooling = json.loads((tmp_path / "out" / "report.json").read_text())["model"]["pooling"]
    assert pooling["modes"] == ["cls"] and pooling["source"] == "--pooling"
    assert main(["--pooling", "cls", "--out", str(tmp_path / "x")]) == 2  # a layer has no pooling


@pytest.fixture(scope="module")
def orders_file(tmp_path_factory) -> Path:
    """A user's narrow-domain texts: 100 templated order notices, unlike the shipped five-language corpus."""
    import random

    rng = random.Random(0)
    items = ["laptop", "printer", "monitor", "keyboard", "router", "camera", "headset", "tablet", "charger", "speaker"]
    cities = ["Lyon", "Osaka", "Denver", "Lagos", "Perth", "Quito", "Turin", "Hanoi"]
    texts = [f"Order {1000 + i} for a {rng.choice(items)} was shipped to {rng.choice(cities)} on day {rng.randint(1, 28)} and arrives in "
             f"{rng.randint(2, 9)} days." for i in range(100)]  # fmt: skip
    path = tmp_path_factory.mktemp("user") / "user.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path


def test_user_texts_are_the_reference_data_and_the_corpus_is_judged_beside(orders_file, tmp_path):
    """--calib user.txt: the report names user.txt's report split and its size, the shipped corpus figure beside it, and
    where a route passes on one but fails on the other, which route failed on which data and the likely cause."""
    # no fallback: it would keep GEMMs in float until the corpus passes too (tests/compress/test_dynamic_fallback.py), and
    # this test is about a route that passes on one data set and fails on the other
    cfg = RunConfig(checkpoint="minilm", quantize="int8", int8_mode="dynamic", int8_fallback="none", calib=orders_file, out=tmp_path / "out",
                    repeats=1, warmup=0, batch=2, seq_len=32, threads=2, render=False, encoder_form="padded", max_texts=64)  # fmt: skip
    report = run(cfg).report
    inputs = report.inputs
    assert "user.txt" in inputs["accuracy_data"] and inputs["split_sizes"] == {"train": 60, "select": 20, "report": 20}
    assert "100 texts split 60/20/20" in inputs["split"] and "shipped corpus test split" in inputs["also_judged_on"]
    stage = report.stage("int8-dynamic")
    assert stage.details["judged_on"].endswith("user.txt") and stage.details["embedding"]["num_texts"] == 20
    beside = stage.details["also_judged_on"]["shipped corpus test split"]
    assert beside["embedding"]["num_texts"] == 64  # --max-texts 64 of the shipped test split (user.txt's 100 texts are all used)
    # SmoothQuant searched on order notices, judged on a multilingual corpus: measured 0.9987 on user.txt against 0.9858 there (< 0.99)
    assert stage.passed and not beside["passed"], (stage.details["embedding"], stage.details["violations"], beside)
    note = next(n for n in report.notes if n.startswith("int8-dynamic passes on"))
    assert "user.txt" in note and "fails on shipped corpus test split" in note and "likely cause: SmoothQuant scales searched" in note
    assert "user.txt" in report.selection["int8"]["decided_on"]
