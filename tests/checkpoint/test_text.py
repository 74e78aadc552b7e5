"""The shipped multilingual corpus, its deterministic split, tokenization and real layer activations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attn_export.checkpoint.metrics import embedding_agreement, top1_neighbors
from attn_export.checkpoint.text import (
    CORPUS_DIR,
    LANGUAGES,
    TextCorpus,
    all_layer_inputs,
    load_text_corpus,
    read_corpus_groups,
    text_calibration,
    tokenize,
)
from attn_export.errors import ConfigError, DataError
from attn_export.layers.registry import MaskedLayer


def test_corpus_is_multilingual_disjoint_and_deterministic():
    corpus = load_text_corpus()
    assert {"en", "zh"} <= set(corpus.languages) == set(LANGUAGES)
    assert not set(corpus.calib) & set(corpus.val)
    assert len(corpus.val) >= 50 and len(corpus.calib) >= 3 * len(corpus.val) - 20
    assert any("\u4e00" <= ch <= "\u9fff" for text in corpus.val for ch in text), "validation must include Chinese"
    again = load_text_corpus()
    assert again.calib == corpus.calib and again.val == corpus.val


def test_split_rule_is_every_fourth_topic_group():
    groups = read_corpus_groups(CORPUS_DIR / "corpus_en.txt")
    corpus = load_text_corpus(["en"])
    assert corpus.val == [s for g, group in enumerate(groups) if g % 4 == 3 for s in group]
    assert corpus.calib == [s for g, group in enumerate(groups) if g % 4 != 3 for s in group]


def test_corpus_files_parse(tmp_path):
    (tmp_path / "corpus_xx.txt").write_text("# comment\n\na\nb\n\n\nc\n\nd\n\ne\nf\n", encoding="utf-8")
    assert read_corpus_groups(tmp_path / "corpus_xx.txt") == [["a", "b"], ["c"], ["d"], ["e", "f"]]
    corpus = load_text_corpus(["xx"], directory=tmp_path)
    assert corpus.val == ["e", "f"] and corpus.calib == ["a", "b", "c", "d"]
    (tmp_path / "corpus_yy.txt").write_text("a\n\nb\n\nc\n\na\n", encoding="utf-8")
    with pytest.raises(DataError, match="both splits"):
        load_text_corpus(["yy"], directory=tmp_path)
    (tmp_path / "corpus_zz.txt").write_text("# only comments\n", encoding="utf-8")
    with pytest.raises(DataError, match="no sentences"):
        load_text_corpus(["zz"], directory=tmp_path)
    with pytest.raises(ConfigError, match="languages"):
        load_text_corpus(["klingon"])


def test_tokenize(minilm_tokenizer):
    texts = ["A short one.", "今天天气很好。", "word " * 100]
    batch = tokenize(minilm_tokenizer, texts, max_len=32)
    assert batch.input_ids.dtype == np.int64 and batch.attention_mask.dtype == np.int64
    assert batch.input_ids.shape == (3, 32)  # the long text is truncated to max_len and sets the width
    lengths = batch.attention_mask.sum(1)
    assert lengths[2] == 32 and lengths[0] < 10
    assert batch.input_ids[2, 31] == minilm_tokenizer.token_to_id("[SEP]"), "truncation keeps [SEP]"
    assert batch.input_ids[0, 0] == minilm_tokenizer.token_to_id("[CLS]")
    assert (batch.input_ids[batch.attention_mask == 0] == 0).all(), "padding uses [PAD] = 0"
    zh = batch.input_ids[1, 1 : lengths[1] - 1]
    assert len(zh) == 7, "Chinese is split per character (BERT's handle_chinese_chars)"
    assert (zh != minilm_tokenizer.token_to_id("[UNK]")).any(), "MiniLM's English vocabulary still knows some characters"
    fixed = tokenize(minilm_tokenizer, texts[:2], max_len=32, pad_to=16)
    assert fixed.input_ids.shape == (2, 16)
    with pytest.raises(ConfigError):
        tokenize(minilm_tokenizer, texts, max_len=8, pad_to=16)


def test_uniform_feeds_wrap_the_last_batch(minilm_tokenizer):
    batch = tokenize(minilm_tokenizer, [f"text number {i}" for i in range(10)], max_len=16)
    feeds = batch.feeds(4, uniform=True)
    assert [f["input_ids"].shape[0] for f in feeds] == [4, 4, 4]
    assert np.array_equal(feeds[2]["input_ids"][2:], batch.input_ids[:2])
    assert [f["input_ids"].shape[0] for f in batch.feeds(4)] == [4, 4, 2]


def test_layer_activations_are_the_real_inputs(minilm, minilm_tokenizer):
    corpus = load_text_corpus()
    tokens = tokenize(minilm_tokenizer, corpus.val[:12], max_len=32)
    acts = all_layer_inputs(minilm, tokens, batch_size=5)
    ids, mask = tokens.to_torch()
    with torch.no_grad():
        assert torch.equal(torch.from_numpy(acts[0].x), minilm.embeddings(ids))
        layer2 = MaskedLayer(minilm.layers[2], "padding")
        y = layer2(torch.from_numpy(acts[2].x), torch.from_numpy(acts[2].key_padding_mask))
    np.testing.assert_allclose(y.numpy(), acts[3].x, atol=1e-5)
    assert acts[3].key_padding_mask.dtype == np.int32 and np.array_equal(acts[3].key_padding_mask, tokens.attention_mask)


def test_text_calibration(minilm, minilm_tokenizer):
    full = load_text_corpus()
    corpus = TextCorpus(full.calib[:40], full.val[:16], full.languages, "subset")
    data = text_calibration(minilm, minilm_tokenizer, layer_index=4, max_len=24, corpus=corpus)
    assert len(data.calib) == 40 and len(data.val) == 16
    assert data.calib.x.shape[1] <= 24 and data.calib.x.shape[2] == 384 and data.calib.x.dtype == np.float32
    assert np.isfinite(data.calib.x).all() and "layer4" in data.source
    with pytest.raises(ConfigError):
        text_calibration(minilm, minilm_tokenizer, layer_index=6)
    with pytest.raises(ConfigError):
        text_calibration(minilm, minilm_tokenizer, layer_index=0, max_len=1000)


def test_embedding_agreement():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((20, 8))
    same = embedding_agreement(ref, ref * 3.0)
    assert same["mean_cosine"] == pytest.approx(1.0) and same["top1_neighbor_agreement"] == 1.0
    noisy = embedding_agreement(ref, ref + 0.05 * rng.standard_normal(ref.shape))
    assert 0.99 < noisy["mean_cosine"] < 1.0 and noisy["min_cosine"] <= noisy["mean_cosine"]
    # a pair of near-duplicates: swapping one of them to the other side breaks two neighbourhoods
    pts = np.array([[1.0, 0.0], [0.99, 0.1], [0.0, 1.0], [0.1, 0.99], [-1.0, 0.0]])
    assert top1_neighbors(pts).tolist() == [1, 0, 3, 2, 2]
    moved = pts.copy()
    moved[1] = [0.05, 1.0]
    assert embedding_agreement(pts, moved)["top1_neighbor_agreement"] < 1.0
    nan = embedding_agreement(ref, np.full_like(ref, np.nan))
    assert np.isnan(nan["mean_cosine"]) and nan["top1_neighbor_agreement"] == 0.0
    with pytest.raises(DataError):
        embedding_agreement(ref, ref[:, :4])
