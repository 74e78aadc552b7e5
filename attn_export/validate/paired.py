"""Is one runner clearly faster than another, or are they tied? Decided on paired rounds, not on two medians.

Round-robin timing (``validate.latency.time_runners``) runs every runner in every round, so round
i of two runners saw the same machine load: their ratio in that round is paired against load
drifting, and the median of the per-round ratios with a bootstrap interval says how sure it is.
On a shared 2-core machine two medians swapped by 7% between runs, and a 10% band under load was
a coin toss (issue 40: the padded int8 shipped once at load 3.7 where the packed one is 1.5-2.3x
faster on real text). Here a challenger displaces the preferred runner only when it is *clearly*
faster: the whole 95% interval of its ratio lies below ``1 - TIE``. An interval inside the tie band
is a tie; one straddling the band's edge asks for more rounds (``Undecided``), up to a budget, and
is then a tie. The bootstrap is seeded: the same samples always give the same answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CLEAR", "MIN_ROUNDS", "SLOWER", "TIE", "TIED", "UNDECIDED", "PairedComparison", "compare_rounds", "paired_rounds"]

TIE = 0.03  # ratios within 3% of 1 are the same speed: below what a user can measure on a shared machine
MIN_ROUNDS = 5  # fewer paired rounds decide nothing: the comparison asks for more
CLEAR, TIED, SLOWER, UNDECIDED = "clearly faster", "tie", "clearly slower", "undecided"
_BOOT = 2000


@dataclass(frozen=True)
class PairedComparison:
    """``challenger / incumbent`` time per round: its median and 95% interval, over ``rounds`` paired rounds."""

    ratio: float
    low: float
    high: float
    rounds: int
    outcome: str  # CLEAR (the challenger is faster), TIED, SLOWER, or UNDECIDED (more rounds would tell)

    def describe(self) -> str:
        return f"{self.ratio:.3f}x the time (95% interval {self.low:.3f}-{self.high:.3f}, {self.rounds} paired rounds): {self.outcome}"

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "interval": [self.low, self.high], "rounds": self.rounds, "outcome": self.outcome, "tie_band": TIE}


def compare_rounds(challenger_ms: Sequence[float], incumbent_ms: Sequence[float], final: bool = False) -> PairedComparison:
    """The challenger's time over the incumbent's, round by round (entry i of both timed in the same round).

    ``final``: no more rounds will come, so an undecided comparison is a tie (the incumbent keeps its place)."""
    n = min(len(challenger_ms), len(incumbent_ms))
    a, b = np.asarray(challenger_ms[:n], dtype=np.float64), np.asarray(incumbent_ms[:n], dtype=np.float64)
    ok = (a > 0) & (b > 0) & np.isfinite(a) & np.isfinite(b)
    logs = np.log(a[ok] / b[ok])
    if logs.size == 0:
        return PairedComparison(float("nan"), float("nan"), float("nan"), 0, TIED if final else UNDECIDED)
    boot = np.random.default_rng(0).choice(logs, size=(_BOOT, logs.size), replace=True)
    medians = np.median(boot, axis=1)
    ratio, low, high = (float(np.exp(v)) for v in (np.median(logs), np.quantile(medians, 0.025), np.quantile(medians, 0.975)))
    enough = logs.size >= MIN_ROUNDS
    if enough and high < 1.0 - TIE:
        outcome = CLEAR
    elif enough and low > 1.0 + TIE:
        outcome = SLOWER
    elif final or (enough and low > 1.0 - TIE):
        outcome = TIED  # not clearly faster: within the band, or still unclear when the budget is spent
    else:
        outcome = UNDECIDED
    return PairedComparison(ratio, low, high, int(logs.size), outcome)


def paired_rounds(make_a: Callable[[], Any], make_b: Callable[[], Any], point: Any, repeats: int) -> tuple[list[float], list[float]]:
    """Two runners (from their factories) timed against each other on ``point``'s inputs: ``repeats`` round-robin rounds
    each (``validate.latency.time_runners``), ms per round, paired entry by entry; both runners closed after."""
    from attn_export.validate.latency import time_runners

    runners, rounds = {"a": make_a(), "b": make_b()}, {}  # type: ignore[var-annotated]
    try:
        time_runners(runners, point.feeds, warmup=1, repeats=repeats, batch=point.batch, rounds_ms=rounds)
    finally:
        for r in runners.values():
            r.deactivate()
    return rounds["a"], rounds["b"]
