"""The per-stage error histogram stored in ``Stage.details["error_histogram"]``.

Absolute errors of different stages span many decades (fp32 ~1e-7, int8 ~1e-2), so bins
are log-spaced over |candidate - reference| and every stage uses the same fixed edges:
histograms of different stages and runs can be overlaid without re-binning. Exact zeros
(common for fp32) are counted apart, since log bins cannot hold them.

Schema: ``{"bin_edges": [n+1 floats], "counts": [n ints], "zeros": int, "total": int,
"quantity": "abs_error"}``. Building it needs numpy only, so pipelines can call it without
importing matplotlib.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ERROR_BIN_EDGES", "error_histogram", "histogram_from_details"]

# 1e-9 .. 1e+1 in 4 bins per decade; errors outside are clipped into the end bins.
ERROR_BIN_EDGES: np.ndarray = np.logspace(-9, 1, 41)


def error_histogram(reference: np.ndarray, candidate: np.ndarray, bin_edges: np.ndarray | None = None) -> dict[str, Any]:
    """Histogram of |candidate - reference| (float64) on log-spaced edges, JSON-ready."""
    edges = ERROR_BIN_EDGES if bin_edges is None else np.asarray(bin_edges, dtype=np.float64)
    err = np.abs(np.asarray(candidate, np.float64) - np.asarray(reference, np.float64)).ravel()
    err = np.where(np.isfinite(err), err, edges[-1])  # NaN/Inf land in the last bin, visibly
    zeros = int(np.count_nonzero(err == 0.0))
    nz = np.clip(err[err > 0.0], edges[0], edges[-1])
    counts, _ = np.histogram(nz, bins=edges)
    return {
        "bin_edges": [float(e) for e in edges],
        "counts": [int(c) for c in counts],
        "zeros": zeros,
        "total": int(err.size),
        "quantity": "abs_error",
    }


def histogram_from_details(details: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stored histogram of a stage in this module's schema, or None when absent or malformed.

    Also reads the older ``{"log10_abs_error_bin_edges": [...], "counts": [...]}`` layout.
    """
    hist = (details or {}).get("error_histogram")
    if not isinstance(hist, dict):
        return None
    edges, counts = hist.get("bin_edges"), hist.get("counts")
    if edges is None and isinstance(hist.get("log10_abs_error_bin_edges"), list):
        edges = [float(10.0**e) for e in hist["log10_abs_error_bin_edges"]]
    if not isinstance(edges, list) or not isinstance(counts, list) or len(edges) != len(counts) + 1:
        return None
    return {"zeros": 0, "total": int(sum(counts)) + int(hist.get("zeros", 0)), "quantity": "abs_error", **hist, "bin_edges": edges}
