"""The shipped multilingual corpus, its three deterministic splits, tokenization and real layer activations."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from attn_export.checkpoint.corpus import (
    CORPUS_DIR,
    GROUP_SIZE,
    LANGUAGES,
    REGISTERS,
    SPLITS,
    TextCorpus,
    load_text_corpus,
    normalize_sentence,
    read_topic_groups,
    split_of_group,
    split_user_texts,
)
from attn_export.checkpoint.metrics import embedding_agreement, wilson_interval
from attn_export.checkpoint.text import all_layer_inputs, text_calibration, text_token_splits, tokenize
from attn_export.errors import ConfigError, DataError
from attn_export.layers.registry import MaskedLayer


@pytest.fixture(scope="module")
def corpus() -> TextCorpus:
    return load_text_corpus()


def _origin(corpus: TextCorpus) -> dict[str, tuple[str, str]]:
    """sentence -> (language, register) of the group it comes from."""
    return {s: (g.language, g.register) for g in corpus.groups for s in g.sentences}


def test_corpus_size_languages_and_registers(corpus):
    total = sum(len(corpus.split(s)) for s in SPLITS)
    assert total >= 2000 and total == GROUP_SIZE * len(corpus.groups)
    assert len(corpus.languages) >= 4 and set(corpus.languages) == set(LANGUAGES) >= {"en", "zh", "de", "es", "fr"}
    assert {g.register for g in corpus.groups} == set(REGISTERS), "every shipped group sits under a '# register:' line"
    origin = _origin(corpus)
    for name in SPLITS:
        seen = {origin[s] for s in corpus.split(name)}
        assert {lang for lang, _ in seen} == set(LANGUAGES), f"{name} misses a language"
        assert {reg for _, reg in seen} == set(REGISTERS), f"{name} misses a register"
        for lang in LANGUAGES:  # every cell (language, register) is in every split
            assert {reg for lg, reg in seen if lg == lang} == set(REGISTERS), f"{name}/{lang} misses a register"
    assert len(corpus.val) >= 400 and len(corpus.test) >= 400 and len(corpus.calib) >= 2.5 * len(corpus.test)
    assert any("\u4e00" <= ch <= "\u9fff" for text in corpus.test for ch in text), "the test split must include Chinese"
    words = [len(s.split()) for g in corpus.groups if g.language != "zh" for s in g.sentences]
    assert min(words) >= 5 and max(words) <= 40 and sum(w >= 25 for w in words) >= 20, "varied lengths, 5 to 40 words"


def test_splits_are_disjoint_exactly_and_after_normalisation(corpus):
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1 :]:
            assert not set(corpus.split(a)) & set(corpus.split(b)), (a, b)
            na = {normalize_sentence(s) for s in corpus.split(a)}
            assert not na & {normalize_sentence(s) for s in corpus.split(b)}, (a, b)
    everything = [normalize_sentence(s) for name in SPLITS for s in corpus.split(name)]
    assert len(set(everything)) == len(everything), "no sentence twice, even inside one split"
    assert normalize_sentence("  The  Soup\u3000IS hot ") == normalize_sentence("the soup is HOT")


def test_split_rule_is_by_whole_topic_group(corpus):
    assert [split_of_group(g) for g in range(10)] == ["calib", "calib", "calib", "val", "test"] * 2
    for lang in LANGUAGES:
        groups = read_topic_groups(CORPUS_DIR / f"corpus_{lang}.txt")
        assert [g.index for g in groups] == list(range(len(groups)))
        one = load_text_corpus([lang])
        for name in SPLITS:
            want = [s for g in groups if g.split == name for s in g.sentences]
            assert sorted(one.split(name)) == sorted(want), (lang, name)
    # inside a split the sentences of a group stay together, so pairs (0, 1), (2, 3) are paraphrases
    for name in SPLITS:
        texts, partners = corpus.split(name), corpus.partners(name)
        group_of = {s: id(g) for g in corpus.groups for s in g.sentences}
        assert all(group_of[texts[i]] == group_of[texts[j]] for i, j in enumerate(partners))


def test_splits_are_stable(corpus, tmp_path):
    again = load_text_corpus()
    assert all(again.split(s) == corpus.split(s) for s in SPLITS)
    for lang in LANGUAGES:  # a fresh copy (not the parse cache) gives the same order
        shutil.copy(CORPUS_DIR / f"corpus_{lang}.txt", tmp_path / f"corpus_{lang}.txt")
    copy = load_text_corpus(directory=tmp_path)
    assert all(copy.split(s) == corpus.split(s) for s in SPLITS)
    assert corpus.test[:2] == list(corpus.groups[[g.split for g in corpus.groups].index("test")].sentences[:2])


def test_max_per_split_keeps_a_balanced_prefix(corpus):
    cells = len(LANGUAGES) * len(REGISTERS)
    small = load_text_corpus(max_per_split=GROUP_SIZE * cells)
    origin = _origin(corpus)
    for name in SPLITS:
        assert small.split(name) == corpus.split(name)[: GROUP_SIZE * cells]
        assert len({origin[s] for s in small.split(name)}) == cells, f"the first {cells} groups of {name} cover every cell"
    odd = load_text_corpus(["en"], max_per_split=5)
    assert [len(odd.split(s)) for s in SPLITS] == [5, 5, 5] and odd.partners("test")[-1] == -1
    for bad in (0, -4, True, 2.5, "8"):
        with pytest.raises(ConfigError, match="max_per_split"):
            load_text_corpus(max_per_split=bad)


def _write(tmp_path, name, text):
    path = tmp_path / f"corpus_{name}.txt"
    path.write_text(text, encoding="utf-8")
    return path


def _groups(n, prefix="s", register=None):
    head = f"# register: {register}\n" if register else ""
    return head + "\n\n".join("\n".join(f"{prefix} {g} {k}." for k in range(GROUP_SIZE)) for g in range(n)) + "\n"


def test_corpus_files_parse(tmp_path):
    _write(tmp_path, "xx", "# comment\n# register: chat\n\na 0\na 1\na 2\na 3\n\n\n" + _groups(4, "b", "news"))
    groups = read_topic_groups(tmp_path / "corpus_xx.txt")
    assert [(g.register, g.index, g.line) for g in groups[:2]] == [("chat", 0, 4), ("news", 1, 11)]
    assert list(read_topic_groups(tmp_path / "corpus_xx.txt")[0].sentences) == ["a 0", "a 1", "a 2", "a 3"]
    corpus = load_text_corpus(["xx"], directory=tmp_path)
    assert corpus.val == ["b 2 0.", "b 2 1.", "b 2 2.", "b 2 3."] and corpus.test == [f"b 3 {k}." for k in range(4)]
    b = [[f"b {g} {k}." for k in range(GROUP_SIZE)] for g in range(4)]
    assert corpus.calib == b[0] + ["a 0", "a 1", "a 2", "a 3"] + b[1], "round-robin: known registers first, then by name"
    _write(tmp_path, "yy", _groups(5, "c"))  # no register line: "unmarked", and a second language interleaves
    both = load_text_corpus(["xx", "yy"], directory=tmp_path)
    assert both.calib[:GROUP_SIZE] == corpus.calib[:GROUP_SIZE] and {g.register for g in both.groups} == {"chat", "news", "unmarked"}
    with pytest.raises(ConfigError, match="languages"):
        load_text_corpus(["klingon"])
    with pytest.raises(ConfigError, match="once"):
        load_text_corpus(["en", "en"])


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("a\nb\nc\n\n" + _groups(5), r"corpus_bad.txt:1: expected a topic group of 4 sentences .* got 3"),
        (_groups(5) + "\n# register: Tech Talk\n", r"corpus_bad.txt:\d+: expected '# register: <name>'"),
        ("# only comments\n", "no sentences"),
        (_groups(4), "three splits"),
        (_groups(3) + "\n" + "\n".join(["S 0 0.", "x", "y", "z"]) + "\n\n" + _groups(1, "t"), r"in two splits \(calib and val\)"),
        (_groups(5) + "\n" + "\n".join(["s  1 0.", "x", "y", "z"]) + "\n", "twice in the calib split"),
    ],
    ids=["group-of-3", "bad-register", "comments-only", "too-few-groups", "dup-across-splits", "dup-inside-split"],
)
def test_malformed_corpus_is_one_line_data_error(tmp_path, text, match):
    _write(tmp_path, "bad", text)
    with pytest.raises(DataError, match=match) as info:
        load_text_corpus(["bad"], directory=tmp_path)
    assert "\n" not in str(info.value)


def test_unreadable_corpus_is_one_line_data_error(tmp_path):
    (tmp_path / "corpus_bin.txt").write_bytes(b"caf\xe9\n" * 4)
    for lang, match in (("bin", "not UTF-8"), ("missing", "does not exist")):
        with pytest.raises(DataError, match=match) as info:
            load_text_corpus([lang], directory=tmp_path)
        assert "\n" not in str(info.value)


def test_token_splits_have_three_capped_batches(minilm_tokenizer, corpus):
    splits = text_token_splits(minilm_tokenizer, max_len=32, max_per_split=12)
    assert [len(splits.calib), len(splits.val), len(splits.test)] == [12, 12, 12]
    assert splits.test.texts == corpus.test[:12] and splits.test.seq_len <= 32
    subset = TextCorpus(corpus.calib[:8], corpus.val[:4], corpus.languages, "subset")
    no_test = text_token_splits(minilm_tokenizer, max_len=32, corpus=subset)
    assert no_test.test is None and len(no_test.calib) == 8


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


def test_layer_activations_are_the_real_inputs(minilm, minilm_tokenizer, corpus):
    tokens = tokenize(minilm_tokenizer, corpus.val[:12], max_len=32)
    acts = all_layer_inputs(minilm, tokens, batch_size=5)
    ids, mask = tokens.to_torch()
    with torch.no_grad():
        assert torch.equal(torch.from_numpy(acts[0].x), minilm.embeddings(ids))
        layer2 = MaskedLayer(minilm.layers[2], "padding")
        y = layer2(torch.from_numpy(acts[2].x), torch.from_numpy(acts[2].key_padding_mask))
    np.testing.assert_allclose(y.numpy(), acts[3].x, atol=1e-5)
    assert acts[3].key_padding_mask.dtype == np.int32 and np.array_equal(acts[3].key_padding_mask, tokens.attention_mask)


def test_text_calibration(minilm, minilm_tokenizer, corpus):
    subset = TextCorpus(corpus.calib[:40], corpus.val[:16], corpus.languages, "subset", corpus.test[:16])
    data = text_calibration(minilm, minilm_tokenizer, layer_index=4, max_len=24, corpus=subset)
    assert len(data.calib) == 40 and len(data.val) == 16, "layer data holds calibration and validation only"
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
    moved = pts.copy()
    moved[1] = [0.05, 1.0]
    got = embedding_agreement(pts, moved)
    assert got["top1_neighbor_agreement"] == pytest.approx(1 / 5)  # only text 4 keeps its nearest neighbour
    assert got["top1_ci_low"] < 0.2 < got["top1_ci_high"] and got["recall_at_10"] == pytest.approx(1.0)  # k = N - 1: every other text


def test_retrieval_intervals_and_near_ties():
    """Top-1 with a 95% interval (Wilson), near-ties counted, recall@10 below 1 when neighbours move."""
    assert wilson_interval(320, 320) == pytest.approx((0.988, 1.0), abs=1e-3)  # 100% on 320 texts: at least 98.8%
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(19, 20)
    assert low == pytest.approx(0.764, abs=1e-3) and high == pytest.approx(0.991, abs=1e-3)
    ties = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, -1.0], [-1.0, 0.0]])  # each text: two neighbours at the same cosine
    assert embedding_agreement(ties, ties)["near_ties"] == 4.0
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((40, 16))
    got = embedding_agreement(ref, ref + 0.5 * rng.standard_normal(ref.shape))
    assert 0.0 < got["recall_at_10"] < 1.0 and got["near_ties"] == 0.0
    nan = embedding_agreement(ref, np.full_like(ref, np.nan))
    assert np.isnan(nan["mean_cosine"]) and nan["top1_neighbor_agreement"] == 0.0
    with pytest.raises(DataError):
        embedding_agreement(ref, ref[:, :4])


def test_user_texts_split_deterministically_whatever_their_order():
    """--calib FILE: the user's texts get the three roles, 60/20/20, the same split for any order, no duplicate across splits."""
    texts = [f"sentence number {i} about topic {i % 7}" for i in range(50)] + ["sentence number 3 about topic 3"]
    train, select, report = split_user_texts(texts)
    again = split_user_texts(list(reversed(texts)))
    assert (train, select, report) == again
    assert (len(train), len(select), len(report)) == (30, 10, 10)
    assert not (set(train) & set(select)) and not (set(train) & set(report)) and not (set(select) & set(report))
    with pytest.raises(DataError, match="at least 8 distinct texts"):
        split_user_texts(["same"] * 20)
