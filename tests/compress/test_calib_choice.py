"""Per-tensor calibration, the SmoothQuant alpha search and the probe that feeds both."""

from __future__ import annotations

import numpy as np
import pytest

from attn_export.compress.calib.choice import (
    PER_TENSOR,
    candidate_thresholds,
    choose_ranges,
    entropy_threshold,
    quantization_mse,
)
from attn_export.compress.probe import RunningHistogram, TensorStats, real_tokens, trim_feed
from attn_export.compress.quant.smoothquant_alpha import choose_alpha


def _hist(values: np.ndarray, batches: int = 4) -> RunningHistogram:
    h = RunningHistogram()
    for part in np.array_split(values, batches):
        h.add(part)
    return h


def test_running_histogram_grows_its_range_without_losing_counts():
    rng = np.random.default_rng(0)
    small, large = rng.standard_normal(10_000) * 0.1, rng.standard_normal(10_000) * 10.0
    h = _hist(np.concatenate([small, large]), batches=2)  # the second batch is 100x wider than the first
    assert h.total == 20_000 and h.counts.sum() == 20_000
    assert h.absmax == pytest.approx(np.abs(large).max(), rel=1e-6) and h.width * h.bins > h.absmax
    exact = np.percentile(np.abs(np.concatenate([small, large])), 99.0)
    assert h.percentile(99.0) == pytest.approx(exact, rel=0.02)
    assert h.percentile(50.0) <= h.percentile(99.0) <= h.percentile(99.999) <= h.absmax


def test_quantization_mse_matches_fake_quantization():
    x = np.random.default_rng(1).standard_normal(200_000).astype(np.float32)
    h = _hist(x)
    for t in (1.0, 2.5, 4.0):
        s = t / 127
        exact = float(np.mean((x - np.clip(np.rint(x / s), -127, 127) * s) ** 2))
        assert quantization_mse(h, t) == pytest.approx(exact, rel=0.1), t


def test_per_tensor_choice_clips_a_rare_outlier_but_keeps_a_heavy_channel():
    rng = np.random.default_rng(2)
    rare = rng.standard_normal(1_000_000).astype(np.float32)
    rare[0] = 100.0  # one value in a million: clipping it costs less than 100/127 steps for everything else
    heavy = rng.standard_normal(100_000).astype(np.float32)
    heavy[::50] *= 30.0  # 2% of the values are large: clipping them is expensive
    stats = {"rare": TensorStats("rare", hist=_hist(rare)), "heavy": TensorStats("heavy", hist=_hist(heavy))}
    chosen = choose_ranges(stats, PER_TENSOR)
    assert chosen["rare"].method != "minmax" and chosen["rare"].threshold < 20.0, chosen["rare"]
    assert chosen["heavy"].threshold > 50.0, chosen["heavy"]
    for c in chosen.values():
        assert c.mse[c.method] == min(c.mse.values()), "per-tensor picks the smallest estimated error"
    glob = choose_ranges(stats, "minmax")
    assert glob["rare"].method == "minmax" and glob["rare"].threshold == pytest.approx(100.0)


def test_entropy_threshold_lies_inside_the_range():
    h = _hist(np.random.default_rng(3).standard_normal(100_000))
    t = entropy_threshold(h)
    assert 1.5 < t <= h.absmax, t
    assert set(candidate_thresholds(h)) == {"minmax", "percentile-99.9", "percentile-99.99", "percentile-99.999", "entropy"}


def test_probe_keeps_real_tokens_and_trims_padding():
    x = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
    mask = np.array([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=np.int64)
    feed = {"x": x, "key_padding_mask": mask}
    rows = real_tokens(feed, x)
    assert rows.shape == (3, 3) and rows.tolist() == [x[0, 0].tolist(), x[0, 1].tolist(), x[1, 0].tolist()]
    trimmed = trim_feed(feed)
    assert trimmed["x"].shape == (2, 2, 3) and trimmed["key_padding_mask"].shape == (2, 2)


def _outlier_gemm(outliers: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    if outliers:
        x = rng.standard_normal((1024, 64)).astype(np.float32)
        x[:, :3] *= 40.0  # three outlier channels, as post-LayerNorm hidden states have
    else:  # +-1 everywhere: int8 represents it exactly, any smoothing can only add error
        x = rng.choice([-1.0, 1.0], size=(1024, 64)).astype(np.float32)
    w = (rng.standard_normal((64, 32)) / 8).astype(np.float32)
    return x, np.abs(x).max(axis=0), w


def test_smoothquant_search_smooths_outliers_and_leaves_flat_activations_alone():
    x, xmax, w = _outlier_gemm(True)
    choice = choose_alpha("outliers", x, xmax, w, "static", "minmax")
    assert choice.alpha is not None and choice.gain > 0.5, choice.to_dict()
    x, xmax, w = _outlier_gemm(False)
    flat = choose_alpha("flat", x, xmax, w, "static", "minmax")
    assert flat.alpha is None and flat.gain == 0.0, flat.to_dict()
    dyn = choose_alpha("outliers", *_outlier_gemm(True), route="dynamic")
    assert dyn.alpha is not None, dyn.to_dict()
