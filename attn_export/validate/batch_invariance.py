"""Batch invariance: does a model give a text the same answer alone as inside any batch?

A service embeds documents in large batches and queries one at a time: when a text's embedding
moves with its batch mates (dynamic int8 takes one activation range per tensor per batch), the
index and the query disagree (fastembed-rs #107, "Dynamic Quantization causes batching to change
the output values"). So every shipped 8-bit model of a checkpoint is held to a figure: each text
run alone, then inside batches of 8 and of 32, in file order and shuffled (seed 0), each batch
padded to its own longest text as a service pads; the figure is the min cosine of a text alone
against the same text inside a batch, over all four batchings, with the worst text named.

The bar (``INVARIANCE_BAR``, 0.99999) sits between what fp32 kernels do (they reorder sums with the
batch shape: 1 - cos ~ 1e-7) and what per-batch int8 ranges do (MiniLM's dynamic route: 0.9968).
A route below it is never shipped (``pipeline.select``), whatever its speed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["BATCHINGS", "INVARIANCE_BAR", "INVARIANCE_TEXTS", "BatchInvariance", "measure_batch_invariance", "text_rows"]

INVARIANCE_BAR = 0.99999
BATCHINGS = (8, 32)  # the batch sizes a text is compared in, each in file order and shuffled
INVARIANCE_TEXTS = 32  # texts per measurement: 32 alone, four batches of 8, one of 32, in two orders (seconds on a base-size encoder)

Feed = dict[str, np.ndarray]


@dataclass(frozen=True)
class BatchInvariance:
    """The figure, per batching and overall, on ``texts`` texts of one data set."""

    min_cosine: float
    worst_text: str  # the text whose answer moved most, as the user wrote it (cut to 80 characters)
    worst_batching: str  # e.g. "batch 32, shuffled"
    texts: int
    batchings: list[dict[str, Any]] = field(default_factory=list)
    bar: float = INVARIANCE_BAR

    @property
    def passed(self) -> bool:
        return bool(np.isfinite(self.min_cosine)) and self.min_cosine >= self.bar

    def violation(self) -> str:
        """Why it is not shipped, in the words of a selection's shortfall."""
        return (f"batch invariance {self.min_cosine:.6f} < {self.bar} (text {self.worst_text!r} alone vs in {self.worst_batching}); "
                "a text's answer moves with its batch mates")

    @classmethod
    def from_dict(cls, figure: Mapping[str, Any]) -> BatchInvariance:
        """The figure as report.json holds it (``to_dict``)."""
        return cls(float(figure.get("min_cosine", float("nan"))), str(figure.get("worst_text", "")), str(figure.get("worst_batching", "")),
                   int(figure.get("texts", 0)), list(figure.get("batchings") or []), float(figure.get("bar", INVARIANCE_BAR)))  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {"min_cosine": self.min_cosine, "passed": self.passed, "bar": self.bar, "texts": self.texts,
                "worst_text": self.worst_text, "worst_batching": self.worst_batching, "batchings": list(self.batchings)}


def text_rows(output: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """One flat vector per text of a batch's output: a row of an (N, D) output (sentence embeddings, a sequence head's
    logits), or the real tokens of an (N, S, C) one (a token head: padding differs between batchings, so it is cut)."""
    out = np.asarray(output, dtype=np.float64)
    if out.ndim == 2:
        return list(out)
    lengths = np.asarray(mask).sum(axis=1).astype(int)
    return [out[i, : lengths[i]].ravel() for i in range(out.shape[0])]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("nan")
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / denom) if denom > 0 else (1.0 if not a.any() and not b.any() else 0.0)


def _batch(feed: Feed, idx: np.ndarray, mask_name: str) -> tuple[Feed, np.ndarray]:
    """The texts ``idx`` of ``feed`` as one batch cut to its longest text (its attention mask returned beside)."""
    width = max(1, int(feed[mask_name][idx].sum(axis=1).max()))
    sub = {k: np.ascontiguousarray(v[idx][:, :width]) for k, v in feed.items()}
    return sub, sub[mask_name]


def measure_batch_invariance(
    feed: Feed, texts: Sequence[str], infer: Callable[[Feed], np.ndarray], *, mask_name: str = "attention_mask",
    batchings: Sequence[int] = BATCHINGS, bar: float = INVARIANCE_BAR,
) -> BatchInvariance:  # fmt: skip
    """The figure for ``infer`` (a batch's feed -> the output users read) on the texts of ``feed`` (token arrays (N, S)).

    Every text alone is the reference row; each batching runs the same texts in batches and compares row by row."""
    n = len(next(iter(feed.values())))
    alone = [text_rows(infer(b), m)[0] for b, m in (_batch(feed, np.array([i]), mask_name) for i in range(n))]
    orders = {"file order": np.arange(n), "shuffled": np.random.default_rng(0).permutation(n)}
    worst, worst_i, worst_at, rows = 1.0, 0, "", []
    for size in batchings:
        for name, order in orders.items():
            low, low_i = 1.0, 0
            for start in range(0, n, size):
                idx = order[start : start + size]
                sub, mask = _batch(feed, idx, mask_name)
                for i, row in zip(idx, text_rows(infer(sub), mask)):
                    c = _cosine(alone[int(i)], row)
                    if not c >= low:  # NaN counts as the worst
                        low, low_i = c, int(i)
            rows.append({"batch": size, "order": name, "min_cosine": low})
            if not low >= worst:
                worst, worst_i, worst_at = low, low_i, f"batch {size}, {name}"
    text = texts[worst_i] if worst_i < len(texts) else f"#{worst_i}"
    return BatchInvariance(worst, text if len(text) <= 80 else text[:77] + "...", worst_at or f"batch {batchings[0]}, file order", n,
                           rows, bar)  # fmt: skip
