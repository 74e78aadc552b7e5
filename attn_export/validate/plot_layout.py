"""Plot layout from matplotlib's own bounding boxes: labels placed where they collide with nothing, and a check.

Issue 23 found a legend covering an eager bar, two Pareto labels on top of each other and a
point label cut by the axes frame. Fixed offsets cannot avoid that for every report, so
``place_labels`` tries a few offsets per point and keeps the first whose rendered box
(``Text.get_window_extent`` with the figure's renderer) stays inside the axes and clear of
every marker and label placed so far. ``layout_problems`` measures the finished figure the
same way: overlapping texts, a legend over a bar or a marker, a point label crossing the frame
of its axes, a plot's tick labels running into another plot (issue 33's sensitivity panels). ``plots._save`` logs what it finds; the tests require none.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.patches import Rectangle
from matplotlib.text import Annotation, Text
from matplotlib.transforms import Bbox

__all__ = ["layout_problems", "place_labels"]

log = logging.getLogger(__name__)

# offsets (points) tried in order: beside the marker first, then above/below, then further out
_OFFSETS = ((6, 4), (6, -12), (-6, 4), (-6, -12), (0, 10), (0, -16), (12, 16), (12, -24), (-12, 16), (-12, -24), (0, 24), (0, -30))


def _renderer(fig: Any) -> Any:
    fig.canvas.draw()  # lay out text (and constrained layout) before measuring
    return fig.canvas.get_renderer()


def _overlap(a: Bbox, b: Bbox, slack: float = 0.5) -> bool:
    """Boxes overlap by more than ``slack`` pixels each way (touching is fine)."""
    return min(a.x1, b.x1) - max(a.x0, b.x0) > slack and min(a.y1, b.y1) - max(a.y0, b.y0) > slack


def _inside(inner: Bbox, outer: Bbox, slack: float = 0.5) -> bool:
    return inner.x0 >= outer.x0 - slack and inner.x1 <= outer.x1 + slack and inner.y0 >= outer.y0 - slack and inner.y1 <= outer.y1 + slack


def _marker_boxes(ax: Any, xy: np.ndarray, size_px: float) -> list[Bbox]:
    disp = ax.transData.transform(np.asarray(xy, dtype=np.float64).reshape(-1, 2))
    h = size_px / 2
    return [Bbox.from_extents(x - h, y - h, x + h, y + h) for x, y in disp]


def place_labels(ax: Any, xy: np.ndarray, labels: Sequence[str], bold: Sequence[bool], fontsize: float = 7, marker_px: float = 10) -> list[Annotation]:
    """Annotate point i of ``xy`` (N, 2, data coordinates) with ``labels[i]`` where its box hits nothing placed yet.

    Points are labelled in order, so callers pass the important ones (the Pareto front) first.
    A label that fits nowhere keeps its least-overlapping offset (``layout_problems`` reports it).
    """
    fig = ax.figure
    renderer = _renderer(fig)
    area = ax.get_window_extent(renderer)
    taken = _marker_boxes(ax, xy, marker_px)
    placed: list[Annotation] = []
    for (x, y), label, strong in zip(np.asarray(xy, dtype=np.float64), labels, bold):
        best: tuple[int, tuple[int, int]] = (10**9, _OFFSETS[0])
        for dx, dy in _OFFSETS:
            text = ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                               ha="left" if dx >= 0 else "right", weight="bold" if strong else "normal")  # fmt: skip
            box = text.get_window_extent(renderer)
            hits = sum(_overlap(box, t) for t in taken) + (0 if _inside(box, area) else 2)
            text.remove()
            if hits < best[0]:
                best = (hits, (dx, dy))
            if hits == 0:
                break
        dx, dy = best[1]
        text = ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                           ha="left" if dx >= 0 else "right", weight="bold" if strong else "normal")  # fmt: skip
        taken.append(text.get_window_extent(renderer))
        placed.append(text)
    return placed


def _undrawn_tick_labels(fig: Any) -> set[int]:
    """Tick labels matplotlib keeps but does not draw (their tick lies outside the view interval)."""
    hidden: set[int] = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            span = (hi - lo) * 1e-9
            for ticks in (axis.get_major_ticks(), axis.get_minor_ticks()):
                for tick in ticks:
                    if not lo - span <= tick.get_loc() <= hi + span:
                        hidden.update((id(tick.label1), id(tick.label2)))
    return hidden


def _texts(fig: Any) -> list[Text]:
    hidden = _undrawn_tick_labels(fig)
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in hidden]


def layout_problems(fig: Any) -> list[str]:
    """What a reader would see as broken, from the rendered bounding boxes (empty: nothing)."""
    renderer = _renderer(fig)
    problems: list[str] = []
    texts = _texts(fig)
    boxes = [(t, t.get_window_extent(renderer)) for t in texts]
    for i, (t, box) in enumerate(boxes):  # the PNG is saved with bbox_inches="tight": the figure edge cuts nothing
        for u, other in boxes[i + 1 :]:
            if _overlap(box, other, slack=1.0):
                problems.append(f"texts {t.get_text()!r} and {u.get_text()!r} overlap")
    hidden = _undrawn_tick_labels(fig)
    for ax in fig.axes:  # issue 33: a right panel's tick labels drawn over the panel on its left
        ticks = [t for t in (*ax.get_xticklabels(), *ax.get_yticklabels()) if t.get_visible() and t.get_text().strip() and id(t) not in hidden]
        for other in fig.axes:
            if other is not ax and any(_overlap(t.get_window_extent(renderer), other.get_window_extent(renderer)) for t in ticks):
                problems.append(f"the tick labels of {ax.get_title()!r} run into the plot {other.get_title()!r}")
    for ax in fig.axes:
        area = ax.get_window_extent(renderer)
        for t in ax.texts:
            if isinstance(t, Annotation) and t.get_visible() and not _inside(t.get_window_extent(renderer), area):
                problems.append(f"label {t.get_text()!r} crosses the frame of its plot")
        legend = ax.get_legend()
        if legend is None:
            continue
        lbox = legend.get_window_extent(renderer)
        for patch in ax.patches:
            if isinstance(patch, Rectangle) and patch.get_visible() and patch.get_height() and _overlap(lbox, patch.get_window_extent(renderer)):
                problems.append(f"the legend of {ax.get_title()!r} covers a bar")
                break
        for coll in ax.collections:
            offsets = np.asarray(coll.get_offsets())
            if offsets.size and any(_overlap(lbox, m) for m in _marker_boxes(ax, offsets, 6)):
                problems.append(f"the legend of {ax.get_title()!r} covers a marker")
                break
        for line in ax.lines:
            xy = np.column_stack(line.get_data()) if line.get_marker() not in (None, "None", "", " ") else np.empty((0, 2))
            if xy.size and any(_overlap(lbox, m) for m in _marker_boxes(ax, xy.astype(np.float64), 6)):
                problems.append(f"the legend of {ax.get_title()!r} covers a marker")
                break
    return list(dict.fromkeys(problems))
