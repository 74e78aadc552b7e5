"""``bench/batch_invariance.invariance``: the batch-invariance figure of any runtime, on embed callables with a known answer."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
TEXTS = [f"t{i}" for i in range(16)]  # 16 texts: two batches of 8, one (short) batch of 32


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("batch_invariance", REPO / "bench" / "batch_invariance.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _drifting(eps: float):
    """Text i embeds to [1, eps * (i + 1) * batch size]: a batch-dependent drift, largest for the last text."""

    def embed(batch: list[str]) -> np.ndarray:
        return np.array([[1.0, eps * (int(t[1:]) + 1) * len(batch)] for t in batch], np.float32)

    return embed


def _cos(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_a_batch_dependent_embedding_gives_the_worst_text_and_cosine(bench):
    eps = 1e-2
    reference = np.concatenate([_drifting(eps)([t]) for t in TEXTS])  # the texts alone
    out = bench.invariance(_drifting(eps), TEXTS, reference)
    worst = _cos(
        [1, eps * 16], [1, eps * 16 * 16]
    )  # text t15 alone vs in the 16-text batch (batch 32, one short batch)
    assert out["invariance_min_cosine"] == pytest.approx(worst, abs=1e-6)
    assert out["worst_text"] == "t15"
    assert out["passes_bar"] is False
    assert out["alone"]["min"] == pytest.approx(1.0, abs=1e-6)
    assert out["batch32"]["min"] == pytest.approx(worst, abs=1e-6)
    assert [(r["batch"], r["order"]) for r in out["batchings"]] == [
        (8, "file order"),
        (8, "shuffled"),
        (32, "file order"),
        (32, "shuffled"),
    ]


def test_an_embedding_of_the_text_alone_passes_the_bar(bench):
    def embed(batch: list[str]) -> np.ndarray:
        return np.array([[1.0, int(t[1:])] for t in batch], np.float32)

    reference = np.concatenate([embed([t]) for t in TEXTS])
    out = bench.invariance(embed, TEXTS, reference)
    assert out["invariance_min_cosine"] == pytest.approx(1.0, abs=1e-6)  # identical vectors; float32 cosine
    assert out["passes_bar"] is True
