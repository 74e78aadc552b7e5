"""Round four (issue 28): sentence-transformers settings (c23), texts judged as held out or meaningful when they are not
(c25), and misleading --calib counts (c29).

The model is a tiny random-init BERT saved by ``SentenceTransformer.save`` (``fixtures.st_checkpoint``) with
prompts ``query``/``passage``, a default prompt and ``max_seq_length 8``; its tokenizer is uncased (BERT's
normalizer lower-cases and drops control characters), which is what makes case variants one text.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from fixtures import ST_WORDS, st_checkpoint
from rel_helpers import assert_refused, run_cli

from attn_export.checkpoint.corpus import split_user_texts
from attn_export.config.run import RunConfig
from attn_export.subjects.text_data import TextData, read_text_file

PROMPTS = {"query": "query: ", "passage": "passage: "}
RUN = ["--max-len", "32", "--repeats", "1", "--warmup", "0", "--batch", "2", "--seq-len", "16", "--threads", "1", "--quantize", "int8"]
SLOW_REFUSAL_S = 300.0  # refusals that need the tokenizer come after the model is loaded; nothing is written either way


@pytest.fixture(scope="module")
def st_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return st_checkpoint(tmp_path_factory.mktemp("st") / "model", prompts=PROMPTS, default_prompt_name="query", max_seq_length=8)


def _copy(model: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model, tmp_path / "model"))


def _texts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct sentences of the fixture's words (4 to 9 words each)."""
    rng = np.random.default_rng(seed)
    out: list[str] = []
    while len(out) < n:
        text = " ".join(rng.choice(ST_WORDS, size=int(rng.integers(4, 10))))
        if text not in out:
            out.append(text)
    return out


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _data(model: Path, calib: Path, tmp_path: Path) -> TextData:
    from attn_export.checkpoint.text import load_tokenizer

    cfg = RunConfig(checkpoint=str(model), calib=calib, quantize="int8", out=tmp_path / "out", max_len=32, seq_len=16, batch=2, threads=1)
    return TextData.build(cfg, load_tokenizer(model), 64)


def _rows(tokens) -> set[tuple[int, ...]]:  # type: ignore[no-untyped-def]
    return {tuple(int(i) for i, m in zip(ids, mask) if m) for ids, mask in zip(tokens.input_ids, tokens.attention_mask)}


# --- c23: sentence-transformers settings --------------------------------------------------------------------------------
def test_c23_a_prompt_the_model_does_not_have_is_refused_naming_its_prompts(st_model: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    o = run_cli(["--checkpoint", st_model, "--prompt", "qeury", "--out", tmp_path / "out", *RUN], capsys, tmp_path)
    assert_refused(o, "expected --prompt to name one of the model's prompts (document, passage, query)", max_seconds=60)


def test_c23_a_prompt_on_a_checkpoint_without_sentence_transformers_files_is_refused(st_model: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    plain = st_model.parent / f"{st_model.name}-hf"  # the transformers folder the fixture wrapped
    o = run_cli(["--checkpoint", plain, "--prompt", "query", "--out", tmp_path / "out", *RUN], capsys, tmp_path)
    assert_refused(o, "has no sentence-transformers files (modules.json); drop --prompt", max_seconds=60)


def test_c23_a_look_alike_module_type_is_refused_by_name_and_never_imported(st_model: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    model = _copy(st_model, tmp_path)
    modules = json.loads((model / "modules.json").read_text())
    modules[1]["type"] = "sentence_transformers.evil.Pooling"
    (model / "modules.json").write_text(json.dumps(modules))
    o = run_cli(["--checkpoint", model, "--out", tmp_path / "out", *RUN], capsys, tmp_path)
    assert_refused(o, "module 'sentence_transformers.evil.Pooling' is not supported", max_seconds=60)
    assert "sentence_transformers.evil" not in sys.modules


def test_c23_a_pipeline_without_pooling_is_refused_as_sentence_transformers_cannot_encode_it(st_model: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    model = _copy(st_model, tmp_path)
    modules = json.loads((model / "modules.json").read_text())
    (model / "modules.json").write_text(json.dumps([modules[0], modules[2]]))  # Transformer -> Normalize
    o = run_cli(["--checkpoint", model, "--out", tmp_path / "out", *RUN], capsys, tmp_path)
    assert_refused(o, "expected a Pooling module after the Transformer, got Transformer -> Normalize", max_seconds=60)


def test_c23_a_pooling_that_leaves_the_prompt_out_is_refused_with_a_prompt(st_model: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    model = _copy(st_model, tmp_path)
    pooling = json.loads((model / "1_Pooling" / "config.json").read_text())
    (model / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "include_prompt": False}))
    o = run_cli(["--checkpoint", model, "--out", tmp_path / "out", *RUN], capsys, tmp_path)
    assert_refused(o, "include_prompt false", max_seconds=60)


def test_c23_max_seq_length_in_sentence_bert_config_is_applied(tmp_path: Path) -> None:
    """The sentence-transformers < 6 layout: ``{"max_seq_length": 8}`` in sentence_bert_config.json (issue 28: cosine 0.952)."""
    from attn_export.checkpoint.metrics import row_cosines
    from attn_export.subjects.encoder import EncoderSubject

    st = pytest.importorskip("sentence_transformers", reason="the peer is SentenceTransformer.encode")
    model = st_checkpoint(tmp_path / "model")
    (model / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 8, "do_lower_case": False}))
    calib = _write(tmp_path / "texts.txt", _texts(12, seed=3) + ["the red cat sat on the blue mat and the big dog sat in the red"])
    cfg = RunConfig(checkpoint=str(model), calib=calib, quantize="int8", out=tmp_path / "out", max_len=32, seq_len=16, batch=2, threads=1)
    subject = EncoderSubject(cfg)
    assert subject.inputs_info()["max_len"] == 8
    pipeline = st.SentenceTransformer(str(model), device="cpu", local_files_only=True)
    assert pipeline.max_seq_length == 8
    for role in ("train", "report"):
        expected = pipeline.encode(subject.tokens[role].texts, convert_to_numpy=True)
        assert row_cosines(expected, subject.reference_embeddings(role)).min() >= 0.9999


def test_c23_do_lower_case_in_sentence_bert_config_is_applied(tmp_path: Path) -> None:
    """A cased tokenizer under ``do_lower_case: true``: sentence-transformers lower-cases every text before tokenizing it."""
    from attn_export.checkpoint.metrics import row_cosines
    from attn_export.subjects.encoder import EncoderSubject

    st = pytest.importorskip("sentence_transformers", reason="the peer is SentenceTransformer.encode")
    model = st_checkpoint(tmp_path / "model", lowercase=False)
    (model / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32, "do_lower_case": True}))
    calib = _write(tmp_path / "texts.txt", [t.upper() for t in _texts(12, seed=4)])
    cfg = RunConfig(checkpoint=str(model), calib=calib, quantize="int8", out=tmp_path / "out", max_len=32, seq_len=16, batch=2, threads=1)
    subject = EncoderSubject(cfg)
    pipeline = st.SentenceTransformer(str(model), device="cpu", local_files_only=True)
    for role in ("train", "report"):
        expected = pipeline.encode(subject.tokens[role].texts, convert_to_numpy=True)
        assert row_cosines(expected, subject.reference_embeddings(role)).min() >= 0.9999
    assert any("do_lower_case" in n for n in subject.notes())


# --- c25: texts judged as held out or meaningful when they are not ---------------------------------------------------------
def test_c25_case_and_whitespace_variants_are_one_text_never_held_out_against_each_other(st_model: Path, tmp_path: Path) -> None:
    base = _texts(12)
    variants = [t.upper() for t in base] + [t.replace(" ", "   ") for t in base] + [f" {t.title()}\t" for t in base]
    data = _data(st_model, _write(tmp_path / "texts.txt", base + variants), tmp_path)
    train = _rows(data.tokens["train"])
    assert not (_rows(data.tokens["report"]) & train) and not (_rows(data.tokens["select"]) & train)
    assert sum(len(t) for t in data.tokens.values()) == len(base)
    assert "36 dropped as repeats of another text once tokenized" in data.split_note


def test_c25_too_few_distinct_texts_once_tokenized_is_refused_saying_how_many(st_model: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    base = _texts(5)
    calib = _write(tmp_path / "texts.txt", base + [t.upper() for t in base])  # 10 lines, 5 texts to the model
    o = run_cli(["--checkpoint", st_model, "--calib", calib, "--out", tmp_path / "out", *RUN], capsys, tmp_path)
    assert_refused(o, "5 distinct once tokenized (5 repeat another text as the tokenizer sees it", max_seconds=SLOW_REFUSAL_S)


def test_c25_texts_with_no_real_token_are_dropped_and_the_report_says_so(st_model: Path, tmp_path: Path) -> None:
    empty = ["\u200b\u200b\u200b", "\u200d", "\x07\x07", "\u2603\u2603 \u2603"]  # zero-width, control, unknown to the vocabulary
    data = _data(st_model, _write(tmp_path / "texts.txt", _texts(12) + empty), tmp_path)
    assert sum(len(t) for t in data.tokens.values()) == 12
    assert "4 dropped with no real token" in data.split_note
    for tokens in data.tokens.values():
        real = (tokens.attention_mask == 1) & ~np.isin(tokens.input_ids, [1, 2, 3])  # [UNK] [CLS] [SEP]
        assert (real.sum(axis=1) > 2).all()  # more than the prompt's "query :"


def test_c25_mostly_meaningless_texts_are_refused(st_model: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    empty = [f"\u200b{chr(0x2600 + i)}" for i in range(10)]  # ten distinct lines, each only unknown characters
    calib = _write(tmp_path / "texts.txt", _texts(8) + empty)
    o = run_cli(["--checkpoint", st_model, "--calib", calib, "--out", tmp_path / "out", *RUN], capsys, tmp_path)
    assert_refused(o, "10 of 18 texts have no real token", max_seconds=SLOW_REFUSAL_S)


def test_c25_max_len_below_a_useful_floor_is_refused(st_model: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    o = run_cli(["--checkpoint", st_model, "--out", tmp_path / "out", *RUN, "--max-len", "2"], capsys, tmp_path)
    assert_refused(o, "expected --max-len >= 8, got 2")


# --- c29: the documented minimum of --calib texts, and what a line is ------------------------------------------------------
@pytest.mark.parametrize(("n", "sizes"), [(8, (4, 2, 2)), (9, (5, 2, 2))], ids=["c29-8-texts", "c29-9-texts"])
def test_c29_the_documented_minimum_of_texts_leaves_two_to_compare_in_each_held_out_split(n: int, sizes: tuple[int, int, int]) -> None:
    train, select, report = split_user_texts(_texts(n))
    assert (len(train), len(select), len(report)) == sizes
    assert len(set(train) | set(select) | set(report)) == n


def test_c29_eight_texts_run_end_to_end(st_model: Path, tmp_path: Path) -> None:
    data = _data(st_model, _write(tmp_path / "texts.txt", _texts(8)), tmp_path)
    assert {role: len(t) for role, t in data.tokens.items()} == {"train": 4, "select": 2, "report": 2}


def test_c29_fewer_distinct_texts_than_the_minimum_are_refused_before_the_model_is_built(st_model: Path, tmp_path: Path, capsys,
                                                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from attn_export.subjects import encoder

    def built(*_a: object, **_k: object) -> None:
        raise AssertionError("the model was built before the text count was checked")

    monkeypatch.setattr(encoder.EncoderSubject, "__init__", built)
    texts = _texts(7)
    calib = _write(tmp_path / "texts.txt", [*texts, texts[0]])  # 8 lines, 7 texts
    o = run_cli(["--checkpoint", st_model, "--calib", calib, "--out", tmp_path / "out", *RUN], capsys, tmp_path)
    assert_refused(o, "holds 8 texts (7 distinct); pass at least 8 distinct texts, one per line")


def test_c29_a_line_holding_u2028_is_one_text(tmp_path: Path) -> None:
    lines = [f"{t}\u2028{t}" if i % 2 else t for i, t in enumerate(_texts(8))]  # four lines with a LINE SEPARATOR inside
    assert read_text_file(_write(tmp_path / "texts.txt", lines)) == lines
