"""The one line every report leads with: the verdict, what ships and why, its accuracy and its speed-up.

A user opening a report wants the answer before the evidence (issue 23): did the run pass,
which file do I deploy, how close is it to my model, and how much faster is it. The console
summary, report.md and report.html all print ``headline(report)`` first, built from
report.json alone, so a report rendered again later (``attn-export report``) says the same.

What ships: the file a selection copied (``selection[key].artifact``, e.g. ``model.int8.onnx``,
with the selection's reason), else the model the deploy steps took (``selection.deploy.onnx``),
else the last ONNX stage of the run (the plan ships the end of its compression chain, or the
plain export). Accuracy is that stage's, on the report split (``inputs.accuracy_data``): the
mean and minimum sentence-embedding cosine and the top-1 neighbour agreement with its 95%
Wilson interval for a checkpoint, the output cosine and relative L2 error for a layer.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

__all__ = ["Headline", "Shipped", "format_tolerance", "headline", "shipped", "wilson_interval"]

log = logging.getLogger(__name__)

_NOT_SELECTIONS = ("deploy", "skipped_stages")
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][^\s\\/,()]+)+[\\/]([^\s\\/,()]+)")  # an absolute path -> its file name


@dataclass(frozen=True)
class Shipped:
    """The artifact the run ships: its stage (a report.json stage dict), file name and why it was chosen."""

    stage: Mapping[str, Any] | None
    file: str | None
    why: str


def shipped(report: Mapping[str, Any]) -> Shipped:
    """What the run ships (see the module docstring); ``stage`` None when nothing ships (a failed selection)."""
    stages = {s.get("name"): s for s in report.get("stages") or []}
    selection = report.get("selection") or {}
    for key, entry in selection.items():
        if key in _NOT_SELECTIONS or not isinstance(entry, Mapping) or "route" not in entry:
            continue
        if entry.get("artifact") and entry.get("stage") in stages:
            reason = str(entry.get("reason") or "selected")
            why = reason if reason.startswith(str(entry["stage"])) else f"{entry['stage']}: {reason}"
            return Shipped(stages[entry["stage"]], PurePath(str(entry["artifact"])).name, why)
        return Shipped(None, None, f"no {key} route met its tolerance on the select split: {entry.get('reason', '')}")
    onnx = [s for s in stages.values() if str(s.get("artifact") or "").endswith(".onnx")]
    deployed = (selection.get("deploy") or {}).get("onnx")
    if deployed:
        name = PurePath(str(deployed)).name
        match = next((s for s in onnx if PurePath(str(s["artifact"])).name == name), None)
        if match is not None:
            return Shipped(match, name, f"{match['name']}: the model the deploy steps took")
    if not onnx:
        return Shipped(None, None, "the run wrote no ONNX model")
    last = onnx[-1]
    why = "the plain export (no compression asked)" if last is onnx[0] else "the end of the compression chain"
    return Shipped(last, PurePath(str(last["artifact"])).name, f"{last['name']}: {why}")


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


def _data(report: Mapping[str, Any]) -> str:
    text = str((report.get("inputs") or {}).get("accuracy_data") or "the report split")
    return _PATH.sub(r"\1", text)


def _accuracy(stage: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    emb = (stage.get("details") or {}).get("embedding")
    bar = format_tolerance(stage.get("tolerance"))
    bar = f" (bar: {bar})" if bar else ""
    if emb:
        n = int(emb.get("num_texts") or 0)
        top1 = float(emb["top1_neighbor_agreement"])
        lo, hi = wilson_interval(top1, n)
        return (f"sentence embeddings vs the original on {_data(report)}: mean cosine {emb['mean_cosine']:.6f}, min {emb['min_cosine']:.6f}, "
                f"top-1 neighbour {100 * top1:.1f}% (95% CI {100 * lo:.1f}-{100 * hi:.1f}%, {n} texts){bar}")  # fmt: skip
    logits = (stage.get("details") or {}).get("logits")
    if logits and not emb:  # a task head: its labels, per text or per real token
        per = logits.get("per", "text")
        worst = f", worst {per}: {logits['worst']}" if logits.get("worst") else ""
        rank = logits.get("rank")
        if rank:  # a reranker: the order of each query's candidates
            worst = (f", candidate pairs ordered alike {100 * float(rank['pair_order_agreement']):.1f}% and best candidate kept "
                     f"{100 * float(rank['top1_agreement']):.1f}% over {int(rank['num_queries'])} queries{worst}")  # fmt: skip
        return (f"logits vs the original on {_data(report)}: label agreement {100 * float(logits['label_agreement']):.2f}% over "
                f"{int(logits.get('num_rows') or 0)} {'real tokens' if per == 'token' else 'texts'}, logit cosine mean "
                f"{logits['mean_cosine']:.6f}, min {logits['min_cosine']:.6f}{worst}{bar}")  # fmt: skip
    acc = stage.get("accuracy")
    if not acc:
        return "no accuracy measured"
    return f"output vs eager fp32 on {_data(report)}: cosine {acc['cosine']:.6f}, rel_l2 {acc['rel_l2']:.2e}{bar}"


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
    """The verdict line's parts; ``str()`` is the line itself."""

    passed: bool
    file: str | None
    why: str
    accuracy: str
    speed: str
    failures: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"

    def parts(self) -> list[str]:
        """The line after the verdict word: why it failed, what ships and why, accuracy, speed."""
        parts = ["; ".join(self.failures)] if self.failures else []
        parts.append(f"ships {self.file} ({self.why})" if self.file else f"nothing ships: {self.why}")
        if self.file:
            parts += [self.accuracy, self.speed]
        return parts

    def __str__(self) -> str:
        return " | ".join([self.verdict, *self.parts()])


def headline(report: Mapping[str, Any]) -> Headline:
    """The verdict line of ``report`` (a report.json dict)."""
    verdict = report.get("verdict") or {}
    ship = shipped(report)
    stages = report.get("stages") or []
    passed = bool(verdict.get("passed", all(s.get("passed") is not False for s in stages)))
    failures = [str(f) for f in verdict.get("failures") or []]
    if ship.stage is None:
        return Headline(passed, None, ship.why, "", "", failures)
    return Headline(passed, ship.file, ship.why, _accuracy(ship.stage, report), _speed(ship.stage, report), failures)
