"""The batch-invariance figure (``validate.batch_invariance``) on a model whose answer is known: a linear map whose
int8 activation range is taken per row (batch-invariant) or per batch (moves a text with its batch mates)."""

from __future__ import annotations

import numpy as np
import pytest

from attn_export.validate.batch_invariance import INVARIANCE_BAR, measure_batch_invariance, text_rows

RNG = np.random.default_rng(0)
W = RNG.standard_normal((16, 8)).astype(np.float32)
EMB = RNG.standard_normal((50, 16)).astype(np.float32) * np.geomspace(0.1, 30, 50, dtype=np.float32)[:, None]


def _int8(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x / scale), -127, 127) * scale


def _model(per: str):
    """Mean-pooled int8(embedding rows) @ W: ranges per token ('row'), per batch ('batch') or none ('float')."""

    def infer(feed: dict[str, np.ndarray]) -> np.ndarray:
        ids, mask = feed["input_ids"], feed["attention_mask"].astype(np.float32)
        x = EMB[ids]
        if per == "row":
            x = _int8(x, np.abs(x).max(axis=-1, keepdims=True) / 127)
        elif per == "batch":
            x = _int8(x, np.abs(x * mask[..., None]).max() / 127)
        return ((x @ W) * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)

    return infer


def _feed(n: int = 40, seq: int = 12) -> tuple[dict[str, np.ndarray], list[str]]:
    ids = RNG.integers(0, 50, (n, seq))
    lengths = RNG.integers(3, seq + 1, n)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    return {"input_ids": ids * mask, "attention_mask": mask}, [f"text number {i}" for i in range(n)]


@pytest.mark.parametrize("per", ["float", "row"])
def test_a_per_row_range_gives_every_text_the_same_answer_in_any_batch(per):
    feed, texts = _feed()
    got = measure_batch_invariance(feed, texts, _model(per))
    assert got.passed and got.min_cosine >= 1 - 1e-9, got
    assert [(b["batch"], b["order"]) for b in got.batchings] == [(8, "file order"), (8, "shuffled"), (32, "file order"), (32, "shuffled")]
    assert got.texts == 40 and got.to_dict()["passed"] is True


def test_a_per_batch_range_is_caught_and_the_worst_text_named():
    feed, texts = _feed()
    got = measure_batch_invariance(feed, texts, _model("batch"))
    assert not got.passed and got.min_cosine < INVARIANCE_BAR, got
    assert got.worst_text in texts and got.worst_batching.startswith("batch ")
    assert "batch invariance" in got.violation() and got.worst_text in got.violation()
    assert got.min_cosine == min(b["min_cosine"] for b in got.batchings)


def test_a_nan_answer_is_the_worst_not_a_pass():
    feed, texts = _feed(10)

    def nan_in_batches(f: dict[str, np.ndarray]) -> np.ndarray:
        out = _model("float")(f)
        return out if len(out) == 1 else out * np.nan

    got = measure_batch_invariance(feed, texts, nan_in_batches)
    assert not got.passed


def test_token_outputs_compare_real_tokens_only():
    mask = np.array([[1, 1, 0], [1, 1, 1]])
    out = np.arange(18, dtype=np.float32).reshape(2, 3, 3)
    rows = text_rows(out, mask)
    assert [r.size for r in rows] == [6, 9]
    assert len(text_rows(np.ones((2, 4)), mask)) == 2
