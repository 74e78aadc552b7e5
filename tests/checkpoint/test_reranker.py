"""A reranker (a cross-encoder: sequence classification over a query/candidate pair) is judged on what its users read:
the order of each query's candidates. ``--calib`` lines ``query<TAB>candidate`` are encoded as pairs and split by query.

Built on a tiny random-init ``XLMRobertaForSequenceClassification`` with one label (as bge-reranker ships), saved by
transformers, with a RoBERTa-style pair template (``<s> A </s></s> B </s>``, every token type 0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import Altered, build, save

from attn_export.checkpoint.metrics import rank_agreement
from attn_export.config.run import RunConfig
from attn_export.errors import DataError
from attn_export.subjects.text_data import pair_lines, split_by_query

RUN = dict(max_len=32, seq_len=16, batch=2, threads=1, max_texts=24)


def _pair_tokenizer(folder: Path, vocab: int = 100, types: tuple[int, int] = (0, 0)) -> None:
    """A word-level tokenizer.json of ``w4``..``w99`` with RoBERTa's special ids and pair template (``types``: A's and B's type)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    a, b = types
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair=f"<s>:{a} $A:{a} </s>:{a} </s>:{b} $B:{b} </s>:{b}",
                                                       special_tokens=[("<s>", 0), ("</s>", 2)])  # fmt: skip
    tok.save(str(folder / "tokenizer.json"))


def _pairs_file(path: Path, queries: int = 14, candidates: int = 4) -> Path:
    g = np.random.default_rng(0)
    words = lambda n: " ".join(f"w{i}" for i in g.integers(4, 100, size=n))  # noqa: E731
    lines = [f"{q}\t{words(6)}" for q in (words(3) for _ in range(queries)) for _ in range(candidates)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = save(build("xlm-roberta-rerank"), tmp_path_factory.mktemp("reranker"))
    _pair_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def subject(reranker: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from attn_export.subjects.encoder import EncoderSubject

    t = tmp_path_factory.mktemp("run")
    return EncoderSubject(RunConfig(checkpoint=str(reranker), calib=_pairs_file(t / "pairs.txt"), quantize="int8", out=t / "out", **RUN))


def Scaled(subject: Any, factor: float) -> Altered:
    """The eager encoder with its logits multiplied by ``factor``: order kept (> 0) or reversed (< 0)."""
    return Altered(subject, lambda _feed, out: out.update(logits=out["logits"] * np.float32(factor)))


def test_rank_agreement_counts_candidate_pairs_within_each_query() -> None:
    ref = np.array([[3.0], [2.0], [1.0], [5.0], [4.0], [9.0]])
    got = np.array([[3.0], [1.0], [2.0], [5.0], [4.0], [0.0]])  # query a: one of 3 pairs swapped; b kept; c alone
    figures = rank_agreement(ref, got, ["a", "a", "a", "b", "b", "c"])
    assert figures == {"pair_order_agreement": pytest.approx(3 / 4), "top1_agreement": 1.0, "num_queries": 2.0}
    two_labels = np.array([[0.0, 2.0], [0.0, 1.0]])  # two labels: ranked by the last label's log-probability
    assert rank_agreement(two_labels, two_labels[::-1], ["q", "q"])["top1_agreement"] == 0.0


def test_pairs_are_split_by_query_and_mixed_lines_are_refused() -> None:
    pairs = [f"q{i}\tc{j}" for i in range(10) for j in range(3)]
    roles = split_by_query(pairs)
    queries = [{p.split("\t")[0] for p in role} for role in roles]
    assert sum(len(r) for r in roles) == 30 and not (queries[0] & queries[1] or queries[0] & queries[2] or queries[1] & queries[2])
    assert pair_lines(pairs, "f") and not pair_lines(["a b", "c d"], "f")
    with pytest.raises(DataError, match=r"--calib f: 1 of 2 lines are text pairs .*write every line as query<TAB>candidate"):
        pair_lines(["q\tc", "single"], "f")


def test_a_reranker_is_judged_on_the_order_of_each_querys_candidates(subject: Any) -> None:
    assert subject.data.pairs and "query/candidate pairs split by query" in subject.data.split_note
    ids = subject.tokens["report"].input_ids[0]
    assert (ids == 2).sum() >= 3  # <s> A </s></s> B </s>: encoded as a pair
    kept = subject.judge(Scaled(subject, 1.001), "report", "int8")
    rank = kept.details["logits"]["rank"]
    assert kept.passed and rank["pair_order_agreement"] == 1.0 and rank["top1_agreement"] == 1.0 and rank["num_queries"] >= 2
    reversed_ = subject.judge(Scaled(subject, -1.0), "report", "int8")
    assert reversed_.details["logits"]["rank"]["pair_order_agreement"] < 0.1 and not reversed_.passed


def test_pairs_typed_0_1_for_a_model_without_a_type_1_embedding_exit_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """XLM-R has one token type (type_vocab_size 1): a tokenizer that types B as 1 asks for a row the model lacks; refused
    before any work (a BERT cross-encoder, type_vocab_size 2, takes token_type_ids: tests/checkpoint/test_cross_encoder_pairs.py)."""
    from attn_export.cli import main

    folder = save(build("xlm-roberta-rerank"), tmp_path / "typed")
    _pair_tokenizer(folder, types=(0, 1))
    capsys.readouterr()  # transformers' own save bar, not the CLI's
    code = main(["--checkpoint", str(folder), "--calib", str(_pairs_file(tmp_path / "pairs.txt")), "--quantize", "int8", "--out", str(tmp_path / "out"),
                 "--max-len", "32", "--seq-len", "16", "--max-texts", "24", "--quiet"])  # fmt: skip
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1, err
    assert "encodes with token types 0/1, but the model has no type-1 embedding (type_vocab_size 1)" in err[0]


def test_a_reranker_int8_run_end_to_end_reports_rank_agreement(reranker: Path, tmp_path: Path) -> None:
    from attn_export.cli import main

    run = ["--max-len", "32", "--seq-len", "16", "--batch", "2", "--max-texts", "24", "--repeats", "1", "--warmup", "0", "--threads", "1",
           "--encoder-form", "padded", "--int8-mode", "per-token", "--quiet"]  # fmt: skip
    calib = _pairs_file(tmp_path / "pairs.txt")
    assert main(["--checkpoint", str(reranker), "--calib", str(calib), "--quantize", "int8", "--out", str(tmp_path / "out"), *run]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    stage = next(s for s in report["stages"] if s["name"] == "int8-per-token")
    assert stage["details"]["logits"]["rank"]["num_queries"] >= 2 and "embedding" not in stage["details"]
    assert "queries" in (tmp_path / "out" / "report.md").read_text()
