"""Form first: the padded or the padding-free encoder, decided on the two fp32 graphs before any 8-bit route is built.

An ``--encoder-form auto`` run used to build every 8-bit route twice, padded and packed, and let
one selection time all of them: twice the build time for a decision the fp32 twins already make.
Removing padding saves the same work at every precision (the GEMMs run on real tokens only), so
the two fp32 graphs are timed against each other on the subject's real-text batches, in paired
round-robin rounds (``validate.paired``), and the 8-bit routes are built in the winning form only.
The padding-free form wins ties (it is the one that wins on real traffic); the padded one is kept
only when it is clearly faster (texts that fill ``--seq-len``). The losing fp32 twin is dropped too
when nothing remaining is built on it: timing and judging it again (a base-size model's padded graph
at the fixed (8, 128) shape: a second per call) would only confirm what was measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from attn_export.pipeline.plan import Plan
from attn_export.runtime.artifacts import Artifact
from attn_export.validate.paired import CLEAR, UNDECIDED, compare_rounds, paired_rounds

__all__ = ["FORM_ROUNDS", "decide_form", "form_first"]

FORM_ROUNDS = 5  # paired rounds per timing of the two fp32 graphs (each a pass over the real-text batches)
_MAX_TIMINGS = 4


def form_first(plan: Plan) -> str | None:
    """The packed fp32 stage after which the form is decided, or None when the plan has nothing to prune: one form, or
    stages besides the fp32 twins that are not candidates of a latency selection (a transform chain needs both)."""
    if "packed" not in plan.form_specs or len(plan.steps) < 3:
        return None
    base = plan.steps[0].name
    candidates = {c for sel in plan.selections if sel.criterion == "latency" and sel.key != "form" for c in sel.candidates}
    rest = [s.name for s in plan.steps if s.name not in (base, f"{base}-packed")]
    return f"{base}-packed" if rest and all(n in candidates for n in rest) else None


def decide_form(plan: Plan, known: Mapping[str, Artifact], subject: Any, say: Callable[[str], None]) -> list[str]:
    """Times the fp32 twins, then drops the losing form's stages from ``plan`` (recorded as skipped, with why): its 8-bit
    routes, and its fp32 graph when no remaining candidate is built on it. Returns the dropped stages (the caller
    forgets the losing fp32 graph it already built)."""
    base = plan.steps[0].name
    packed = f"{base}-packed"
    point = subject.timing_points(1, FORM_ROUNDS)[0]  # the real-text batches the selections are decided on
    padded_ms: list[float] = []
    packed_ms: list[float] = []
    for timing in range(_MAX_TIMINGS):
        more_padded, more_packed = paired_rounds(known[base].make_runner, known[packed].make_runner, point, FORM_ROUNDS)
        padded_ms, packed_ms = padded_ms + more_padded, packed_ms + more_packed
        duel = compare_rounds(padded_ms, packed_ms, final=timing == _MAX_TIMINGS - 1)
        if duel.outcome != UNDECIDED:
            break
    loser = "packed" if duel.outcome == CLEAR else "padded"
    drop = [s.name for s in plan.steps if s.form == loser and s.name not in (base, packed)]
    for sel in plan.selections:  # a selection the losing form alone feeds (a route built padded only) keeps its candidates
        if sel.key != "form" and sel.candidates and all(c in drop for c in sel.candidates):
            drop = [n for n in drop if n not in sel.candidates]
    if not any(plan.step(n).form == loser for sel in plan.selections if sel.key != "form" for n in sel.candidates if n not in drop):
        drop.append(packed if loser == "packed" else base)  # the losing fp32 twin too: measured, nothing built on it, never ships
    why = (f"encoder form decided on the fp32 graphs before the 8-bit routes: on {point.label} the padded graph takes "
           f"{duel.ratio:.3f}x the padding-free one's time (95% interval {duel.low:.3f}-{duel.high:.3f}, {duel.rounds} paired rounds: "
           f"{duel.outcome}), so the 8-bit routes are built {'padded' if loser == 'packed' else 'padding-free'} only and the other fp32 "
           "graph is neither timed again nor judged (the padding-free form wins ties: it is the one that wins on real traffic)")
    plan.steps[:] = [s for s in plan.steps if s.name not in drop]
    plan.selections[:] = [dataclasses.replace(sel, candidates=tuple(c for c in sel.candidates if c not in drop)) for sel in plan.selections]
    plan.skipped.update(dict.fromkeys(drop, why))
    plan.notes.append(why)
    plan.form_decision = {"padded_over_packed": duel.to_dict(), "built": "padded" if loser == "packed" else "packed", "dropped": drop}
    say(why)
    return drop
