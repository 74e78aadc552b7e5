"""The one line every report leads with: the verdict, what ships and why, its accuracy, speed-up and size.

A user opening a report wants the answer before the evidence (issues 23, 33): did the run pass,
which file do I deploy, how close is it to my model on every data set it was judged on, and
how much faster is it. The console summary, report.md and report.html all print
``headline(report)`` first, built from report.json alone, so a report rendered again later
(``attn-export report``) says the same.

The verdict word and what ships are ``validate.verdict``'s (PASS / PARTIAL / FAIL, one rule with
the exit code and the gate): with ``--quantize`` the 8-bit model the plan deploys (e.g.
``model.int8.onnx``), the fp32 form's choice a line below (``Headline.below``). Accuracy is
that stage's on each judged data set (the report split, ``inputs.accuracy_data``, then the sets
judged beside it, each marked pass/FAIL): the mean and minimum sentence-embedding cosine and the
top-1 neighbour agreement with its 95% Wilson interval for a checkpoint, the labels for a task
head, the output cosine and relative L2 error for a layer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from attn_export.host.memory import format_bytes
from attn_export.validate.verdict import PARTIAL, PASS, JudgedSet, Shipped, judged_sets, shipped, verdict_of

__all__ = ["Headline", "Shipped", "format_tolerance", "headline", "shipped", "wilson_interval"]

log = logging.getLogger(__name__)


def wilson_interval(fraction: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial fraction over ``n`` trials.

    Hand-rolled (three lines) rather than adding scipy as a dependency; it is the interval
    ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")`` returns. Unlike the normal
    approximation it stays inside [0, 1] at 100% agreement, the usual case here.
    """
    if n <= 0:
        return (0.0, 1.0)
    denom = 1 + z * z / n
    centre = (fraction + z * z / (2 * n)) / denom
    half = z * math.sqrt(fraction * (1 - fraction) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


_BOUNDS = {"max_abs": ("max_abs", "<="), "rel_l2": ("rel_l2", "<="), "cosine_min": ("cosine", ">="), "min_mean_cosine": ("mean cosine", ">="),
           "min_min_cosine": ("min cosine", ">="), "min_top1_agreement": ("top-1", ">="), "logit_min_label_agreement": ("label agreement", ">="),
           "logit_min_mean_cosine": ("logit mean cosine", ">="), "logit_max_abs": ("logit max_abs", "<="), "logit_max_rel_l2": ("logit rel_l2", "<=")}  # fmt: skip


def format_tolerance(tolerance: Mapping[str, float] | None) -> str:
    """``{"rel_l2": 0.05, "cosine_min": 0.999}`` -> ``"rel_l2 <= 0.05, cosine >= 0.999"``."""
    return ", ".join(f"{_BOUNDS[k][0]} {_BOUNDS[k][1]} {v:g}" for k, v in (tolerance or {}).items() if k in _BOUNDS)


def _figures(js: JudgedSet) -> tuple[str, str] | None:
    """(what was compared, its figures) of one judged set; None when it holds none."""
    emb, logits, acc = (js.figures.get(k) for k in ("embedding", "logits", "accuracy"))
    if emb:
        n = int(emb.get("num_texts") or 0)
        top1 = float(emb["top1_neighbor_agreement"])
        lo, hi = wilson_interval(top1, n)
        return "sentence embeddings vs the original", (f"mean cosine {emb['mean_cosine']:.6f}, min {emb['min_cosine']:.6f}, "
                                                       f"top-1 neighbour {100 * top1:.1f}% (95% CI {100 * lo:.1f}-{100 * hi:.1f}%, {n} texts)")  # fmt: skip
    if logits:  # a task head: its labels, per text or per real token
        per = logits.get("per", "text")
        worst = f", worst {per}: {logits['worst']}" if logits.get("worst") else ""
        rank = logits.get("rank")
        if rank:  # a reranker: the order of each query's candidates
            worst = (f", candidate pairs ordered alike {100 * float(rank['pair_order_agreement']):.1f}% and best candidate kept "
                     f"{100 * float(rank['top1_agreement']):.1f}% over {int(rank['num_queries'])} queries{worst}")  # fmt: skip
        return "logits vs the original", (f"label agreement {100 * float(logits['label_agreement']):.2f}% over {int(logits.get('num_rows') or 0)} "
                                          f"{'real tokens' if per == 'token' else 'texts'}, logit cosine mean {logits['mean_cosine']:.6f}, "
                                          f"min {logits['min_cosine']:.6f}{worst}")  # fmt: skip
    if acc:
        return "output vs eager fp32", f"cosine {acc['cosine']:.6f}, rel_l2 {acc['rel_l2']:.2e}"
    return None


def _accuracy(stage: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    """The stage's figures on every data set it was judged on, each marked pass/FAIL when there are several, then the bar."""
    bar = format_tolerance(stage.get("tolerance"))
    bar = f" (bar: {bar})" if bar else ""
    sets = judged_sets(stage, report)
    what, pieces = "", []
    for js in sets:
        found = _figures(js)
        if found is None:
            continue
        what = what or found[0]
        mark = "" if len(sets) == 1 else (" pass" if js.passed else f" FAIL ({'; '.join(js.violations) or 'below its bar'})")
        pieces.append(f"on {js.data}: {found[1]}{mark}")
    return f"{what} " + "; ".join(pieces) + bar if pieces else "no accuracy measured"


def _invariance(stage: Mapping[str, Any]) -> str:
    """The batch-invariance figure (``validate.batch_invariance``), where the run measured it: a text alone vs in batches."""
    fig = (stage.get("details") or {}).get("batch_invariance")
    if not isinstance(fig, Mapping) or "min_cosine" not in fig:
        return ""
    sizes = sorted({int(b["batch"]) for b in fig.get("batchings") or [] if isinstance(b, Mapping) and "batch" in b})
    where = f"batches of {' and '.join(map(str, sizes))}" if sizes else "batches"
    word = "batch-invariant" if fig.get("passed") else f"NOT batch-invariant (worst: {fig.get('worst_text')!r}, {fig.get('worst_batching')})"
    return f"; {word}: min cosine {float(fig['min_cosine']):.7f} of a text alone vs in {where} (bar {fig.get('bar')})"


def _speed(stage: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    lat = stage.get("latency_ms") or {}
    art, eager = (lat.get("artifact") or {}).get("p50"), (lat.get("eager") or {}).get("p50")
    if art is None or eager is None or not art:
        return "not timed"
    inputs = report.get("inputs") or {}
    first = (inputs.get("timed_on") or [{}])[0]
    if first.get("label") == "real texts":
        shape = f", on the report split's texts in batches of {first.get('batch')} ({100 * float(first.get('padding_fraction', 0)):.0f}% padding)"
    else:
        shape = f", batch {inputs['batch']} x {inputs['seq_len']} tokens" if "batch" in inputs and "seq_len" in inputs else ""
    return f"speed-up {eager / art:.2f}x vs eager PyTorch ({art:.2f} vs {eager:.2f} ms p50, timed side by side{shape})"


@dataclass(frozen=True)
class Headline:
    """The verdict line's parts; ``str()`` is the line itself, ``below`` the lines under it."""

    state: str  # verdict.PASS / PARTIAL / FAIL
    file: str | None
    why: str
    accuracy: str
    speed: str
    failures: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)  # the data sets what ships fails on (a PARTIAL)
    accepted: bool = False  # --accept-partial
    size: str = ""
    below: list[str] = field(default_factory=list)  # the other selections (with --quantize: the fp32 form's choice)

    @property
    def passed(self) -> bool:
        """Whether the run may ship what it names: a PASS, or a PARTIAL the user accepted."""
        return self.state == PASS or (self.state == PARTIAL and self.accepted)

    @property
    def verdict(self) -> str:
        return self.state

    def parts(self) -> list[str]:
        """The line after the verdict word: why it failed, which data what ships fails on, what ships and why, accuracy, speed, size."""
        parts = ["; ".join(self.failures)] if self.failures else []
        if self.misses:
            then = "shipped anyway: --accept-partial" if self.accepted else "exit 3; --accept-partial ships it anyway"
            parts.append(f"{'; '.join(self.misses)} ({then})")
        parts.append(f"ships {self.file} ({self.why})" if self.file else f"nothing ships: {self.why}")
        if self.file:
            parts += [self.accuracy, self.speed] + ([self.size] if self.size else [])
        return parts

    def __str__(self) -> str:
        return " | ".join([self.verdict, *self.parts()])


def _below(report: Mapping[str, Any], ship: Shipped) -> list[str]:
    """One line per other selection that wrote a file (the fp32 form choice beside an 8-bit model)."""
    out = []
    for key, entry in (report.get("selection") or {}).items():
        if key == ship.key or not isinstance(entry, Mapping) or not entry.get("artifact") or "route" not in entry:
            continue
        out.append(f"{entry.get('precision') or 'fp32'} {key}: {PurePath(str(entry['artifact'])).name} ({entry.get('reason') or 'selected'})")
    return out


def headline(report: Mapping[str, Any]) -> Headline:
    """The verdict line of ``report`` (a report.json dict), by ``validate.verdict``'s rule."""
    verdict = verdict_of(report)
    ship = shipped(report)
    below = _below(report, ship)
    common = {"failures": verdict.failures, "misses": verdict.misses, "accepted": verdict.accepted, "below": below}
    if ship.stage is None:
        return Headline(verdict.state, None, ship.why, "", "", **common)
    size = ship.stage.get("size_bytes")
    return Headline(verdict.state, ship.file, ship.why, _accuracy(ship.stage, report) + _invariance(ship.stage), _speed(ship.stage, report),
                    size=f"size {format_bytes(int(size))}" if size is not None else "", **common)  # fmt: skip
