"""A BERT cross-encoder (ms-marco-MiniLM style: ``BertForSequenceClassification``, one label) reads a query/candidate pair
as ``[CLS] A [SEP] B [SEP]`` with token type 0 on A and 1 on B: the exported encoder takes ``token_type_ids`` as a third
input, padded and packed, and every artifact is judged against transformers' own forward on the typed pairs.

Built on a tiny random-init model saved by transformers, with a word-level BERT-style ``tokenizer.json`` whose pair template
types B as 1. Its token-type embedding is scaled up (x3), so a path that drops the types (all type 0) misses the bar by far;
scaled further, the type vector drowns the words of B and every candidate looks alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from hf_models import build, save

from attn_export.config.run import RunConfig
from attn_export.export import ExportSpec
from attn_export.runtime.ort import OrtRunner, SessionFromOnnx

RUN = dict(max_len=32, seq_len=16, batch=2, threads=1, max_texts=24)
MIN_COSINE, MAX_ABS = 0.9999, 1e-4  # the house bar against transformers, fp32
TYPE_SCALE = 3.0  # the token-type embedding, scaled up: types that are dropped show far beyond the bar


def _bert_pair_tokenizer(folder: Path, vocab: int = 100) -> None:
    """A word-level tokenizer.json of ``w4``..``w99`` with BERT's pair template ``[CLS] A [SEP] B:1 [SEP]:1``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{f"w{i}": i for i in range(4, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])  # fmt: skip
    tok.save(str(folder / "tokenizer.json"))


def _pairs_file(path: Path, queries: int = 14, candidates: int = 4) -> Path:
    g = np.random.default_rng(0)
    words = lambda n: " ".join(f"w{i}" for i in g.integers(4, 100, size=n))  # noqa: E731
    lines = [f"{q}\t{words(int(g.integers(3, 9)))}" for q in (words(3) for _ in range(queries)) for _ in range(candidates)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def model() -> Any:
    hf = build("bert-rerank", num_hidden_layers=1)  # one layer: each export costs ~6 s of CPU at two
    with torch.no_grad():
        hf.bert.embeddings.token_type_embeddings.weight.mul_(TYPE_SCALE)
    return hf


@pytest.fixture(scope="module")
def subject(model: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from attn_export.subjects.encoder import EncoderSubject

    t = tmp_path_factory.mktemp("cross")
    folder = save(model, t / "ckpt")
    _bert_pair_tokenizer(folder)
    return EncoderSubject(RunConfig(checkpoint=str(folder), calib=_pairs_file(t / "pairs.txt"), quantize="int8", out=t / "out", **RUN))


@pytest.fixture(scope="module")
def exported(subject: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The fp32 encoder, padded and packed (decomposed attention), over the subject's own weights."""
    t = tmp_path_factory.mktemp("onnx")
    out = {}
    for form in ("padded", "packed"):
        out[form] = t / f"{form}.onnx"
        subject.export(subject.module, out[form], ExportSpec(encoder_form=form))
    return out


def _transformers_logits(model: Any, feeds: list[dict[str, np.ndarray]], types: bool = True) -> np.ndarray:
    """transformers' own forward on the feeds (with their token types, or without: all type 0) -> (N, 1)."""
    with torch.no_grad():
        return np.concatenate([model(**{k: torch.from_numpy(v) for k, v in f.items() if types or k != "token_type_ids"}).logits.numpy()
                               for f in feeds])  # fmt: skip


def _logits(runner: Any, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    return np.concatenate([runner.infer(f)["logits"] for f in feeds])


def _bar(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """(cosine of the logit column over all pairs, max abs): one label per pair, so the column is the vector users rank."""
    a, b = ref.ravel().astype(np.float64), got.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))), float(np.abs(a - b).max())


def test_typed_pairs_make_token_type_ids_a_third_input(subject: Any) -> None:
    report = subject.tokens["report"]
    assert subject.input_names == ["input_ids", "attention_mask", "token_type_ids"] and subject.data.token_types
    row, real = report.token_type_ids[0], report.attention_mask[0] == 1
    first_sep = int(np.flatnonzero(report.input_ids[0] == 3)[0])  # [CLS] A [SEP]: type 0; B [SEP]: type 1; pads 0
    assert (row[: first_sep + 1] == 0).all() and (row[first_sep + 1 :][real[first_sep + 1 :]] == 1).all() and (row[~real] == 0).all()
    feed = report.feeds(4, trim=True)[0]
    assert list(feed) == subject.input_names and feed["token_type_ids"].shape == feed["input_ids"].shape
    corpus = subject.data.extra[0].tokens  # the shipped corpus's single texts: the same three inputs, all type 0
    assert corpus.token_type_ids is not None and not corpus.token_type_ids.any()
    assert any("token_type_ids" in note for note in subject.notes())


@pytest.mark.parametrize("form", ["padded", "packed"])
def test_the_fp32_onnx_matches_transformers_on_typed_pairs(subject: Any, model: Any, exported: dict[str, Path], form: str) -> None:
    """The logits (one per pair) and every real token's hidden state, against transformers' forward with the token types."""
    graph = onnx.load(str(exported[form]))
    assert [(i.name, i.type.tensor_type.elem_type) for i in graph.graph.input] == [(n, onnx.TensorProto.INT64) for n in subject.input_names]
    feeds = subject.tokens["report"].feeds(8, trim=True) + subject.tokens["select"].feeds(8, trim=True)
    runner = OrtRunner(SessionFromOnnx(str(exported[form])))
    outs = [runner.infer(f) for f in feeds]
    cosine, max_abs = _bar(_transformers_logits(model, feeds), np.concatenate([o["logits"] for o in outs]))
    assert cosine >= MIN_COSINE and max_abs <= MAX_ABS, f"{form} logits: cosine {cosine:.6f}, max abs {max_abs:.2e}"
    for f, o in zip(feeds, outs):
        with torch.no_grad():
            ref = model(**{k: torch.from_numpy(v) for k, v in f.items()}, output_hidden_states=True).hidden_states[-1].numpy()
        real = f["attention_mask"] == 1
        a, b = ref[real].astype(np.float64), o["last_hidden_state"][real].astype(np.float64)
        rows = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        assert rows.min() >= MIN_COSINE and np.abs(a - b).max() <= MAX_ABS, f"{form} hidden: min cosine {rows.min():.6f}, max abs {np.abs(a - b).max():.2e}"
    judged = subject.judge(runner, "report", "fp32")
    rank = judged.details["logits"]["rank"]
    assert judged.passed and rank["pair_order_agreement"] == 1.0 and rank["top1_agreement"] == 1.0 and rank["num_queries"] >= 2


def test_dropping_the_token_types_misses_the_bar_by_far(subject: Any, model: Any, exported: dict[str, Path]) -> None:
    """All type 0 (the two-input interface on typed pairs): the packed graph's type-1 rows of ``last_hidden_state`` and its
    logits, the eager encoder's and transformers' own move far beyond the bar, so the test above fails if a path dropped them."""
    feeds = subject.tokens["report"].feeds(8, trim=True)
    ref = _transformers_logits(model, feeds)
    runner = OrtRunner(SessionFromOnnx(str(exported["packed"])))
    zeroed = [{**f, "token_type_ids": np.zeros_like(f["token_type_ids"])} for f in feeds]
    typed = [runner.infer(f) for f in feeds]
    dropped = [runner.infer(f) for f in zeroed]
    type1 = [f["token_type_ids"] == 1 for f in feeds]
    rows = max(float(np.abs(a["last_hidden_state"][t] - b["last_hidden_state"][t]).max()) for a, b, t in zip(typed, dropped, type1))
    assert rows > 1000 * MAX_ABS, rows  # each type-1 token's own embedding moves
    packed = _bar(ref, np.concatenate([d["logits"] for d in dropped]))[1]
    with torch.no_grad():
        eager = _bar(ref, np.concatenate([subject.encoder(torch.from_numpy(f["input_ids"]), torch.from_numpy(f["attention_mask"]))[2].numpy()
                                          for f in feeds]))[1]  # fmt: skip
    untyped = _bar(ref, _transformers_logits(model, feeds, types=False))[1]
    assert min(packed, eager, untyped) > 10 * MAX_ABS, (packed, eager, untyped)  # and, through attention, the [CLS] logit


def test_an_int8_artifact_runs_on_typed_pairs_and_reports_rank_agreement(subject: Any, exported: dict[str, Path], tmp_path: Path) -> None:
    """Static int8: ONNX Runtime calibrates on the train split's three-input feeds (``subject.calibration``)."""
    from attn_export.compress.quant.static import quantize_static_onnx

    calib = subject.calibration()
    assert all(list(f) == subject.input_names for f in calib)
    result = quantize_static_onnx(exported["padded"], tmp_path / "int8.onnx", calib)
    assert result.n_quantize_linear > 0 and [i.name for i in onnx.load(str(tmp_path / "int8.onnx")).graph.input] == subject.input_names
    judged = subject.judge(OrtRunner(SessionFromOnnx(str(tmp_path / "int8.onnx"))), "report", "int8")
    logits = judged.details["logits"]
    assert logits["rank"]["num_queries"] >= 2 and set(logits["rank"]) == {"pair_order_agreement", "top1_agreement", "num_queries"}
    assert MAX_ABS < logits["max_abs"] < 0.1  # int8's error, measured 0.019 on logits of ~0.7


def test_a_tensorrt_profile_gives_token_type_ids_the_input_ids_shapes(exported: dict[str, Path], tmp_path: Path, monkeypatch: Any) -> None:
    """Every (batch, seq) input gets the same profile (``targets.shape_profile``), on the strict TensorRT doubles."""
    from trt_fakes import install, manifest_versions

    from attn_export.runtime.tensorrt.build import build_engine
    from attn_export.runtime.tensorrt.sidecar import read_sidecar
    from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile

    trt = install(monkeypatch, manifest_versions()[-1])
    spec = EngineSpec(precision="fp32", profiles=ShapeProfile((1, 4), (2, 16), (8, 32)))
    result = build_engine(str(exported["padded"]), tmp_path / "m.engine", spec)
    profile = trt._world.called("add_optimization_profile")[0]
    assert list(profile) == ["input_ids", "attention_mask", "token_type_ids"]
    assert profile["token_type_ids"] == profile["input_ids"] == [[1, 4], [2, 16], [8, 32]]
    assert read_sidecar(result.engine_path).input_names == list(profile)


def test_the_triton_config_declares_token_type_ids(exported: dict[str, Path], tmp_path: Path) -> None:
    from attn_export.deploy.triton_repo import write_triton_repo

    repo = write_triton_repo(tmp_path / "triton", "reranker", exported["packed"])
    config = (repo / "reranker" / "config.pbtxt").read_text()
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        assert f'name: "{name}"\n  data_type: TYPE_INT64\n  dims: -1' in config, config


def test_fidelity_probes_the_type_1_embedding(subject: Any) -> None:
    """At load, a model with a type-1 embedding is probed on typed rows too: a type-1 row that is type 0's (types ignored) passes
    every untyped probe and is refused on the typed one."""
    import copy

    from attn_export.checkpoint.fidelity import check_fidelity

    assert subject.fidelity.passed and subject.fidelity.probes["random 4x16 typed 0/1"] == 4
    swapped = copy.deepcopy(subject.encoder)
    with torch.no_grad():
        swapped.embeddings.token_type_embeddings.weight[1] = swapped.embeddings.token_type_embeddings.weight[0]
    result = check_fidelity(swapped, subject.path, reference=subject.reference, tokenizer=subject.tokenizer, raise_on_failure=False)
    assert not result.passed and result.outputs["last_hidden_state"].worst_probe == "random 4x16 typed 0/1"


@pytest.mark.slow
def test_a_cross_encoder_int8_run_end_to_end_takes_token_types(model: Any, tmp_path: Path) -> None:
    """The CLI on typed pairs: every stage exported with three inputs, judged with rank agreement; the deployed model too."""
    import json

    from attn_export.cli import main

    folder = save(model, tmp_path / "ckpt")
    _bert_pair_tokenizer(folder)
    run = ["--max-len", "32", "--seq-len", "16", "--batch", "2", "--max-texts", "24", "--repeats", "1", "--warmup", "0", "--threads", "1",
           "--int8-mode", "static", "--quiet"]  # fmt: skip
    calib = _pairs_file(tmp_path / "pairs.txt")
    assert main(["--checkpoint", str(folder), "--calib", str(calib), "--quantize", "int8", "--out", str(tmp_path / "out"), *run]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    assert stages["int8-static"]["details"]["logits"]["rank"]["num_queries"] >= 2
    assert any("token_type_ids" in note for note in report["notes"]), report["notes"]
    for onnx_path in (tmp_path / "out").rglob("*.onnx"):
        assert [i.name for i in onnx.load(str(onnx_path), load_external_data=False).graph.input][:3] == ["input_ids", "attention_mask", "token_type_ids"]

