"""Read intermediate tensors of an ONNX graph on calibration data: ranges, histograms, samples.

Calibration choices (which range an activation gets, which SmoothQuant alpha a GEMM gets)
need the activations the quantized GEMMs will see. ``TensorProbe`` runs ONNX Runtime on a
copy of the graph with those tensors added as outputs; ``collect_stats`` reduces them batch
by batch to what the choices read, in one pass and bounded memory:

* ``channel_absmax``: max |x| per channel (the last axis), SmoothQuant's statistic;
* ``hist``: a histogram of |x| (``RunningHistogram``: fixed bin count, the bin width doubles
  when a batch exceeds the range, so one pass suffices whatever the first batch held);
* ``sample``: up to ``sample_tokens`` token rows (N, channels), for errors that need the
  values themselves (a GEMM's output error).

Only real tokens count (and padded tails are cut off before running): when a feed carries a (batch, seq) mask (``attention_mask`` or
``key_padding_mask``) and a tensor's leading axes are (batch, seq), padded positions are
left out. Their outputs are masked away downstream, so ranges fitted to them would only
waste int8 levels (the padded share of the encoder's calibration feeds is ~60%).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from attn_export.compress.calib.bounds import check_finite_activation
from attn_export.errors import ConfigError, DataError

__all__ = ["MASK_INPUTS", "RunningHistogram", "TensorProbe", "TensorStats", "collect_stats", "real_tokens", "trim_feed"]

log = logging.getLogger(__name__)

MASK_INPUTS: tuple[str, ...] = ("attention_mask", "key_padding_mask")  # 1 = real token
DEFAULT_BINS = 2048


class TensorProbe:
    """An ONNX Runtime session of ``model`` that also returns the named tensors.

    ``run(feed)`` returns name -> array for every probed name (graph inputs come from the
    feed). The model is copied; the caller's graph is not changed.
    """

    def __init__(self, model: ir.Model | str | os.PathLike[str], names: Sequence[str], threads: int | None = None) -> None:
        import onnxruntime as ort

        src = model if isinstance(model, ir.Model) else ir.load(os.fspath(model))
        probe = ir.serde.deserialize_model(ir.serde.serialize_model(src))  # an independent copy we may add outputs to
        values = {v.name: v for n in probe.graph for v in n.outputs}
        values.update({v.name: v for v in probe.graph.inputs})
        self.names = list(dict.fromkeys(names))
        self._fetch: list[str] = []
        for name in self.names:
            if name not in values:
                raise ConfigError(f"tensor {name!r} is not in the graph; cannot probe it")
            v = values[name]
            if v.is_graph_input():
                continue
            if v.type is None:
                v.type = ir.TensorType(ir.DataType.FLOAT)
            if not v.is_graph_output():
                probe.graph.outputs.append(v)
            self._fetch.append(name)
        self.input_names = [v.name for v in probe.graph.inputs if not v.is_initializer()]
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if threads:
            so.intra_op_num_threads = int(threads)
        self._session = ort.InferenceSession(
            ir.serde.serialize_model(probe).SerializeToString(), so, providers=["CPUExecutionProvider"]
        )

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        fed = {k: feed[k] for k in self.input_names}
        out = dict(zip(self._fetch, self._session.run(self._fetch, fed))) if self._fetch else {}
        out.update({n: np.asarray(feed[n]) for n in self.names if n not in out})
        return out


def real_tokens(feed: Mapping[str, np.ndarray], arr: np.ndarray) -> np.ndarray:
    """``arr`` as token rows (tokens, channels), padded positions dropped when a mask says which they are."""
    a = np.asarray(arr, dtype=np.float32)
    if a.ndim < 2:
        return a.reshape(-1, 1)
    for name in MASK_INPUTS:
        mask = feed.get(name)
        if mask is not None and mask.ndim == 2 and a.ndim >= 3 and a.shape[:2] == mask.shape:
            return a[np.asarray(mask) != 0].reshape(-1, a.shape[-1])
    return a.reshape(-1, a.shape[-1])


def trim_feed(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feed`` cut to its longest real sequence when a (batch, seq) mask says where padding starts.

    Every input whose leading axes are (batch, seq) is cut alike; padded tails are masked,
    so the real tokens' activations do not change, and calibration feeds padded to a fixed
    length (ONNX Runtime's calibrators stack them) cost ~2.5x less to probe.
    """
    mask = next((np.asarray(feed[n]) for n in MASK_INPUTS if n in feed and np.asarray(feed[n]).ndim == 2), None)
    if mask is None or mask.size == 0:
        return dict(feed)
    real = np.flatnonzero(mask.any(axis=0))
    width = int(real[-1]) + 1 if len(real) else 1
    if width >= mask.shape[1] or not mask[:, width:].sum() == 0:
        return dict(feed)
    return {k: (np.ascontiguousarray(np.asarray(v)[:, :width]) if np.asarray(v).ndim >= 2 and np.asarray(v).shape[:2] == mask.shape else v)
            for k, v in feed.items()}  # fmt: skip


@dataclass
class RunningHistogram:
    """Histogram of |x| over [0, width * bins), built batch by batch.

    When a batch holds a value beyond the range, adjacent bins are merged pairwise and the
    width doubles until it fits: the bin count stays fixed, the resolution never drops
    below what the final range needs divided by ``bins`` / 2.
    """

    bins: int = DEFAULT_BINS
    counts: np.ndarray | None = None
    width: float = 0.0
    absmax: float = 0.0
    total: int = 0

    def add(self, values: np.ndarray) -> None:
        a = np.abs(np.asarray(values, dtype=np.float32).ravel())
        if a.size == 0:
            return
        top = float(a.max())
        if not np.isfinite(top):  # a NaN index or an endless doubling of the bin width otherwise
            raise DataError(f"a histogram of |x| got NaN/Inf values (max {top}); the calibration data overflows the graph: rescale it")
        self.absmax = max(self.absmax, top)
        if self.counts is None:
            self.width = max(top, 1e-12) / self.bins * (1.0 + 1e-6)
            self.counts = np.zeros(self.bins, dtype=np.int64)
        while top >= self.width * self.bins:
            self.counts = self.counts.reshape(-1, 2).sum(axis=1)
            self.counts = np.concatenate([self.counts, np.zeros(self.bins - len(self.counts), dtype=np.int64)])
            self.width *= 2.0
        idx = np.minimum((a / self.width).astype(np.int64), self.bins - 1)
        self.counts += np.bincount(idx, minlength=self.bins)
        self.total += int(a.size)

    @property
    def edges(self) -> np.ndarray:
        return np.arange(self.bins + 1, dtype=np.float64) * self.width

    @property
    def centers(self) -> np.ndarray:
        return (np.arange(self.bins, dtype=np.float64) + 0.5) * self.width

    def percentile(self, p: float) -> float:
        """The |x| below which ``p`` percent of the values lie (upper bin edge, never above the max)."""
        if self.counts is None or self.total == 0:
            return 0.0
        cdf = np.cumsum(self.counts) / self.total
        i = int(np.searchsorted(cdf, p / 100.0))
        return float(min(self.edges[min(i + 1, self.bins)], self.absmax))


@dataclass
class TensorStats:
    """What one probed activation looked like on the calibration data (real tokens only)."""

    name: str
    channel_absmax: np.ndarray | None = None  # (channels,)
    hist: RunningHistogram = field(default_factory=RunningHistogram)
    sample: np.ndarray | None = None  # (tokens, channels)
    tokens: int = 0


def collect_stats(
    model: ir.Model | str | os.PathLike[str],
    names: Sequence[str],
    feeds: Iterable[Mapping[str, np.ndarray]],
    sample_tokens: int = 0,
    histogram: bool = True,
    seed: int = 0,
    threads: int | None = None,
    real_only: bool = True,
) -> dict[str, TensorStats]:
    """Run ``model`` on ``feeds`` and reduce each named tensor to ``TensorStats`` (one pass).

    ``real_only=False`` keeps padded positions (and the feeds' padding): what a quantizer
    that ranges over whole batches at run time (dynamic int8) sees.
    """
    probe = TensorProbe(model, names, threads)
    rng = np.random.default_rng(seed)
    stats = {n: TensorStats(n) for n in probe.names}
    samples: dict[str, list[np.ndarray]] = {n: [] for n in probe.names}
    feeds = list(feeds)
    per_feed = -(-sample_tokens // max(1, len(feeds))) if sample_tokens else 0
    for feed in feeds:
        feed = trim_feed(feed) if real_only else feed
        for name, arr in probe.run(feed).items():
            rows = real_tokens(feed, arr) if real_only else np.asarray(arr, dtype=np.float32).reshape(-1, np.asarray(arr).shape[-1])
            check_finite_activation(name, rows, feed)
            s = stats[name]
            m = np.abs(rows).max(axis=0) if len(rows) else np.zeros(rows.shape[-1], np.float32)
            if s.channel_absmax is not None and s.channel_absmax.shape != m.shape:
                # the last axis is not a channel axis (attention scores: it is the key length, which the trimmed
                # feeds change): only the tensor's absmax is kept
                m = s.channel_absmax = np.full(1, max(float(s.channel_absmax.max()), float(m.max(initial=0.0))), np.float32)
            s.channel_absmax = m if s.channel_absmax is None else np.maximum(s.channel_absmax, m)
            s.tokens += len(rows)
            if histogram:
                s.hist.add(rows)
            if per_feed and len(rows):
                pick = rng.choice(len(rows), size=min(per_feed, len(rows)), replace=False)
                samples[name].append(rows[np.sort(pick)])
    for name, parts in samples.items():
        if parts:
            stats[name].sample = np.concatenate(parts)[:sample_tokens]
    log.debug("probed %d tensors on %d feeds", len(stats), len(feeds))
    return stats
