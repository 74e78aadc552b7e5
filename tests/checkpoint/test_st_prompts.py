"""Issue 28, class 23: the text a sentence-transformers model encodes is the prompt + the text, cut to its max_seq_length.

A tiny random-init BERT saved by ``SentenceTransformer.save`` with ``prompts``
``{"query": "query: ", "passage": "passage: "}``, ``default_prompt_name "query"`` and
``max_seq_length 8``: the exported encoder, fed the data the pipeline judges it on, must
give ``SentenceTransformer.encode(texts)`` (default prompt, truncation included), and so
must the pipeline's reference on that data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fixtures import st_checkpoint

from attn_export.checkpoint.metrics import row_cosines
from attn_export.config.run import RunConfig

PROMPTS = {"query": "query: ", "passage": "passage: "}
TEXTS = [  # words of the fixture's vocabulary; half are longer than max_seq_length 8 once prompted
    "the cat sat on the mat", "a dog was in the big red mat and the cat sat on a blue dog of the mat", "query is a passage",
    "the big blue cat", "red and blue and big", "a cat sat", "the dog was big",
    "on the mat is a dog and a cat and a red big blue query", "passage of the dog",
    "the red cat sat on the blue mat and the big dog sat in the red", "is the cat big", "to the mat and to the dog",
]  # fmt: skip


@pytest.fixture(scope="module")
def st_model(tmp_path_factory) -> Path:
    return st_checkpoint(tmp_path_factory.mktemp("st") / "model", prompts=PROMPTS, default_prompt_name="query", max_seq_length=8)


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("texts") / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


def _subject(model: Path, calib: Path, tmp: Path, prompt: str | None = None):  # type: ignore[no-untyped-def]
    from attn_export.subjects.encoder import EncoderSubject

    chosen = {} if prompt is None else {"prompt": prompt}
    cfg = RunConfig(checkpoint=str(model), calib=calib, quantize="int8", out=tmp / "out", max_len=32, seq_len=16, batch=2, threads=1, **chosen)
    return EncoderSubject(cfg)


def _encode(model: Path, texts: list[str], **kwargs) -> np.ndarray:  # type: ignore[no-untyped-def]
    st = pytest.importorskip("sentence_transformers", reason="the peer is SentenceTransformer.encode: pip install sentence-transformers")
    return st.SentenceTransformer(str(model), device="cpu", local_files_only=True).encode(texts, convert_to_numpy=True, **kwargs)


@pytest.mark.parametrize(("prompt", "encode_kwargs"), [(None, {}), ("passage", {"prompt_name": "passage"}), ("", {"prompt": ""})],
                         ids=["c23-default-prompt", "c23-named-prompt", "c23-no-prompt"])  # fmt: skip
def test_c23_the_export_matches_sentence_transformers_encode_with_its_prompt_and_max_seq_length(st_model, texts_file, tmp_path, prompt,
                                                                                              encode_kwargs):  # fmt: skip
    ort = pytest.importorskip("onnxruntime", reason="the exported graph runs on pip install onnxruntime")
    from attn_export.checkpoint.export import export_encoder

    subject = _subject(st_model, texts_file, tmp_path, prompt)
    used = PROMPTS.get("query" if prompt is None else prompt, "")
    export_encoder(subject.encoder, tmp_path / "m.onnx")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    lengths = []
    for role in ("train", "select", "report"):
        tokens = subject.tokens[role]
        texts = [t.removeprefix(used) for t in tokens.texts]
        assert sorted(texts) == sorted(t for t in TEXTS if t in texts)  # the user's texts, prompt taken off
        expected = _encode(st_model, texts, **encode_kwargs)
        exported = session.run(["sentence_embedding"], tokens.feed())[0]
        reference = subject.reference_embeddings(role)
        assert row_cosines(expected, exported).min() >= 0.9999, (role, row_cosines(expected, exported))
        assert row_cosines(expected, reference).min() >= 0.9999, (role, row_cosines(expected, reference))
        lengths += tokens.attention_mask.sum(axis=1).tolist()
    assert max(lengths) == 8 and min(lengths) < 8  # some texts cut at max_seq_length, some shorter
    assert subject.inputs_info()["max_len"] == 8 and subject.inputs_info()["prompt"]["text"] == used
    assert any("lowered to 8" in n for n in subject.notes())
