"""The run's verdict, decided from report.json alone: PASS, PARTIAL or FAIL, and its exit code.

One rule, read by the runner (exit code), the headline (console, report.md, report.html) and
the CI gate (``attn-export check``), so the four never disagree (issue 33):

* **FAIL** (exit 1): a required stage missed its tolerance, or a selection found nothing to ship
  (``verdict.failures``);
* **PARTIAL** (exit 3): what ships met its tolerance on the report split but fails another data
  set it was judged on (the shipped corpus beside the user's ``--calib`` texts, long texts filling
  ``--seq-len``). A user deploying it would meet that data, so the run does not say PASS;
  ``--accept-partial`` ships it anyway with exit 0, and the report records that the user did
  (``verdict.accept_partial``), so the gate accepts it too and says so;
* **PASS** (exit 0): what ships met its tolerance on every data set it was judged on.

Every artifact's judged data sets are data (``judged_sets``): one entry per set, its name, its
role (the report split, or judged beside it), its figures, the bar and whether it passed. Reports
written before ``details.judged_sets`` existed are read from ``details.also_judged_on``.

What ships (``shipped``): the selection the plan deploys (``selection[key].ships``: with
``--quantize`` the 8-bit model, not the fp32 form choice), else the model the deploy steps took,
else the last ONNX stage (the end of the compression chain, or the plain export).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import PurePath
from typing import Any

__all__ = ["EXIT_CODES", "FAIL", "PARTIAL", "PASS", "JudgedSet", "Shipped", "Verdict", "data_name", "judged_sets", "shipped", "verdict_of"]

log = logging.getLogger(__name__)

PASS, PARTIAL, FAIL = "PASS", "PARTIAL", "FAIL"
EXIT_CODES = {PASS: 0, FAIL: 1, PARTIAL: 3}  # README's "Exit codes" and docs/reliability.md list them
REPORT_SPLIT = "report split"  # the role of the set every decision left unseen
BESIDE = "beside"  # a set judged beside it (the shipped corpus, long texts)

_NOT_SELECTIONS = ("deploy", "skipped_stages")
_FIGURES = ("embedding", "logits")  # what a checkpoint's users read: one of the two is there
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][^\s\\/,()]+)+[\\/]([^\s\\/,()]+)")  # an absolute path -> its file name


# -- what ships --------------------------------------------------------------------------
@dataclass(frozen=True)
class Shipped:
    """The artifact the run ships: its stage (a report.json stage dict), file name and why it was chosen."""

    stage: Mapping[str, Any] | None
    file: str | None
    why: str
    key: str | None = None  # the selection that chose it, when one did


def _selections(report: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The selection entries, the one the plan deploys first (``ships``; older reports: an 8-bit one before the fp32 form's)."""
    entries = [(k, e) for k, e in (report.get("selection") or {}).items()
               if k not in _NOT_SELECTIONS and isinstance(e, Mapping) and "route" in e]  # fmt: skip
    if any("ships" in e for _, e in entries):
        return [(k, e) for k, e in entries if e.get("ships")]
    return sorted(entries, key=lambda ke: str(ke[1].get("precision") or "fp32") == "fp32")  # stable: the plan's order otherwise


def shipped(report: Mapping[str, Any]) -> Shipped:
    """What the run ships (see the module docstring); ``stage`` None when nothing ships (a failed selection)."""
    stages = {s.get("name"): s for s in report.get("stages") or []}
    selection = report.get("selection") or {}
    for key, entry in _selections(report):
        if entry.get("artifact") and entry.get("stage") in stages:
            reason = str(entry.get("reason") or "selected")
            why = reason if reason.startswith(str(entry["stage"])) else f"{entry['stage']}: {reason}"
            return Shipped(stages[entry["stage"]], PurePath(str(entry["artifact"])).name, why, key)
        return Shipped(None, None, f"no {key} route met its tolerance on the select split: {entry.get('reason', '')}", key)
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


# -- the data sets an artifact was judged on ---------------------------------------------
@dataclass(frozen=True)
class JudgedSet:
    """One data set an artifact was judged on: its name, role, figures (``embedding`` / ``logits`` / ``accuracy``), bar, verdict."""

    data: str
    role: str  # REPORT_SPLIT or BESIDE
    passed: bool
    figures: dict[str, Any] = field(default_factory=dict)
    bar: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def data_name(report: Mapping[str, Any]) -> str:
    """The report split in words (``inputs.accuracy_data``), absolute paths shortened to their file names."""
    return _PATH.sub(r"\1", str((report.get("inputs") or {}).get("accuracy_data") or "the report split"))


def _figures(details: Mapping[str, Any], accuracy: Any) -> dict[str, Any]:
    found = {k: dict(details[k]) for k in _FIGURES if details.get(k)}
    return found or ({"accuracy": dict(accuracy)} if accuracy else {})


def judged_sets(stage: Mapping[str, Any], report: Mapping[str, Any]) -> list[JudgedSet]:
    """Every data set ``stage`` was judged on, the report split first (``details.judged_sets``, or derived for older reports)."""
    details = stage.get("details") or {}
    stored = details.get("judged_sets")
    if isinstance(stored, list) and stored:
        return [JudgedSet(str(s.get("data")), str(s.get("role") or BESIDE), bool(s.get("passed")), dict(s.get("figures") or {}),
                          dict(s.get("bar") or {}), [str(v) for v in s.get("violations") or []]) for s in stored if isinstance(s, Mapping)]  # fmt: skip
    bar = dict(stage.get("tolerance") or {})
    out = [JudgedSet(data_name(report), REPORT_SPLIT, stage.get("passed") is not False, _figures(details, stage.get("accuracy")), bar,
                     [str(v) for v in details.get("violations") or []])]  # fmt: skip
    for name, other in (details.get("also_judged_on") or {}).items():
        if isinstance(other, Mapping) and "passed" in other:
            out.append(JudgedSet(str(name), BESIDE, bool(other["passed"]), _figures(other, None), bar, [str(v) for v in other.get("violations") or []]))
    return out


# -- the verdict ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """PASS / PARTIAL / FAIL, why, and what the user accepted; ``exit_code`` follows it."""

    state: str
    failures: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)  # the shipped artifact's failing data sets, each with its shortfall
    accepted: bool = False  # --accept-partial: the user ships a PARTIAL artifact knowingly

    @property
    def ok(self) -> bool:
        """Whether the run may ship: a PASS, or a PARTIAL the user accepted."""
        return self.state == PASS or (self.state == PARTIAL and self.accepted)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else EXIT_CODES[self.state]


def _misses(report: Mapping[str, Any], ship: Shipped) -> list[str]:
    if ship.stage is None:
        return []
    return [f"{ship.file} ({ship.stage.get('name')}) fails on {s.data}: {'; '.join(s.violations) or 'below its bar'}"
            for s in judged_sets(ship.stage, report) if not s.passed and s.role != REPORT_SPLIT]  # fmt: skip


def verdict_of(report: Mapping[str, Any]) -> Verdict:
    """The verdict of ``report`` (a report.json dict) by the rule of the module docstring."""
    recorded = report.get("verdict") or {}
    failures = [str(f) for f in recorded.get("failures") or []]
    misses = _misses(report, shipped(report))
    accepted = bool(recorded.get("accept_partial"))
    if failures:
        return Verdict(FAIL, failures, misses, accepted)
    if misses:
        return Verdict(PARTIAL, failures, misses, accepted)
    stages = report.get("stages") or []
    passed = recorded.get("passed", all(s.get("passed") is not False for s in stages))
    return Verdict(PASS if passed else FAIL, failures, misses, accepted)
