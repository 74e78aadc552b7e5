"""The runner's last phases for one plan: select the 8-bit route, then deploy what the run ships.

Selection (``select.select_route``) reads only the select side (the select split and the twins of
the sets judged beside the report split, which it requires too); deployment takes the ONNX
model the plan names (the selected route, the distilled student or the plain export) through
the TensorRT check, the engine build, the Jetson bundle and the Triton repository
(``deploy.steps``). Both work for every subject through the ``Subject`` interface.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attn_export.pipeline.plan import Plan
from attn_export.runtime.artifacts import Artifact
from attn_export.validate.report import Report, Stage
from attn_export.vocab.precisions import PRECISIONS

if TYPE_CHECKING:
    from attn_export.pipeline.select import MoreRounds
    from attn_export.subjects.base import Judgement, Subject
    from attn_export.validate.latency import TimingPoint

__all__ = ["ACCEPT_MISMATCH_FLAG", "deploy", "planned_gemms", "select"]

log = logging.getLogger(__name__)


def select(plan: Plan, stages: Mapping[str, Stage], select_j: Mapping[str, Judgement], artifacts: Mapping[str, Artifact], report: Report,
           say: Callable[[str], None], rounds: Mapping[str, list[float]] | None = None, point: TimingPoint | None = None,
           ) -> dict[str, Path]:  # fmt: skip
    """Each selection of ``plan``: the fastest candidate meeting its tolerance on the select split (and on every set judged
    beside it, when one does), copied to its file. ``rounds``: each stage's time per round-robin round on the deciding
    input (paired: ``pipeline.select``); two whose comparison is undecided are timed again on ``point``, that input."""
    from attn_export.outdir.atomic import atomic_path
    from attn_export.pipeline.select import Candidate, select_most_accurate, select_route
    from attn_export.validate.batch_invariance import BatchInvariance

    chosen_paths: dict[str, Path] = {}
    for sel in plan.selections:
        cands = []
        for name in sel.candidates:
            j, art, lat = select_j[name], artifacts[name], stages[name].latency_ms.get("artifact")
            p50 = lat.p50 if lat is not None else float("inf")
            missed = tuple(f"{data} ({'; '.join(o.get('violations') or []) or 'below its bar'})"
                           for data, o in (j.details.get("also_judged_on") or {}).items() if not o.get("passed"))  # fmt: skip
            cands.append(Candidate(name, art.route or name, p50, j.passed, float(j.score), "; ".join(j.violations), art.precision, missed,
                                   tuple((rounds or {}).get(name) or ()), plan.step(name).form if len(plan.form_specs) else ""))  # fmt: skip
        result = select_most_accurate(cands, sel.preference, sel.precisions) if sel.criterion == "accuracy" else \
            select_route(cands, sel.preference, sel.band, None if point is None else _more_rounds(artifacts, point))
        entry: dict[str, Any] = {"route": None, "reason": result.reason, "tried": result.tried, "preference": list(sel.preference), "band": sel.band,
                                 "criterion": sel.criterion, "decided_on": report.inputs.get("selection_data"),
                                 "ships": plan.deploy_source == f"select:{sel.key}"}  # fmt: skip  # the headline names what the plan deploys
        if sel.why:
            entry["why_these"] = sel.why
        if result.margins:
            entry["margin"] = result.margins
        if plan.form_decision and (sel.key == "form" or any(plan.step(c).form for c in sel.candidates)):
            entry["decided_before_8bit"] = plan.form_decision  # the margin that chose the encoder form of what ships
        if result.chosen is None:
            report.notes.append(f"no {sel.key} route selected: {result.reason}")
            if result.best_failing is not None:
                entry["best"] = result.best_failing.stage
            report.selection[sel.key] = entry
            report.verdict.setdefault("failures", []).append(f"selection {sel.key}: {result.reason}")
            continue
        final = plan.out / sel.filename.format(precision=artifacts[result.chosen.stage].precision)
        with atomic_path(final) as tmp:
            shutil.copyfile(artifacts[result.chosen.stage].path, tmp)  # type: ignore[arg-type]
        chosen = stages[result.chosen.stage]
        entry.update(route=result.chosen.route, stage=chosen.name, artifact=str(final), precision=artifacts[result.chosen.stage].precision)
        report.selection[sel.key] = entry
        say(f"selected {chosen.name} as {final.name}: {result.reason}")
        report.notes.append(f"selected {chosen.name} as {final.name}: {result.reason}")
        moved = chosen.details.get("batch_invariance") or {}
        if moved and not moved.get("passed"):  # batch-invariant on the select split, not on the report split: what ships moves
            report.verdict.setdefault("failures", []).append(f"{chosen.name} on the report split: {BatchInvariance.from_dict(moved).violation()}")
        if chosen.passed is False:
            report.verdict.setdefault("failures", []).append(
                f"{chosen.name} met its tolerance on the select split but not on the report split: {'; '.join(chosen.details.get('violations') or [])}"
            )
        chosen_paths[sel.key] = final
    return chosen_paths


EXTRA_ROUNDS = 6  # paired rounds per extra timing of two candidates whose comparison is undecided


def _more_rounds(arts: Mapping[str, Artifact], point: TimingPoint) -> MoreRounds:
    """Times two candidates again, interleaved on the deciding input, for a selection still undecided between them."""
    from attn_export.validate.paired import paired_rounds

    def more(a: str, b: str) -> tuple[list[float], list[float]]:
        return paired_rounds(arts[a].make_runner, arts[b].make_runner, point, EXTRA_ROUNDS)

    return more


def deploy(plan: Plan, subject: Subject, artifacts: Mapping[str, Artifact], chosen: Mapping[str, Path], report: Report,
           points: list[TimingPoint], say: Callable[[str], None]) -> None:  # fmt: skip
    """The plan's deploy steps on the ONNX model it ships (an engine is timed on ``points[0]``, as the artifacts were)."""
    from attn_export.deploy import steps as deploy_steps

    if not plan.deploy:
        return
    cfg = plan.config
    if plan.deploy_source.startswith("select:"):
        onnx = chosen.get(plan.deploy_source.split(":", 1)[1])
        if onnx is None:
            report.notes.append("nothing deployed: no 8-bit route was selected")
            return
    else:
        onnx = artifacts[plan.deploy_source].path  # type: ignore[assignment]
    shipped = next((e.get("precision") for e in report.selection.values() if isinstance(e, dict) and e.get("artifact") == str(onnx)), None)
    target, spec = cfg.target_info, cfg.engine_spec(plan.engine_precision(shipped))
    graph_precision = plan.graph_precision(shipped)
    deployed: dict[str, Any] = {"onnx": str(onnx)}
    report.selection["deploy"] = deployed
    engine_path: Path | None = None
    for step in plan.deploy:
        if step.kind == "trt-check":
            deployed["trt_check"] = deploy_steps.check_for_target(onnx, target, spec, cfg.resolved_trt_version, report.notes, say)
        elif step.kind == "engine":
            engine_path = _build_engine(onnx, spec, subject, report, points, say, cfg.accept_engine_mismatch)
        elif step.kind == "bundle":
            folder, gemms = Path(cfg.bundle), planned_gemms(onnx, spec.precision)  # type: ignore[arg-type]
            bundle = deploy_steps.write_bundle(subject, onnx, folder, spec, graph_precision,
                                               cfg.resolved_trt_version, say, gemms)  # type: ignore[arg-type]
            deployed["jetson_bundle"] = str(bundle)
        elif step.kind == "session-options":
            deployed["session_options"] = deploy_steps.session_options_for(onnx, target, spec, say)
        elif step.kind == "triton":
            deployed["triton_repo"] = str(deploy_steps.write_triton(onnx, Path(cfg.triton), spec, engine_path, subject.deploy_name, say,
                                                                                cfg.triton_config))  # type: ignore[arg-type]


def planned_gemms(onnx: Path, precision: str) -> tuple[Any, ...]:
    """Every GEMM of ``onnx`` with a constant weight and the precision the plan placed it in: a Q/DQ GEMM the 8-bit
    ``precision``, any other ``"float"`` (the build resolves it: ``runtime.tensorrt.build.engine_expectation``)."""
    import onnx_ir as ir

    from attn_export.compress.quant.gemm_groups import find_gemms, gemm_label, group_of
    from attn_export.runtime.tensorrt.attest import PlannedGemm

    model = ir.load(str(onnx))
    quantized = {g.node: g for g in find_gemms(model)}
    out = []
    for node in model.graph:
        if node.name in quantized:
            out.append(PlannedGemm(node.name, quantized[node.name].group, precision))
        elif node.op_type in ("MatMul", "Gemm") and len(node.inputs) > 1 and node.inputs[1] is not None and node.inputs[1].const_value is not None:
            out.append(PlannedGemm(node.name, group_of(gemm_label(node)), "float"))
    return tuple(out)


ACCEPT_MISMATCH_FLAG = "--accept-engine-mismatch"


def _attestation(result: Any, allow: bool, name: str, report: Report) -> dict[str, Any]:
    """The engine's attestation for its stage; each violation fails the run in one line naming the layer, unless ``allow``."""
    from attn_export.runtime.tensorrt.attest import Attestation

    att = Attestation.from_dict(result.attestation)
    if att.violations and allow:
        att.allowed_by = ACCEPT_MISMATCH_FLAG
        report.verdict["accept_engine_mismatch"] = True  # recorded, as --accept-partial is
        report.notes.extend(f"{name} attestation: {v} (accepted by {ACCEPT_MISMATCH_FLAG})" for v in att.violations)
    elif att.violations:
        report.verdict.setdefault("failures", []).extend(f"{name} attestation: {v} ({ACCEPT_MISMATCH_FLAG} keeps it)" for v in att.violations)
    return att.to_dict()


def _build_engine(onnx: Path, spec: Any, subject: Subject, report: Report, points: list[TimingPoint], say: Callable[[str], None],
                  accept_mismatch: bool = False) -> Path:  # fmt: skip
    """Build with the TensorRT Python API, attest the engine from its inspector, then judge and time it like any artifact."""
    from attn_export.runtime.tensorrt import EngineFromPath, TrtRunner, build_engine
    from attn_export.validate.latency import time_pass

    engine_path = onnx.with_suffix(".engine")
    say(f"building TensorRT engine {engine_path.name} ({spec.precision})")
    result = build_engine(onnx, engine_path, spec, gemms=planned_gemms(onnx, spec.precision))
    name = f"trt-{spec.precision}"
    attestation = _attestation(result, accept_mismatch, name, report)
    report.notes.extend(w for w in result.warnings if w not in attestation["violations"])
    runner = TrtRunner(EngineFromPath(engine_path))
    # an fp32 engine may run its GEMMs in TF32 (TensorRT's default on Ampere and later): judged at fp16's bar
    key = PRECISIONS["fp16" if spec.precision == "fp32" else spec.precision].tolerance_key
    judgement = subject.judge(runner, "report", key)
    timing = time_pass({"eager": subject.eager_runner, name: lambda: runner}, points[:1])
    lat = timing.latency.get(points[0].label, {})
    eager, mine = lat.get("eager"), lat.get(name)
    stage = Stage(name=name, artifact=str(engine_path), precision=spec.precision, accuracy=judgement.accuracy,
                  latency_ms={"artifact": mine, "eager": eager} if mine and eager else {},
                  speedup_vs_eager=eager.p50 / mine.p50 if mine and eager and mine.p50 > 0 else None, size_bytes=result.size_bytes,
                  passed=judgement.passed, tolerance=judgement.tolerance,
                  details={"engine": result.to_dict(), "attestation": attestation, **judgement.details, "violations": judgement.violations})  # fmt: skip
    report.add(stage)
    if not stage.passed:
        report.verdict.setdefault("failures", []).append(f"{name}: {'; '.join(judgement.violations)}")
    return engine_path
