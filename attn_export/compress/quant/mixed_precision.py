"""Accuracy-driven mixed precision for the static Q/DQ route: keep only what must stay float in float.

A fully int8 MiniLM loses most of its accuracy in a handful of GEMMs (the FFN2 input of
the first layers carries GELU outliers), and TensorRT runs any GEMM without Q/DQ in fp16
(fp32 on other runtimes) at some speed cost. So the route measures, and decides:

1. **Inventory** (``find_gemms``): every quantized GEMM of the Q/DQ graph, labelled by the
   module it came from (``layers.0.ffn_out``) and grouped as the issue's tuning units:
   Q/K/V (fused or not, low-rank factors included), attention output, FFN1, FFN2 of layer N.
2. **Sensitivity** (``sensitivity``): quantize one group at a time, everything else float,
   and measure the subject's own error (``Subject.select_error``: embedding cosine for an
   encoder, output error for a layer) on the first ``limit`` items of the select split.
   All variants run in *one* ONNX Runtime session of a switchable graph
   (``SwitchableGraph``): each group's activation and weight pass through ``Where(switch,
   DQ(Q(x)), x)``, with the switches a graph input, so no model is rebuilt per variant.
   Q/DQ run as written (``session.disable_quant_qdq``): TensorRT's arithmetic.
3. **Fallback** (``fallback_search``): from all-int8, move the most sensitive group to
   float, one at a time, and judge on the whole select split; stop as soon as the goal is
   met (``auto``), or move exactly N groups (``--int8-fallback N``). ``none`` skips 2 and 3.
4. **Result** (``FloatFallbackPass``): the chosen groups lose their Q/DQ (activation read in
   float, weight back to its float initializer); everything else keeps TensorRT's rules
   (symmetric, zero point 0, per-channel weights; Softmax/LayerNorm/mask Add float).

The report gets every GEMM's precision, its sensitivity, the fallback chosen, and the
measured latency cost of the fallback (``MixedPrecisionResult.to_dict``).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import onnx_ir as ir

from attn_export.compress.quant.gemm_groups import Gemm, SwitchableGraph, apply_fallback
from attn_export.errors import ConfigError
from attn_export.runtime.base import Feed, Runner

__all__ = ["FallbackGoal", "FallbackTrial", "GroupSensitivity", "MixedPrecisionResult", "dynamic_fallback", "fallback_search", "gemm_table", "mixed_precision_",
           "sensitivity", "time_fallback"]

log = logging.getLogger(__name__)

WIDE_BATCH = 64  # texts per batch when the dynamic route's fallback judges: the pessimistic side of per-batch ranges



# -- the goal ----------------------------------------------------------------------------
@dataclass(frozen=True)
class FallbackGoal:
    """What the fallback must reach on the select split, beyond the stage's own tolerance.

    ``embedding`` applies to subjects judged by sentence embeddings: the 8-bit goal of the
    tolerance table (``validate.tolerances``, issue 11's static acceptance); the subject picks
    it (``Subject.fallback_goal``). Without it the stage's tolerance alone decides.
    """

    embedding: Any = None  # validate.tolerances.EmbeddingTolerance | None

    def violations(self, judgement: Any) -> list[str]:
        """The stage's own violations, the 8-bit goal's, and those of every data set judged beside the select split (the
        twins of long texts and the shipped corpus, held to the stage's bar): the selection requires them all, so the
        fallback keeps GEMMs in float until they pass too."""
        out = list(judgement.violations)
        emb = judgement.details.get("embedding")
        if emb and self.embedding is not None:
            out.extend(v for v in self.embedding.violations(emb, 0.0) if v not in out)
        for name, beside in (judgement.details.get("also_judged_on") or {}).items():
            out.extend(f"{name}: {v}" for v in beside.get("violations") or [])
        return out

    def to_dict(self) -> dict[str, Any]:
        return self.embedding.to_dict() if self.embedding is not None else {}


# -- sensitivity and fallback ------------------------------------------------------------
@dataclass
class GroupSensitivity:
    group: str
    error: float  # the subject's quick error with only this group in int8
    gemms: list[str] = field(default_factory=list)  # module labels
    macs_per_token: int = 0


def sensitivity(subject: Any, graph: SwitchableGraph, limit: int, say: Callable[[str], None] | None = None) -> list[GroupSensitivity]:
    """Each group quantized alone, the rest float: the subject's error on ``limit`` items of the select split, most sensitive first."""
    out = []
    for group in graph.groups:
        members = [g for g in graph.gemms if g.group == group]
        err = float(subject.select_error(graph.runner({group}), limit))
        out.append(GroupSensitivity(group, err, [g.label for g in members], sum(g.macs_per_token for g in members)))
    out.sort(key=lambda s: s.error, reverse=True)
    if say:
        say("int8 sensitivity (error with one group int8): " + ", ".join(f"{s.group} {s.error:.2e}" for s in out[:5]) + (", ..." if len(out) > 5 else ""))
    return out


@dataclass
class FallbackTrial:
    """The select-split judgement with ``float_groups`` kept in float."""

    float_groups: list[str]
    headline: str
    met: bool
    shortfall: list[str] = field(default_factory=list)


def fallback_search(
    subject: Any, graph: SwitchableGraph, ranking: Sequence[str], tolerance_key: str, goal: FallbackGoal, mode: str | int,
    say: Callable[[str], None] | None = None, batch: int | None = None,
) -> tuple[list[str], list[FallbackTrial]]:  # fmt: skip
    """Float groups, most sensitive first, until the goal is met on the select split (``auto``) or N of them.

    Returns the groups kept in float and every judged step. ``auto`` stops at the first
    step that meets the goal; when none does, every group but the least sensitive ends in
    float (an all-float model is not an int8 route) and the last step says by how much the
    goal was missed. A fixed N that would leave no int8 GEMM is refused. ``batch``: texts per judged batch
    (the subject's own when None).
    """
    if isinstance(mode, int):
        if mode >= len(ranking):
            raise ConfigError(f"--int8-fallback {mode} would keep all {len(ranking)} GEMM groups in float, which leaves no int8 GEMM; "
                              f"use auto or N < {len(ranking)}")  # fmt: skip
        chosen = list(ranking[:mode])
        j = subject.judge(graph.runner(set(graph.groups) - set(chosen)), "select", tolerance_key, batch)
        missed = goal.violations(j)
        return chosen, [FallbackTrial(chosen, j.headline(), not missed, missed)]
    steps: list[FallbackTrial] = []
    for k in range(len(ranking)):  # at least one group stays int8: an all-float model is not an int8 route
        chosen = list(ranking[:k])
        j = subject.judge(graph.runner(set(graph.groups) - set(chosen)), "select", tolerance_key, batch)
        missed = goal.violations(j)
        steps.append(FallbackTrial(chosen, j.headline(), not missed, missed))
        if say:
            say(f"int8 fallback, {k} group(s) in float{' (' + chosen[-1] + ')' if chosen else ''}: {j.headline()}"
                + ("" if missed else " - goal met"))  # fmt: skip
        if not missed:
            return chosen, steps
    return list(ranking[: max(0, len(ranking) - 1)]), steps


# -- what the report shows ---------------------------------------------------------------
@dataclass
class MixedPrecisionResult:
    """Per GEMM: precision, sensitivity; the fallback chosen, its steps and its latency cost."""

    mode: str
    goal: dict[str, Any]
    float_precision: str  # what a float GEMM runs in on the target: fp16 (TensorRT) or fp32
    quant_precision: str = "int8"  # what the Q/DQ GEMMs run in: int8, or fp8 (compress/fp8.py)
    gemms: list[dict[str, Any]] = field(default_factory=list)
    float_groups: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    sensitivity_items: int = 0
    latency_ms_all_int8: float | None = None
    latency_ms_mixed: float | None = None
    latency_note: str = ""
    met: bool | None = None

    @property
    def n_float(self) -> int:
        return sum(1 for g in self.gemms if g["precision"] != self.quant_precision)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gemms_in_float"] = self.n_float
        d["gemms_total"] = len(self.gemms)
        if self.latency_ms_all_int8 and self.latency_ms_mixed:
            d["latency_cost"] = self.latency_ms_mixed / self.latency_ms_all_int8 - 1.0
        return d

    def describe(self) -> str:
        what = f"{self.n_float}/{len(self.gemms)} GEMMs kept in {self.float_precision}"
        if self.float_groups:
            what += f" ({', '.join(self.float_groups)})"
        cost = ""
        if self.latency_ms_all_int8 and self.latency_ms_mixed:
            cost = f", latency {self.latency_ms_all_int8:.1f} -> {self.latency_ms_mixed:.1f} ms ({100 * (self.latency_ms_mixed / self.latency_ms_all_int8 - 1):+.1f}%)"
        goal = "" if self.met is None else ("; goal met on the select split" if self.met else "; goal NOT met on the select split")
        if not self.gemms:  # the all-8-bit model met the goal at once: nothing was ranked
            what = f"every GEMM in {self.quant_precision}"
        return f"{self.quant_precision} fallback {self.mode}: {what}{cost}{goal}"


def gemm_table(gemms: Sequence[Gemm], ranking: Sequence[GroupSensitivity], float_groups: Sequence[str], float_precision: str,
               cost_ms: float | None, quant_precision: str = "int8") -> list[dict[str, Any]]:  # fmt: skip
    """One row per GEMM: label, group, precision, sensitivity of its group, estimated latency cost of its fallback."""
    sens = {s.group: s.error for s in ranking}
    rank = {s.group: i + 1 for i, s in enumerate(ranking)}
    floated = set(float_groups)
    float_macs = sum(g.macs_per_token for g in gemms if g.group in floated)
    rows = []
    for g in gemms:
        row: dict[str, Any] = {"gemm": g.label, "node": g.node, "group": g.group, "precision": float_precision if g.group in floated else quant_precision,
                               "macs_per_token": g.macs_per_token, "sensitivity": sens.get(g.group), "rank": rank.get(g.group)}  # fmt: skip
        if g.group in floated and cost_ms is not None and float_macs:
            row["latency_cost_ms"] = cost_ms * g.macs_per_token / float_macs  # the measured total, shared by MACs
        rows.append(row)
    return rows


def time_fallback(all_int8: Path, mixed: Path, feed: Feed, threads: int, qdq_fusion: bool, u8u8: bool, repeats: int = 10) -> tuple[float, float]:
    """p50 ms of the all-int8 and the mixed model, round-robin in one process (ONNX Runtime CPU)."""
    from attn_export.runtime import OrtRunner, SessionFromOnnx
    from attn_export.validate.latency import time_runners

    runners = {name: OrtRunner(SessionFromOnnx(p, providers=["cpu"], intra_op_threads=threads, qdq_fusion=qdq_fusion, u8u8=u8u8), name=name)
               for name, p in (("all-int8", all_int8), ("mixed", mixed))}  # fmt: skip
    try:
        lat = time_runners(runners, feed, warmup=2, repeats=repeats)
    finally:
        for r in runners.values():
            r.deactivate()
    return lat["all-int8"].p50, lat["mixed"].p50


def _all_int8_trial(subject: Any, graph: SwitchableGraph, tolerance_key: str, goal: FallbackGoal) -> FallbackTrial:
    """The all-8-bit model judged on the select split (the first step of an ``auto`` search)."""
    j = subject.judge(graph.runner(set(graph.groups)), "select", tolerance_key)
    missed = goal.violations(j)
    return FallbackTrial([], j.headline(), not missed, missed)


def mixed_precision_(
    qdq_path: Path, float_path: Path, out_path: Path, subject: Any, tolerance_key: str, goal: FallbackGoal, mode: str | int,
    float_precision: str, limit: int, threads: int, timing: dict[str, Any] | None = None, say: Callable[[str], None] | None = None,
    quant_precision: str = "int8",
) -> MixedPrecisionResult:  # fmt: skip
    """Sensitivity, fallback and the final graph: ``qdq_path`` (all int8) -> ``out_path`` (mixed).

    ``float_path`` is the float graph the Q/DQ were placed on; ``timing`` (feed, qdq_fusion,
    u8u8, repeats) measures the all-int8 and the mixed model side by side when any GEMM moved.
    """
    say = say or (lambda _m: None)
    float_model = ir.load(os.fspath(float_path))
    with tempfile.TemporaryDirectory(prefix="attn_export_mp_") as tmp:
        graph = SwitchableGraph(ir.load(os.fspath(qdq_path)), float_model, threads, Path(tmp))
        try:
            ranking, float_groups, steps = [], [], [_all_int8_trial(subject, graph, tolerance_key, goal)] if mode == "auto" else []
            if steps and steps[0].met:  # time to ship: most models meet the goal all-int8, and nothing needs ranking
                say(f"int8 fallback, every GEMM int8: {steps[0].headline} - goal met; nothing ranked")
            else:
                ranking = sensitivity(subject, graph, limit, say=say)
                float_groups, steps = fallback_search(subject, graph, [r.group for r in ranking], tolerance_key, goal, mode, say)
        finally:
            graph.close()
        moved = apply_fallback(qdq_path, float_model, float_groups, out_path)
    result = MixedPrecisionResult(
        mode=str(mode), goal={"tolerance": tolerance_key, **goal.to_dict()}, float_precision=float_precision, quant_precision=quant_precision,
        float_groups=list(float_groups),
        steps=[asdict(s) for s in steps], sensitivity_items=limit, met=steps[-1].met if steps else None,
    )  # fmt: skip
    if moved and timing is not None:
        result.latency_ms_all_int8, result.latency_ms_mixed = time_fallback(qdq_path, out_path, timing["feed"], threads, timing["qdq_fusion"],
                                                                              timing["u8u8"], timing.get("repeats", 10))  # fmt: skip
        result.latency_note = ("measured on ONNX Runtime CPU in this process (fp32 GEMMs); TensorRT runs the float GEMMs in fp16, "
                               "so its cost is smaller") if float_precision == "fp16" else "measured on ONNX Runtime CPU in this process"  # fmt: skip
    cost = None if result.latency_ms_all_int8 is None else result.latency_ms_mixed - result.latency_ms_all_int8  # type: ignore[operator]
    result.gemms = gemm_table(graph.gemms, ranking, float_groups, float_precision, cost, quant_precision)
    say(result.describe())
    return result


def dynamic_fallback(
    float_graph: Path, all_int8: Path, subject: Any, tolerance_key: str, goal: FallbackGoal, mode: str | int, limit: int, threads: int,
    runner_for: Callable[[Path], Runner], say: Callable[[str], None] | None = None, per_token: bool = False,
) -> tuple[list[str], MixedPrecisionResult]:  # fmt: skip
    """The dynamic route's fallback: the MatMul nodes to keep in float, and what the report shows.

    ``float_graph`` is the graph ``quantize_dynamic`` read and ``all_int8`` its result. Under
    ``auto`` the all-int8 model is judged first on the select split, on the runtime that
    ships it (``runner_for``): most models meet the goal there, and nothing is ranked. Else
    the GEMMs are ranked and moved to float on the dynamic route's Q/DQ view
    (``dynamic_groups``), as the static route does on its own graph.

    Every judgement reads the select split in batches of ``WIDE_BATCH``: dynamic int8 takes one
    activation range per tensor per batch, so a text's error grows with the widest activation of
    its batch mates (all-mpnet-base-v2 measured: min cosine 0.992 alone, 0.953 in a batch of 8,
    0.959 in 32). A goal met in wide batches holds in the narrower ones a service sends.
    ``per_token``: ``all_int8`` is the per-token route's model, ranked on its own per-row view.
    """
    from attn_export.compress.quant.dynamic_groups import dynamic_qdq_model

    say = say or (lambda _m: None)
    result = MixedPrecisionResult(mode=str(mode), goal={"tolerance": tolerance_key, **goal.to_dict()}, float_precision="fp32",
                                  sensitivity_items=limit)  # fmt: skip
    if mode == "auto":
        runner = runner_for(all_int8)
        try:
            judged = subject.judge(runner, "select", tolerance_key, WIDE_BATCH)
        finally:
            runner.deactivate()
        missed = goal.violations(judged)
        if not missed:
            result.steps, result.met = [asdict(FallbackTrial([], judged.headline(), True))], True
            say(result.describe())
            return [], result
        say(f"int8 dynamic, every GEMM int8: {judged.headline()}; goal missed ({'; '.join(missed)}): ranking the GEMMs")
    float_model = ir.load(os.fspath(float_graph))
    view = dynamic_qdq_model(float_model, ir.load(os.fspath(all_int8)), per_token=per_token)
    with tempfile.TemporaryDirectory(prefix="attn_export_dmp_") as tmp:
        graph = SwitchableGraph(view, float_model, threads, Path(tmp))
        try:
            ranking = sensitivity(subject, graph, limit, say=say)
            float_groups, steps = fallback_search(subject, graph, [r.group for r in ranking], tolerance_key, goal, mode, say, WIDE_BATCH)
        finally:
            graph.close()
    result.float_groups, result.steps = list(float_groups), [asdict(s) for s in steps]
    result.met = steps[-1].met if steps else None
    result.gemms = gemm_table(graph.gemms, ranking, float_groups, "fp32", None)
    result.latency_note = "not timed here: the shipped model's latency is the stage's own, timed side by side with the others"
    say(result.describe())
    return [g.node for g in graph.gemms if g.group in set(float_groups)], result
