"""What a finished run's report says beside its figures: stand-ins, unprofitable factorizations, untimed stages, and
where a stage passes on one judged data set but fails on another, with the likely cause."""

from __future__ import annotations

from attn_export.pipeline.plan import Plan
from attn_export.validate.latency import TimingResult
from attn_export.validate.report import Report, Stage

__all__ = ["run_notes"]


def _disagreement(plan: Plan, stage: Stage, source: str) -> list[str]:
    """Where a stage passes on the run's data but fails on a set judged beside it (or the reverse), and the likely cause."""
    from attn_export.compress.registry import Method

    out = []
    config = plan.step(stage.name).config
    cause = config.fitted() if isinstance(config, Method) else None
    figures = ("embedding", "logits")  # what the subject's users read: one of the two is there
    mine = next((stage.details[k]["mean_cosine"] for k in figures if stage.details.get(k)), float("nan"))
    for name, other in (stage.details.get("also_judged_on") or {}).items():
        if bool(other.get("passed")) == bool(stage.passed):
            continue
        theirs = next((other[k]["mean_cosine"] for k in figures if other.get(k)), float("nan"))
        verdict = ("passes", "fails") if stage.passed else ("fails", "passes")
        why = f"; likely cause: {cause}, which fits {source} and not {name}" if cause and stage.passed else (f"; likely cause: {cause}" if cause else "")
        out.append(f"{stage.name} {verdict[0]} on {source} (mean cosine {mine:.5f}) but {verdict[1]} on {name} ({theirs:.5f}: "
                   f"{'; '.join(other.get('violations') or []) or 'within its tolerance'}){why}")  # fmt: skip
    return out


def run_notes(plan: Plan, stages: dict[str, Stage], report: Report, timing: TimingResult) -> None:
    """The notes a finished plan's report carries: stand-ins, unprofitable factorizations, untimed stages, disagreements."""
    stand_ins = {s.details["runtime"]["stand_in"] for s in stages.values() if (s.details.get("runtime") or {}).get("stand_in")}
    for why in sorted(stand_ins):
        report.notes.append(f"stand-in: {plan.config.target} artifacts were validated on ONNX Runtime's CPUExecutionProvider: {why}")
    for stage in stages.values():
        prof = stage.details.get("profitability") or {}
        if prof.get("faster_than_dense") is False:
            report.notes.append(f"{stage.name} is slower than the dense model in ONNX Runtime ({prof['speedup_vs_dense_onnx']:.2f}x); "
                                "a lower --low-rank ratio or fewer --low-rank-targets may pay off")  # fmt: skip
        if stage.details.get("timing_failed"):
            report.notes.append(f"{stage.name} could not be timed: {stage.details['timing_failed']}")
        report.notes.extend(_disagreement(plan, stage, str(stage.details.get("judged_on") or "the report split")))
