"""The stage runner: build the plan, time everything side by side, judge, select, deploy, report.

One runner serves every command (the main command for layers and checkpoints, ``encoder``,
``sweep`` and ``bench``'s builds), in five phases:

1. **build** every step of the plan (exports through the subject, compression through the
   method registry), in order, each from its source artifact;
2. **time** eager and every artifact in *one* round-robin pass on the same input, so machine
   noise hits them alike and every ``speedup_vs_eager`` comes from the same eager samples;
3. **judge** every artifact on the report split, and selection candidates also on the
   select split;
4. **select** (int8 route -> ``model.int8.onnx``), then **deploy** (TensorRT check, engine,
   Jetson bundle, Triton repository);
5. **report**: ``report.json``, then ``report.md``/``report.html``.

Process state (threads, denormal flushing) is set by ``attn_export.process`` for the whole
run, the same for eager and ONNX Runtime, and recorded in the report.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attn_export.artifacts import Artifact
from attn_export.errors import ConfigError
from attn_export.plan import ExportStep, Plan, Step, make_plan
from attn_export.validate.report import Latency, Report, Stage

__all__ = ["RunResult", "build_artifacts", "judge_artifacts", "run", "time_side_by_side"]

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass
class RunResult:
    """The report, the plan it came from, and whether the run met every required tolerance."""

    report: Report
    plan: Plan
    artifacts: dict[str, Artifact] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.report.verdict.get("passed", False))

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


# -- build -------------------------------------------------------------------------------
def _export(step: Step, ctx: Any, known: dict[str, Artifact]) -> Artifact:
    """Export the subject (or, for ``source`` != "subject", a built artifact's module) to ONNX."""
    export: ExportStep = step.config
    module = ctx.subject.module if step.source == "subject" else known[step.source].module
    path = ctx.out / step.filename
    ctx.say(f"exporting {path.name} ({export.spec.attention}, {export.precision}, opset {export.spec.resolved_opset})")
    result = ctx.subject.export(module, path, export.spec)
    ctx.say(f"exported: {result.describe()}")
    key = export.precision if step.source == "subject" else known[step.source].tolerance_key
    return ctx.onnx_artifact(
        step.name, path, export.precision, key, module=module,
        onnx_fp32=path if export.precision == "fp32" else None, params=ctx.subject.params(module), details={"export": result.to_dict()},
    )  # fmt: skip


def build_artifacts(plan: Plan, ctx: Any, prebuilt: dict[str, Artifact] | None = None) -> dict[str, Artifact]:
    """Build every step of ``plan`` in order (sources may be ``prebuilt``); returns stage name -> artifact."""
    from attn_export.compress.registry import compress

    built: dict[str, Artifact] = {}
    known = dict(prebuilt or {})
    for step in plan.steps:
        if isinstance(step.config, ExportStep):
            if step.source != "subject" and step.source not in known:
                raise ConfigError(f"plan step {step.name} exports {step.source!r}, which is not built before it")
            built[step.name] = known[step.name] = _export(step, ctx, known)
            continue
        if step.source not in known:
            raise ConfigError(f"plan step {step.name} starts from {step.source!r}, which is not built before it")
        built[step.name] = known[step.name] = compress(step.config, ctx, known[step.source], step.name, step.filename)
    return built


# -- time --------------------------------------------------------------------------------
def time_side_by_side(eager: Any, artifacts: dict[str, Artifact], feed: Any, warmup: int, repeats: int, batch: int) -> tuple[dict[str, Latency], dict[str, Any]]:
    """One round-robin pass over eager and every artifact on ``feed``; returns name -> Latency, and the live runners."""
    from attn_export.validate.latency import time_runners

    runners: dict[str, Any] = {"eager": eager}
    for name, art in artifacts.items():
        runners[name] = art.make_runner()
    return time_runners(runners, feed, warmup=warmup, repeats=repeats, batch=batch), runners


# -- judge -------------------------------------------------------------------------------
def judge_artifacts(subject: Any, artifacts: dict[str, Artifact], runners: dict[str, Any], candidates: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Judge every artifact on the report split, and ``candidates`` also on the select split."""
    report_j, select_j = {}, {}
    for name, art in artifacts.items():
        report_j[name] = subject.judge(runners[name], "report", art.tolerance_key)
        if name in candidates:
            select_j[name] = subject.judge(runners[name], "select", art.tolerance_key)
    return report_j, select_j


def _stage(art: Artifact, judgement: Any, lat: dict[str, Latency]) -> Stage:
    eager, mine = lat["eager"], lat[art.name]
    stage = Stage(
        name=art.name, artifact=None if art.path is None else str(art.path), precision=art.precision, accuracy=judgement.accuracy,
        latency_ms={"artifact": mine, "eager": eager}, speedup_vs_eager=eager.p50 / mine.p50 if mine.p50 > 0 else None,
        size_bytes=art.size_bytes, params=art.params, passed=judgement.passed, tolerance=judgement.tolerance,
        details={**art.details, **judgement.details, "violations": judgement.violations},
    )  # fmt: skip
    if art.label:
        stage.details["label"] = art.label
    return stage


def _profitability(stage: Stage, dense: Stage | None) -> None:
    """A factorized model is only worth shipping when it is faster than the dense one."""
    from attn_export.compress import factorization_is_profitable

    layers = ((stage.details.get("low_rank") or {}).get("layers")) or {}
    flop_ok = all(factorization_is_profitable(v["m"], v["n"], v["rank"]) for v in layers.values() if isinstance(v, dict) and "rank" in v)
    info: dict[str, Any] = {"fewer_flops": flop_ok}
    if dense is not None:
        ratio = dense.latency_ms["artifact"].p50 / stage.latency_ms["artifact"].p50
        info["speedup_vs_dense_onnx"] = ratio
        info["faster_than_dense"] = ratio > 1.0
    stage.details["profitability"] = info


# -- select ------------------------------------------------------------------------------
def _select(plan: Plan, stages: dict[str, Stage], select_j: dict[str, Any], artifacts: dict[str, Artifact], report: Report, out: Path, say: Progress) -> dict[str, Path]:
    from attn_export._atomic import atomic_path
    from attn_export.select import Candidate, select_route

    chosen_paths: dict[str, Path] = {}
    for sel in plan.selections:
        cands = []
        for name in sel.candidates:
            j, art = select_j[name], artifacts[name]
            emb = j.details.get("embedding")
            headline = emb["mean_cosine"] if emb else j.accuracy.cosine
            cands.append(Candidate(name, art.route or name, stages[name].latency_ms["artifact"].p50, j.passed, float(headline), "; ".join(j.violations)))
        result = select_route(cands, sel.preference, sel.band)
        entry: dict[str, Any] = {"route": None, "reason": result.reason, "tried": result.tried, "preference": list(sel.preference), "band": sel.band}
        if result.chosen is None:
            report.notes.append(f"no {sel.key} route selected: {result.reason}")
            if result.best_failing is not None:
                entry["best"] = result.best_failing.stage
            report.selection[sel.key] = entry
            report.verdict.setdefault("failures", []).append(f"selection {sel.key}: {result.reason}")
            continue
        final = out / sel.filename
        with atomic_path(final) as tmp:
            shutil.copyfile(artifacts[result.chosen.stage].path, tmp)  # type: ignore[arg-type]
        chosen = stages[result.chosen.stage]
        entry.update(route=result.chosen.route, stage=chosen.name, artifact=str(final))
        report.selection[sel.key] = entry
        say(f"selected {chosen.name} as {final.name}: {result.reason}")
        report.notes.append(f"selected {chosen.name} as {final.name}: {result.reason}")
        if chosen.passed is False:
            report.verdict.setdefault("failures", []).append(
                f"{chosen.name} met its tolerance on the select split but not on the report split: {'; '.join(chosen.details.get('violations') or [])}"
            )
        chosen_paths[sel.key] = final
    return chosen_paths


# -- deploy ------------------------------------------------------------------------------
def _deploy(cfg: Any, plan: Plan, subject: Any, artifacts: dict[str, Artifact], chosen: dict[str, Path], report: Report, ctx: Any, say: Progress) -> None:
    from attn_export.deploy import steps as deploy

    if not plan.deploy:
        return
    if plan.deploy_source.startswith("select:"):
        onnx = chosen.get(plan.deploy_source.split(":", 1)[1])
        if onnx is None:
            report.notes.append("nothing deployed: no int8 route was selected")
            return
    else:
        onnx = artifacts[plan.deploy_source].path  # type: ignore[assignment]
    target = cfg.target_info
    spec = cfg.engine_spec()
    deployed: dict[str, Any] = {"onnx": str(onnx)}
    report.selection["deploy"] = deployed
    engine_path: Path | None = None
    for step in plan.deploy:
        if step.kind == "trt-check":
            deployed["trt_check"] = deploy.check_for_target(onnx, target, spec, cfg.resolved_trt_version, report.notes, say)
        elif step.kind == "engine":
            engine_path = _build_engine(onnx, spec, subject, report, ctx, say)
        elif step.kind == "bundle":
            deployed["jetson_bundle"] = str(deploy.write_bundle(subject, onnx, Path(cfg.bundle), spec, plan.deploy_precision, cfg.resolved_trt_version, say))
        elif step.kind == "triton":
            name = "attn" if subject.kind == "layer" else "encoder"
            deployed["triton_repo"] = str(deploy.write_triton(onnx, Path(cfg.triton), spec, engine_path, name, say))


def _build_engine(onnx: Path, spec: Any, subject: Any, report: Report, ctx: Any, say: Progress) -> Path:
    """Build with the TensorRT Python API, then judge and time the engine like any artifact."""
    from attn_export.runtime.tensorrt import EngineFromPath, TrtRunner, build_engine
    from attn_export.validate.latency import time_runners

    engine_path = onnx.with_suffix(".engine")
    say(f"building TensorRT engine {engine_path.name} ({spec.precision})")
    result = build_engine(onnx, engine_path, spec)
    report.notes.extend(result.warnings)
    name = f"trt-{spec.precision}"
    runner = TrtRunner(EngineFromPath(engine_path))
    key = "fp16" if spec.precision == "fp32" else spec.precision
    judgement = subject.judge(runner, "report", key)
    lat = time_runners({"eager": subject.eager_runner(), name: runner}, subject.latency_feed(), ctx.warmup, ctx.repeats, ctx.batch)
    art = Artifact(name, spec.precision, key, lambda: runner, path=engine_path, size_bytes=result.size_bytes, details={"engine": result.to_dict()})
    stage = _stage(art, judgement, lat)
    report.add(stage)
    if not stage.passed:
        report.verdict.setdefault("failures", []).append(f"{name}: {'; '.join(judgement.violations)}")
    return engine_path


# -- the run -----------------------------------------------------------------------------
@dataclass
class _Ctx:
    """The registry's ``BuildContext`` plus the timing settings."""

    build: Any
    warmup: int
    repeats: int
    batch: int

    def __getattr__(self, item: str) -> Any:
        return getattr(self.build, item)


def run(cfg: Any, progress: Progress | None = None) -> RunResult:
    """Run ``cfg`` (a ``RunConfig``): every stage, side-by-side timing, judging, selection, deploy, report."""
    from attn_export.compress.registry import BuildContext
    from attn_export.environment import capture_environment
    from attn_export.extras import check_extras
    from attn_export.process import ProcessSettings, process_settings
    from attn_export.run_dir import claim_output
    from attn_export.subjects import make_subject

    say = progress or (lambda msg: log.info(msg))
    cfg.preflight()  # flags, paths, sizes and memory, before anything is built or written
    check_extras(cfg)
    threads = cfg.resolved_threads
    # the run owns --out (lock, earlier run's files aside, run.json; cleaned up on failure)
    with claim_output(cfg) as owner, process_settings(ProcessSettings(threads=threads)) as proc:
        say(f"building the subject ({'checkpoint ' + str(cfg.checkpoint) if cfg.is_checkpoint else cfg.resolved_layer})")
        subject = make_subject(cfg)
        plan = make_plan(cfg, subject)
        environment = capture_environment(threads, proc)
        environment["target"] = cfg.target
        if plan.encoding is not None:
            environment["int8_encoding"] = plan.encoding.to_dict()
        report = Report(model=subject.model_info(), inputs=subject.inputs_info(), environment=environment)
        report.notes.extend(plan.notes)
        if plan.skipped:
            report.selection["skipped_stages"] = dict(plan.skipped)  # the gate reports them as skipped, not missing
        if plan.encoding is not None:
            say(f"int8 weights for ONNX Runtime CPU: {plan.encoding.encoding} ({plan.encoding.reason})")
            if plan.encoding.deploy_note():
                report.notes.append(plan.encoding.deploy_note())
        for why in dict.fromkeys(plan.attention.values()):
            report.notes.append(f"attention form: {why}")
        build = BuildContext(subject, cfg.out, cfg.target_info, plan.fp32_spec, threads, say)
        ctx = _Ctx(build, cfg.warmup, cfg.repeats, cfg.batch)
        if hasattr(subject, "describe_data"):
            say(f"data: {subject.describe_data()}")
        artifacts = build_artifacts(plan, build)
        say(f"timing eager and {len(artifacts)} artifacts side by side ({cfg.repeats} rounds, {threads} threads)")
        eager = subject.eager_runner()
        latency, runners = time_side_by_side(eager, artifacts, subject.latency_feed(), cfg.warmup, cfg.repeats, cfg.batch)
        candidates = {c for sel in plan.selections for c in sel.candidates}
        say("judging every artifact on the report split" + (" (and the int8 candidates on the select split)" if candidates else ""))
        report_j, select_j = judge_artifacts(subject, artifacts, runners, candidates)
        stages: dict[str, Stage] = {}
        base = plan.steps[0].name
        for step in plan.steps:
            art = artifacts[step.name]
            stage = _stage(art, report_j[step.name], latency)
            if isinstance(step.config, ExportStep) is False and step.name.startswith("lowrank") and "int8" not in step.name:
                _profitability(stage, stages.get(base))
            if step.name in select_j:
                stage.details["select_split"] = {"passed": select_j[step.name].passed, "accuracy": select_j[step.name].accuracy.__dict__,
                                                 "violations": select_j[step.name].violations}  # fmt: skip
            stages[step.name] = stage
            report.add(stage)
            say(f"{art.display_name}: {report_j[step.name].headline()}, {stage.speedup_vs_eager or 0:.2f}x vs eager, "
                f"{'PASS' if stage.passed else 'FAIL'}")  # fmt: skip
            if step.required and not stage.passed:
                report.verdict.setdefault("failures", []).append(f"{step.name}: {'; '.join(report_j[step.name].violations)}")
        stand_ins = {a.details["runtime"]["stand_in"] for a in artifacts.values() if (a.details.get("runtime") or {}).get("stand_in")}
        for why in sorted(stand_ins):
            report.notes.append(f"stand-in: {cfg.target} artifacts were validated on ONNX Runtime's CPUExecutionProvider: {why}")
        for stage in stages.values():
            prof = stage.details.get("profitability") or {}
            if prof.get("faster_than_dense") is False:
                report.notes.append(
                    f"{stage.name} is slower than the dense model in ONNX Runtime ({prof['speedup_vs_dense_onnx']:.2f}x); "
                    "a lower --low-rank ratio or fewer --low-rank-targets may pay off"
                )
        chosen = _select(plan, stages, select_j, artifacts, report, cfg.out, say)
        _deploy(cfg, plan, subject, artifacts, chosen, report, ctx, say)
        report.verdict["passed"] = not report.verdict.get("failures")
        owner.stamp(report)  # the sha256 of each artifact judged, checked by `attn-export check`
        report.write(cfg.out / "report.json")
        if cfg.render:
            from attn_export.validate.render import write_reports

            say("rendering report.md and report.html")
            write_reports(cfg.out / "report.json", cfg.out, attention="auto" if subject.kind == "layer" else None)
        for r in runners.values():
            r.deactivate()
    return RunResult(report, plan, artifacts)
