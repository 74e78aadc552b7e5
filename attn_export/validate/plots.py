"""Report plots (matplotlib, drawn on Agg canvases), each written to a PNG and returned as a Path.

Every function takes plain report/bench dicts (the JSON files' content), so plots can be
redrawn from committed JSON without re-running anything. Functions return None instead of an
empty picture when the input has nothing to draw.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from attn_export.validate.error_histogram import error_histogram, histogram_from_details
from attn_export.validate.pareto import ParetoPoint, pareto_front, points_from_report
from attn_export.validate.plot_layout import layout_problems, place_labels

__all__ = ["plot_attention_maps", "plot_error_histograms", "plot_latency", "plot_pareto", "plot_sensitivity", "plot_seq_scaling"]

log = logging.getLogger(__name__)

_DPI = 100
SQNR_PLOT_CAP_DB = 160.0  # identical outputs report 300 dB; keep the axis readable


def _figure(**kwargs: Any) -> Figure:
    """A figure on its own Agg canvas: headless, and without pyplot, so the process's backend
    (``matplotlib.use``) and pyplot's figure registry are left as the caller set them."""
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | os.PathLike[str]) -> Path:
    """Atomic PNG write: render to a temp file in the same folder, then rename."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    for problem in layout_problems(fig):
        log.warning("%s: %s", p.name, problem)
    tmp = p.with_name(f".{p.name}.tmp")
    try:
        fig.savefig(tmp, dpi=_DPI, bbox_inches="tight", format="png")
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)
    return p


def plot_latency(report: Mapping[str, Any], path: str | os.PathLike[str]) -> Path | None:
    """Bars of p50 latency per stage (p90 as whiskers) next to eager, and speedup vs eager."""
    rows = [s for s in report.get("stages", []) if ((s.get("latency_ms") or {}).get("artifact") or {}).get("p50") is not None]
    if not rows:
        return None
    names = [s["name"] for s in rows]
    art = np.array([s["latency_ms"]["artifact"]["p50"] for s in rows])
    art90 = np.array([s["latency_ms"]["artifact"].get("p90", p) for s, p in zip(rows, art)])
    eag = np.array([((s["latency_ms"].get("eager") or {}).get("p50") or np.nan) for s in rows])
    speed = np.array([s.get("speedup_vs_eager") or (e / a if a else np.nan) for s, e, a in zip(rows, eag, art)])
    # horizontal bars: stage names stay horizontal and readable however many stages and however long their names
    fig = _figure(figsize=(10, 1.9 + 0.55 * len(rows)))
    ax1, ax2 = fig.subplots(1, 2, sharey=True)
    y = np.arange(len(rows))[::-1]  # first stage on top
    ax1.barh(y + 0.2, eag, 0.4, label="eager (same run)", color="#bbbbbb")
    ax1.barh(y - 0.2, art, 0.4, xerr=[np.zeros_like(art), np.maximum(art90 - art, 0)], label="artifact p50 (p90 whisker)", color="#3a7bd5")
    ax1.set_yticks(y, names, fontsize=8)
    ax1.set_xlabel("latency (ms)")
    ax1.set_title("Latency per stage", pad=22)
    ax1.legend(fontsize=8, ncol=2, loc="lower left", bbox_to_anchor=(0.0, 1.0), borderaxespad=0.2, frameon=False)  # above the bars, never on one
    ax2.barh(y, speed, 0.6, color=["#2e9e5b" if v >= 1 else "#d9534f" for v in np.nan_to_num(speed, nan=1.0)])
    ax2.axvline(1.0, color="k", lw=0.8, ls="--")
    ax2.set_xlabel("speedup vs eager (x)")
    ax2.set_title("Speedup vs eager", pad=22)
    ax2.set_xlim(0, 1.25 * float(np.nanmax(np.append(speed, 1.0))))  # room for the value beside the longest bar
    for yi, v in zip(y, speed):
        if not math.isnan(v):
            ax2.annotate(f"{v:.2f}x", (v, yi), xytext=(3, 0), textcoords="offset points", ha="left", va="center", fontsize=8)
    return _save(fig, path)


def plot_pareto(
    points: Sequence[ParetoPoint] | Mapping[str, Any],
    path: str | os.PathLike[str],
    metric: str = "sqnr_db",
    title: str = "Accuracy vs latency",
    xlabel: str = "latency p50 (ms)",
) -> Path | None:
    """Scatter of accuracy vs latency; the non-dominated points are highlighted and joined."""
    if isinstance(points, Mapping):
        pts = points_from_report(points, metric, relative=True)
        xlabel = "latency relative to eager fp32 (p50 ratio, same run)"
    else:
        pts = list(points)
    if not pts:
        return None
    cap = SQNR_PLOT_CAP_DB if metric == "sqnr_db" else math.inf
    lat = np.array([p.latency for p in pts])
    acc = np.array([min(p.accuracy, cap) for p in pts])
    front = pareto_front(pts)
    fig = _figure(figsize=(7.5, 5))
    ax = fig.subplots()
    ax.scatter(lat, acc, c="#9aa5b1", s=30, label="dominated", zorder=2)
    ax.plot(lat[front], acc[front], "-o", c="#e8590c", ms=8, lw=1.5, label="Pareto front (non-dominated)", zorder=3)
    ax.margins(x=0.18, y=0.14)  # room for the labels of the points at the edges
    ax.set_xlabel(f"{xlabel} - lower is better")
    ylabel = {"sqnr_db": f"SQNR vs eager fp32 (dB, capped at {cap:.0f})", "cosine": "cosine vs eager fp32"}.get(metric, metric)
    ax.set_ylabel(ylabel + " - higher is better")
    ax.set_title(title, pad=22)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="lower left", bbox_to_anchor=(0.0, 1.0), borderaxespad=0.2, frameon=False)  # above the points
    order = list(front) + [i for i in np.argsort(lat) if i not in front]  # the front is labelled first, where it fits best
    place_labels(ax, np.column_stack([lat, acc])[order], [pts[i].label for i in order], [i in front for i in order])
    return _save(fig, path)


def plot_error_histograms(
    report: Mapping[str, Any], path: str | os.PathLike[str], samples: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None
) -> Path | None:
    """|artifact - eager| histograms per stage, on shared log bins.

    ``samples`` maps stage name -> (reference, candidate) arrays; otherwise each stage's
    stored ``details["error_histogram"]`` is used. Stages with neither are left out.
    """
    hists: dict[str, dict[str, Any]] = {}
    for s in report.get("stages", []):
        name = s["name"]
        if samples and name in samples:
            hists[name] = error_histogram(*samples[name])
        elif (h := histogram_from_details(s.get("details"))) is not None:
            hists[name] = h
    if not hists:
        return None
    n = len(hists)
    fig = _figure(figsize=(7.5, 1.9 * n + 0.6))
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)
    for ax, (name, h) in zip(axes[:, 0], hists.items()):
        edges = np.asarray(h["bin_edges"], dtype=np.float64)
        counts = np.asarray(h["counts"], dtype=np.float64)
        total = max(1, int(h.get("total") or counts.sum() + h.get("zeros", 0)))
        ax.stairs(counts / total, edges, fill=True, color="#3a7bd5", alpha=0.8)
        ax.set_xscale("log")
        zeros = int(h.get("zeros", 0))
        ax.set_title(f"{name}: |error| vs eager" + (f"  ({zeros / total:.1%} exactly 0)" if zeros else ""), fontsize=9)
        ax.set_ylabel("fraction")
    axes[-1, 0].set_xlabel("absolute error")
    return _save(fig, path)


def plot_seq_scaling(bench: Mapping[str, Any], path: str | os.PathLike[str], batch: int | None = None) -> Path | None:
    """Latency p50 and peak memory vs sequence length, one line per variant (one batch size)."""
    rows = [r for r in bench.get("results", []) if r.get("latency_ms")]
    if not rows:
        return None
    batch = batch if batch is not None else min(int(r["batch"]) for r in rows)
    rows = [r for r in rows if int(r["batch"]) == batch]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig = _figure(figsize=(12, 4.5))
    ax1, ax2 = fig.subplots(1, 2)
    for i, v in enumerate(variants):
        style = {"color": matplotlib.colormaps["tab20"](i % 20), "ls": ("-", "--", ":")[i // 20 % 3], "marker": "o", "ms": 3, "label": v}
        pts = sorted(((int(r["seq"]), r) for r in rows if r["variant"] == v), key=lambda t: t[0])
        seqs = [s for s, _ in pts]
        ax1.plot(seqs, [r["latency_ms"]["p50"] for _, r in pts], **style)
        mem = [(s, r.get("peak_mem_bytes")) for s, r in pts if r.get("peak_mem_bytes")]
        if mem:
            ax2.plot([s for s, _ in mem], [m / 2**20 for _, m in mem], **style)
    for ax, ylabel in ((ax1, "latency p50 (ms)"), (ax2, "peak memory during inference (MiB, RSS delta)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
    ax1.set_title(f"Latency vs sequence length (batch {batch})")
    ax2.set_title(f"Peak memory vs sequence length (batch {batch})")
    ax2.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _save(fig, path)


def plot_attention_maps(
    eager_maps: np.ndarray, onnx_maps: np.ndarray, path: str | os.PathLike[str], batch_index: int = 0, max_tokens: int = 64, label: str = "ONNX"
) -> Path:
    """Per head: eager map, exported map and |difference|, side by side (rows = heads), each column with its colour scale.

    The probabilities share one scale (0 to the largest), so eager and exported read alike; the
    differences share another across heads, so a head that differs more is visibly brighter."""
    e = np.asarray(eager_maps)[batch_index, :, :max_tokens, :max_tokens]  # (H, Lq, Lk)
    o = np.asarray(onnx_maps)[batch_index, :, :max_tokens, :max_tokens]
    heads = e.shape[0]
    diffs = np.abs(e.astype(np.float64) - o)  # (H, Lq, Lk)
    fig = _figure(figsize=(8.5, 1.9 * heads + 1.2), layout="constrained")
    grid = fig.add_gridspec(heads + 1, 3, height_ratios=[1.0] * heads + [0.07])  # the last row: the colour scales
    axes = np.array([[fig.add_subplot(grid[h, c]) for c in range(3)] for h in range(heads)])
    vmax = float(max(e.max(initial=0.0), o.max(initial=0.0))) or 1.0
    dmax = float(diffs.max(initial=0.0)) or 1e-12
    probs = diff_img = None
    for h in range(heads):
        for col, (img, title) in enumerate(((e[h], "eager"), (o[h], label), (diffs[h], f"|diff| max {diffs[h].max(initial=0):.1e}"))):
            ax = axes[h, col]
            shown = ax.imshow(img, aspect="auto", interpolation="nearest", **({"cmap": "magma", "vmin": 0, "vmax": dmax} if col == 2 else {"vmin": 0, "vmax": vmax}))
            probs, diff_img = (shown, diff_img) if col < 2 else (probs, shown)
            ax.set_title(f"head {h}: {title}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
    # one colour scale per kind, under the columns it reads
    fig.colorbar(probs, cax=fig.add_subplot(grid[heads, :2]), orientation="horizontal", label="attention probability")
    fig.colorbar(diff_img, cax=fig.add_subplot(grid[heads, 2]), orientation="horizontal", label="|eager - exported|")
    fig.suptitle("Attention probabilities per head (query rows x key columns)", fontsize=10)
    return _save(fig, path)


def _sensitivity_stages(report: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for s in report.get("stages", []):
        mp = (s.get("details") or {}).get("mixed_precision") or {}
        if any(g.get("sensitivity") is not None for g in mp.get("gemms", [])):
            out.append((s["name"], mp))
    return out


def plot_sensitivity(report: Mapping[str, Any], path: str | os.PathLike[str]) -> Path | None:
    """Per static int8 stage: each GEMM group's sensitivity (error with only it in int8), most sensitive on top,
    coloured by the precision the fallback left it in."""
    stages = _sensitivity_stages(report)
    if not stages:
        return None
    rows = max(len({g["group"] for g in mp["gemms"]}) for _, mp in stages)
    # constrained layout sizes each panel around its own group names, so a right panel's labels never run into the left one
    fig = _figure(figsize=(7.5 * len(stages), 0.3 * rows + 1.9), layout="constrained")
    axes = fig.subplots(1, len(stages), squeeze=False)
    for ax, (name, mp) in zip(axes[0], stages):
        groups: dict[str, dict[str, Any]] = {}
        for g in mp["gemms"]:
            groups.setdefault(g["group"], g)
        order = sorted(groups.values(), key=lambda g: g.get("sensitivity") or 0.0)
        vals = np.array([max(float(g.get("sensitivity") or 0.0), 1e-12) for g in order])
        floated = [g["precision"] != "int8" for g in order]
        y = np.arange(len(order))
        ax.barh(y, vals, color=["#e8590c" if f else "#3a7bd5" for f in floated])
        ax.set_yticks(y, [g["group"] for g in order], fontsize=7)
        ax.set_xscale("log")
        # whole decades on the axis: values within one decade would otherwise get crowded minor-tick labels
        ax.set_xlim(10 ** math.floor(math.log10(vals.min())), 10 ** max(math.ceil(math.log10(vals.max())), math.floor(math.log10(vals.min())) + 1))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("error with only this group in int8 (" + ("1 - mean embedding cosine" if report.get("model", {}).get("subject") == "encoder" else "relative L2") + ")")
        kept = sum(floated)
        ax.set_title(f"{name}: {kept} group(s) kept in {mp.get('float_precision', 'float')} (orange),\nthe rest int8 (blue)", fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)
