"""Route selection: which of several equivalent artifacts ships, decided the same way every run.

A candidate qualifies when it meets its tolerance on the **select** split (never the report
split, which stays unseen by every decision). Every judged data set must pass: a candidate that
fails one of the other select-side sets (long texts filling ``--seq-len``, the shipped corpus
beside the user's texts: ``Candidate.missed``) ships only when no candidate passes them all, so
a slower or larger route that does is chosen over a faster one that does not; when none does,
the best ships and the run's verdict says which data it fails on (``validate.verdict``). A candidate must also be
batch-invariant on the select split (``validate.batch_invariance``; the runner folds it into ``passed_select``).
Among qualifying candidates timed in the same round-robin rounds (``Candidate.rounds_ms``), the target's preferred
one (padding-free first, then the route policy) ships unless another is *clearly* faster on paired rounds
(``validate.paired``), so two routes that measure 11.2 and 11.5 ms never swap places between two runs, under load
too; without paired rounds, candidates within ``NOISE_BAND`` of the fastest p50 count as equally fast.

``preference`` is the target's route policy: a candidate whose route it does not list is never
chosen, however fast or accurate (the plan does not build one; this holds the line if it is given one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attn_export.validate.paired import CLEAR, MIN_ROUNDS, UNDECIDED, PairedComparison, compare_rounds

__all__ = ["MAX_EXTRA_ROUNDS", "NOISE_BAND", "Candidate", "MoreRounds", "SelectionResult", "select_most_accurate", "select_route"]

log = logging.getLogger(__name__)

# Routes within 10% of the fastest count as equally fast: two routes swapped by 7% between runs on
# a shared 2-core machine, and three runs of `attn-export --quantize int8` then picked the same one.
NOISE_BAND = 0.10
MAX_EXTRA_ROUNDS = 3  # times an undecided pair is timed again (``MoreRounds``) before it is declared a tie
# (challenger stage, incumbent stage) -> more paired rounds of the two, in ms, timed interleaved on the deciding input
MoreRounds = Callable[[str, str], tuple[list[float], list[float]]]


@dataclass(frozen=True)
class Candidate:
    """What selection knows of one built artifact."""

    stage: str
    route: str
    p50_ms: float
    passed_select: bool
    headline: float  # cosine (layer) or mean embedding cosine (encoder) on the select split
    shortfall: str = ""  # why it missed the tolerance, when it did
    precision: str = ""  # its 8-bit format, when a selection spans several (--quantize auto)
    missed: tuple[str, ...] = ()  # the other select-side data sets it fails (long texts, the shipped corpus), each with why
    rounds_ms: tuple[float, ...] = ()  # its time per round-robin round on the deciding input (paired with the others')
    form: str = ""  # its encoder form ("packed": padding-free), when the selection spans two


@dataclass
class SelectionResult:
    chosen: Candidate | None
    reason: str
    tried: list[dict[str, Any]] = field(default_factory=list)
    best_failing: Candidate | None = None
    margins: list[dict[str, Any]] = field(default_factory=list)  # each paired comparison that decided it (the report's margin)


def _shippable(candidates: list[Candidate], preference: tuple[str, ...]) -> list[Candidate]:
    """The candidates that met their tolerance on the select split and whose route the policy lists."""
    return [c for c in candidates if c.passed_select and c.route in preference]


def _none_shippable(candidates: list[Candidate], preference: tuple[str, ...]) -> str:
    unlisted = [c.stage for c in candidates if c.passed_select and c.route not in preference]
    if unlisted:
        return f"no candidate the target's route policy ({', '.join(preference) or 'none'}) lists met its tolerance on the select split " \
               f"({', '.join(unlisted)} did, on routes it never ships)"
    return "no candidate met its tolerance on the select split"


def _everywhere(ok: list[Candidate]) -> tuple[list[Candidate], str]:
    """The shippable candidates that also pass every other select-side data set, or, when none does, all of them with a
    caveat: the run then ships the best of those and its verdict says which data it fails on (``validate.verdict``: PARTIAL)."""
    everywhere = [c for c in ok if not c.missed]
    failing = "; ".join(f"{c.stage} fails on {', '.join(c.missed)}" for c in ok if c.missed)
    if not failing:
        return ok, ""
    if everywhere:
        return everywhere, f", among the routes passing every judged data set ({failing})"
    return ok, f"; no route passes every judged data set ({failing})"


def _tried(candidates: list[Candidate]) -> list[dict[str, object]]:
    """What the report lists of every candidate a selection weighed."""
    return [{"stage": c.stage, "route": c.route, "p50_ms": c.p50_ms, "passed_select": c.passed_select, "select_accuracy": c.headline,
             **({"fails_on": list(c.missed)} if c.missed else {})} for c in candidates]  # fmt: skip


def _nothing_ships(candidates: list[Candidate], preference: tuple[str, ...], tried: list[dict[str, object]]) -> SelectionResult:
    """No candidate may ship: why, naming the most accurate one and what it missed by."""
    best = max(candidates, key=lambda c: c.headline, default=None)
    why = _none_shippable(candidates, preference)
    if best is not None:
        why += f"; the most accurate was {best.stage} ({best.shortfall or f'{best.headline:.6f}'})"
    return SelectionResult(None, why, tried, best)


def select_most_accurate(candidates: list[Candidate], preference: tuple[str, ...], precisions: tuple[str, ...] = ()) -> SelectionResult:
    """The passing candidate with the best select-split score (ties broken by ``preference``): for targets whose
    runtime this machine does not time (TensorRT), where a CPU latency would rank the wrong thing.

    ``precisions`` (--quantize auto: the formats the GPU runs, preferred first): the first format with a passing
    candidate ships (FP8 on a GPU with FP8 tensor cores, int8 when FP8 misses its tolerance), its most accurate route."""
    tried, ok = _tried(candidates), _shippable(candidates, preference)
    if not ok:
        return _nothing_ships(candidates, preference, tried)
    ok, caveat = _everywhere(ok)
    rank = {route: i for i, route in enumerate(preference)}
    order = {p: i for i, p in enumerate(precisions)}
    chosen = max(ok, key=lambda c: (-order.get(c.precision, 0), round(c.headline, 6), -rank.get(c.route, len(rank))))
    others = ", ".join(f"{c.stage} {c.headline:.6f}" for c in ok if c is not chosen)
    what = "the most accurate route" if not any(c.precision != chosen.precision for c in ok) else \
        f"the most accurate route of {chosen.precision}, the format the GPU prefers ({' > '.join(precisions)}),"
    reason = (f"{chosen.stage} is {what} meeting its tolerance on the select split ({chosen.headline:.6f}"
              + (f"; {others}" if others else "") + "); the target's own latency is not measured on this machine" + caveat)  # fmt: skip
    return SelectionResult(chosen, reason, tried)


def _duel(challenger: Candidate, incumbent: Candidate, more: MoreRounds | None) -> PairedComparison:
    """Their paired comparison, with more rounds while it is undecided (at most ``MAX_EXTRA_ROUNDS`` times)."""
    mine, theirs = list(challenger.rounds_ms), list(incumbent.rounds_ms)
    for extra in range(MAX_EXTRA_ROUNDS + 1):
        result = compare_rounds(mine, theirs, final=more is None or extra == MAX_EXTRA_ROUNDS)
        if result.outcome != UNDECIDED or more is None:
            return result
        a, b = more(challenger.stage, incumbent.stage)
        mine, theirs = mine + list(a), theirs + list(b)
    return compare_rounds(mine, theirs, final=True)


def _select_paired(ok: list[Candidate], preference: tuple[str, ...], more: MoreRounds | None) -> tuple[Candidate, str, list[dict[str, Any]]]:
    """The most preferred candidate (padding-free first, then the route policy) unless another is clearly faster on paired
    rounds; each challenger meets the one in place. Returns the chosen one, why, and every comparison (the margin)."""
    rank = {route: i for i, route in enumerate(preference)}
    order = sorted(ok, key=lambda c: (c.form != "packed", rank.get(c.route, len(rank)), c.p50_ms))
    chosen, margins, words = order[0], [], []
    for challenger in order[1:]:
        duel = _duel(challenger, chosen, more)
        margins.append({"challenger": challenger.stage, "incumbent": chosen.stage, **duel.to_dict()})
        words.append(f"{challenger.stage} vs {chosen.stage}: {duel.describe()}")
        if duel.outcome == CLEAR:
            chosen = challenger
    prefer = "padding-free first, then " + " > ".join(preference) if any(c.form for c in ok) else " > ".join(preference)
    reason = (f"{chosen.stage} ({chosen.p50_ms:.2f} ms) ships: a route displaces the preferred one ({prefer}) only when it is "
              f"clearly faster on paired rounds ({'; '.join(words)})")
    return chosen, reason, margins


def select_route(candidates: list[Candidate], preference: tuple[str, ...], band: float = NOISE_BAND,
                 more_rounds: MoreRounds | None = None) -> SelectionResult:  # fmt: skip
    """The fastest passing candidate. With paired round-robin rounds for every candidate (``Candidate.rounds_ms``): the
    preferred one unless another is clearly faster (``validate.paired``; ``more_rounds`` times an undecided pair
    again); without them: ties within ``band`` of the fastest p50 broken by ``preference``."""
    tried, ok = _tried(candidates), _shippable(candidates, preference)
    if not ok:
        return _nothing_ships(candidates, preference, tried)
    ok, caveat = _everywhere(ok)
    if len(ok) > 1 and all(len(c.rounds_ms) >= MIN_ROUNDS for c in ok):
        chosen, reason, margins = _select_paired(ok, preference, more_rounds)
        return SelectionResult(chosen, reason + caveat, tried, margins=margins)
    fastest = min(ok, key=lambda c: c.p50_ms)
    tied = [c for c in ok if c.p50_ms <= fastest.p50_ms * (1.0 + band)]
    rank = {route: i for i, route in enumerate(preference)}
    chosen = min(tied, key=lambda c: (rank.get(c.route, len(rank)), c.p50_ms))
    if chosen is not fastest:
        reason = (f"{chosen.stage} ({chosen.p50_ms:.2f} ms) is within {band:.0%} of the fastest, {fastest.stage} "
                  f"({fastest.p50_ms:.2f} ms): equally fast within the timing noise, and the target prefers {' > '.join(preference)}")  # fmt: skip
    elif len(ok) == 1:
        reason = f"{chosen.stage} ({chosen.p50_ms:.2f} ms) is the only candidate meeting its tolerance"
    else:
        reason = f"{chosen.stage} is the fastest route meeting its tolerance ({chosen.p50_ms:.2f} ms)"
        others = [c for c in tied if c is not chosen]
        if others:
            reason += f"; {', '.join(c.stage for c in others)} within {band:.0%}, and the target prefers {' > '.join(preference)}"
    return SelectionResult(chosen, reason + caveat, tried)
