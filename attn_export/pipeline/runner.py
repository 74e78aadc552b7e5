"""The stage runner: build plans, time everything side by side, judge, select, deploy, report.

One runner serves every command. ``run(cfg)`` is the main command (a layer, a checkpoint, layer
N of one, ``encoder``); ``run_plans(plans, ...)`` runs one plan or several merged ones (the
sweep's points, the bench's variants) in five phases:

1. **build** every step of every plan in order, each from its source artifact (exports
   through the subject, compression through the method registry); a stage two plans share
   (same config chain, target and fp32 export: ``Plan.content_key``) is built once;
2. **time** eager, every artifact and any peer in *one* round-robin pass per timing point
   (``validate.latency.time_pass``), so machine noise hits them alike and every
   ``speedup_vs_eager`` comes from the same eager samples;
3. **judge** every artifact on the report split, and selection candidates also on the
   select split, each against the user's reference (``Subject.judge``);
4. **select** (8-bit route -> ``model.<precision>.onnx``; a route that passes every judged data
   set first), then **deploy** (TensorRT check, engine, Jetson bundle, Triton repository:
   ``runner_deploy``);
5. **report**: one typed ``Report`` per plan, its verdict PASS / PARTIAL / FAIL by
   ``validate.verdict`` (PARTIAL: what ships fails a data set judged beside the report split).

Process state (threads, denormal flushing) is set by ``attn_export.host.process`` for the whole
run, the same for eager and ONNX Runtime, and recorded in the report.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attn_export.errors import ConfigError
from attn_export.host.signals import raise_if_interrupted
from attn_export.pipeline.notes import run_notes
from attn_export.pipeline.plan import ExportStep, Plan, Step, make_plan
from attn_export.pipeline.stage_clock import StageClock
from attn_export.runtime.artifacts import Artifact
from attn_export.validate.latency import TimingPoint, TimingResult
from attn_export.validate.report import Report, Stage

if TYPE_CHECKING:
    from attn_export.config.run import RunConfig
    from attn_export.runtime.base import Runner
    from attn_export.subjects.base import Judgement, Subject
    from attn_export.validate.verdict import Verdict

__all__ = ["RunResult", "RunSettings", "build_plans", "run", "run_plans", "runner_labels"]

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass
class RunSettings:
    """How one ``run_plans`` call times: threads, the timing points (default: the subject's), peers, memory."""

    threads: int
    say: Progress = field(default=lambda msg: None)
    points: list[TimingPoint] | None = None  # None: subject.timing_points(warmup, repeats)
    warmup: int = 3
    repeats: int = 20
    peers: Mapping[str, Callable[[], Runner]] = field(default_factory=dict)  # runners timed beside (torch.compile, SDPA)
    measure_memory: bool = False
    skip: Callable[[str, TimingPoint], str | None] | None = None  # why a runner is not timed at a point
    keep_going: bool = False  # a plan whose build fails is reported (RunResult.error), not fatal (the bench)
    clock: StageClock = field(default_factory=StageClock)  # every phase's wall and CPU time (report.json time_to_ship)


@dataclass
class RunResult:
    """One plan's outcome: its report, its artifacts by stage name, and the timing pass it shared."""

    report: Report
    plan: Plan
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    timing: TimingResult = field(default_factory=TimingResult)
    labels: dict[str, str] = field(default_factory=dict)  # stage name -> its runner's label in ``timing``
    error: str | None = None  # why the plan could not be built (``RunSettings.keep_going``)

    @property
    def verdict(self) -> Verdict:
        """PASS / PARTIAL / FAIL by ``validate.verdict``'s rule (the headline's and the gate's)."""
        from attn_export.validate.verdict import verdict_of

        return verdict_of(self.report.to_dict())

    @property
    def passed(self) -> bool:
        return bool(self.report.verdict.get("passed", False))

    @property
    def exit_code(self) -> int:
        """0 PASS (or a PARTIAL shipped with --accept-partial), 1 FAIL, 3 PARTIAL (``validate.verdict.EXIT_CODES``)."""
        return self.verdict.exit_code


# -- build -------------------------------------------------------------------------------
def _export(step: Step, ctx: Any, source: Artifact | None) -> Artifact:
    """Export the subject (or a built artifact's module) to ONNX."""
    export = step.config
    if not isinstance(export, ExportStep):
        raise ConfigError(f"plan step {step.name} is not an export")
    module = ctx.subject.module if source is None else source.module
    path = ctx.out / step.filename
    ctx.say(f"exporting {path.name} ({export.spec.attention}, {export.precision}, opset {export.spec.resolved_opset})")
    result = ctx.subject.export(module, path, export.spec)
    ctx.say(f"exported: {result.describe()}")
    key = export.precision if source is None else source.tolerance_key
    return ctx.onnx_artifact(step.name, path, export.precision, key, module=module, onnx_fp32=path if export.precision == "fp32" else None,
                             params=ctx.subject.params(module), details={"export": result.to_dict()})  # fmt: skip


def build_plans(plans: Sequence[Plan], subject: Subject, settings: RunSettings) -> tuple[list[dict[str, Artifact] | str], dict[str, Artifact]]:
    """Phase 1 alone: every plan's artifacts by stage name (or why it failed, with ``keep_going``), and the unique ones by content key.

    For tools that evaluate artifacts their own way (``bench/int8_isa.py`` runs them under emulation).
    """
    unique: dict[str, Artifact] = {}
    per_plan: list[dict[str, Artifact] | str] = []
    for plan in plans:
        try:
            per_plan.append(_build_plan(plan, subject, settings, unique))
        except Exception as err:  # noqa: BLE001 - with keep_going a failing variant is reported with its reason
            if not settings.keep_going or isinstance(err, (KeyboardInterrupt, SystemExit)):
                raise
            first = (str(err).strip().splitlines() or [""])[0][:200]
            per_plan.append(f"{type(err).__name__}: {first}")
            log.info("plan %s failed: %s", plan.describe(), per_plan[-1])
    return per_plan, unique


def _build_plan(plan: Plan, subject: Subject, settings: RunSettings, unique: dict[str, Artifact]) -> dict[str, Artifact]:
    from attn_export.compress.registry import BuildContext, Method, Source, apply
    from attn_export.pipeline.form_first import decide_form, form_first

    contexts = {form: BuildContext(subject, plan.out, plan.config.target_info, spec, settings.threads, settings.say)
                for form, spec in {"padded": plan.fp32_spec, **plan.form_specs}.items()}  # fmt: skip
    plan.out.mkdir(parents=True, exist_ok=True)
    known: dict[str, Artifact] = {}
    decide_after = form_first(plan)
    for step in list(plan.steps):
        if step not in plan.steps:
            continue  # the other encoder form's stage, dropped by decide_form
        key = plan.content_key(step.name)
        if key not in unique:
            if step.source != "subject" and step.source not in known:
                raise ConfigError(f"plan step {step.name} starts from {step.source!r}, which is not built before it")
            source = None if step.source == "subject" else known[step.source]
            ctx = contexts.get(step.form, contexts["padded"])  # students are re-exported in their own encoder form
            with settings.clock.phase(step.name, "build"):
                if isinstance(step.config, ExportStep):
                    unique[key] = _export(step, ctx, source)
                elif isinstance(step.config, Method) and source is not None:
                    unique[key] = apply(Source(source, step.name, plan.out / (step.filename or f"{step.name}.onnx"), ctx), step.config)
                else:
                    raise ConfigError(f"plan step {step.name}: a method needs a built source, got {step.source!r}")
            settings.say(f"{step.name} built ({settings.clock.last()})")
        known[step.name] = unique[key]
        if step.name == decide_after:
            with settings.clock.phase("form decision", "timing"):
                keys = {n: plan.content_key(n) for n in known}
                for name in decide_form(plan, known, subject, settings.say):
                    if name in known:  # the losing fp32 twin, built before the decision: neither timed nor judged (its
                        known.pop(name)  # file stays, listed in selection.skipped_stages with the measurement)
                        unique.pop(keys[name], None)
    return known


# -- judge -------------------------------------------------------------------------------
def _judge(subject: Subject, art: Artifact, split: str) -> Judgement:
    runner = art.make_runner()
    try:
        judgement = subject.judge(runner, split, art.tolerance_key)  # type: ignore[arg-type]
        invariance = subject.batch_invariance(runner, split)  # type: ignore[arg-type]
    finally:
        runner.deactivate()
    if invariance is not None:  # a text's answer alone vs inside a batch (validate.batch_invariance): a figure on the report
        judgement.details["batch_invariance"] = invariance.to_dict()  # split, and on the select split a bar to be shipped
        if split == "select" and not invariance.passed:
            judgement.violations.append(invariance.violation())
            judgement.passed = False
    for defect in art.defects:  # what the method itself found wrong (e.g. a fallback that left no 8-bit GEMM)
        judgement.violations.append(defect)
        judgement.passed = False
    return judgement


def _stage(name: str, art: Artifact, judgement: Judgement, timing: TimingResult, label: str, points: list[TimingPoint]) -> Stage:
    primary = points[0].label
    lat = timing.latency.get(primary, {})
    eager, mine = lat.get("eager"), lat.get(label)
    stage = Stage(
        name=name, artifact=None if art.path is None else str(art.path), precision=art.precision, accuracy=judgement.accuracy,
        latency_ms={"artifact": mine, "eager": eager} if mine and eager else {},
        speedup_vs_eager=eager.p50 / mine.p50 if mine and eager and mine.p50 > 0 else None,
        size_bytes=art.size_bytes, params=art.params, passed=judgement.passed, tolerance=judgement.tolerance,
        details={**art.details, **judgement.details, "violations": judgement.violations},
    )  # fmt: skip
    others = {p.label: {"artifact": timing.latency[p.label][label], "eager": timing.latency[p.label].get("eager"), **p.details}
              for p in points[1:] if label in timing.latency.get(p.label, {})}  # fmt: skip
    if others:
        stage.details["latency_by_input"] = {primary: {"artifact": mine, "eager": eager, **points[0].details}, **others}
    if art.label:
        stage.details["label"] = art.label
    if label in timing.failed:
        stage.details["timing_failed"] = timing.failed[label]
    return stage


def _profitability(stage: Stage, dense: Stage | None) -> None:
    """A factorized model is only worth shipping when it is faster than the dense one."""
    from attn_export.compress.lowrank import factorization_is_profitable

    layers = ((stage.details.get("low_rank") or {}).get("layers")) or {}
    if not layers:
        return
    info: dict[str, Any] = {"fewer_flops": all(factorization_is_profitable(v["m"], v["n"], v["rank"]) for v in layers.values()
                                               if isinstance(v, dict) and "rank" in v)}  # fmt: skip
    if dense is not None and dense.latency_ms and stage.latency_ms:
        ratio = dense.latency_ms["artifact"].p50 / stage.latency_ms["artifact"].p50
        info.update(speedup_vs_dense_onnx=ratio, faster_than_dense=ratio > 1.0)
    stage.details["profitability"] = info


# -- the phases ----------------------------------------------------------------------------
def runner_labels(plans: Sequence[Plan]) -> dict[str, str]:
    """Content key -> the label its artifact is timed under: the first plan's stage name, made unique."""
    labels: dict[str, str] = {}
    for plan in plans:
        for step in plan.steps:
            key = plan.content_key(step.name)
            if key not in labels:
                labels[key] = step.name if step.name not in labels.values() else f"{step.name}#{len(labels)}"
    return labels


def run_plans(plans: Sequence[Plan], subject: Subject, settings: RunSettings) -> list[RunResult]:
    """Build, time, judge, select and deploy every plan; one typed ``RunResult`` per plan (see the module doc)."""
    from attn_export.pipeline.deploy import deploy, select
    from attn_export.validate.latency import time_pass
    from attn_export.validate.verdict import judged_sets

    say = settings.say
    per_plan, unique = build_plans(plans, subject, settings)
    labels = runner_labels(plans)
    points = settings.points or subject.timing_points(settings.warmup, settings.repeats)
    runners: dict[str, Callable[[], Runner]] = {"eager": subject.eager_runner, **settings.peers}
    runners.update({labels[k]: art.make_runner for k, art in unique.items()})
    say(f"timing eager and {len(unique)} artifacts side by side on {', '.join(p.label for p in points)} ({settings.threads} threads)")
    with settings.clock.phase("timing", "timing"):
        timing = time_pass(runners, points, settings.measure_memory, settings.skip)
    say(f"timing done ({settings.clock.last()})")
    candidates = {plan.content_key(c) for plan, arts in zip(plans, per_plan) if isinstance(arts, dict) for sel in plan.selections for c in sel.candidates}
    say("judging every artifact on the report split" + (" (and the 8-bit candidates on the select split)" if candidates else ""))
    with settings.clock.phase("judging", "judging"):
        report_j = {k: _judge(subject, art, "report") for k, art in unique.items()}
        select_j = {k: _judge(subject, unique[k], "select") for k in candidates}
    say(f"judging done ({settings.clock.last()})")
    results = []
    for plan, arts in zip(plans, per_plan):
        report = _report(plan, subject, settings)
        report.inputs["timed_on"] = [{"label": p.label, "batch": p.batch, **p.details} for p in points]  # the first decides selections
        if isinstance(arts, str):
            report.verdict.update(passed=False, failures=[f"build failed: {arts}"])
            results.append(RunResult(report, plan, timing=timing, error=arts))
            continue
        stages: dict[str, Stage] = {}
        for step in plan.steps:
            key = plan.content_key(step.name)
            stage = _stage(step.name, arts[step.name], report_j[key], timing, labels[key], points)
            if isinstance(step.config, ExportStep) is False and (stage.details.get("low_rank") or stage.details.get("distill")):
                _profitability(stage, stages.get(plan.steps[0].name))
            if key in select_j:
                j = select_j[key]
                stage.details["select_split"] = {"passed": j.passed, "accuracy": j.accuracy.__dict__, "violations": j.violations, "score": j.score,
                                                 **{k: j.details[k] for k in ("also_judged_on", "batch_invariance") if j.details.get(k)}}  # fmt: skip
            stage.details["judged_sets"] = [js.to_dict() for js in judged_sets(stage.to_dict(), {"inputs": report.inputs})]
            stages[step.name] = report.add(stage)
            say(f"{arts[step.name].display_name}: {report_j[key].headline()}, {stage.speedup_vs_eager or 0:.2f}x vs eager, "
                f"{'PASS' if stage.passed else 'FAIL'}")  # fmt: skip
            if step.required and not stage.passed:
                report.verdict.setdefault("failures", []).append(f"{step.name}: {'; '.join(report_j[key].violations)}")
        run_notes(plan, stages, report, timing)
        with settings.clock.phase("selection and deploy", "deploy"):
            rounds = {n: timing.rounds_ms.get(points[0].label, {}).get(labels[plan.content_key(n)], []) for n in arts}  # paired
            chosen = select(plan, stages, {n: select_j[plan.content_key(n)] for sel in plan.selections for n in sel.candidates}, arts,
                            report, say, rounds, points[0])
            deploy(plan, subject, arts, chosen, report, points, say)
        report.time_to_ship = settings.clock.to_dict()
        _verdict(report, plan.config)
        results.append(RunResult(report, plan, dict(arts), timing, {n: labels[plan.content_key(n)] for n in arts}))
    return results


def _verdict(report: Report, cfg: RunConfig) -> None:
    """``report.verdict``: PASS / PARTIAL / FAIL (``validate.verdict``), what ships fails on, and whether the user accepted a PARTIAL."""
    from attn_export.validate.verdict import PARTIAL, verdict_of

    report.verdict["passed"] = not report.verdict.get("failures")
    accept = cfg.accept_partial
    if accept:
        report.verdict["accept_partial"] = True  # recorded: the gate accepts what the user accepted, and says so
    verdict = verdict_of(report.to_dict())
    report.verdict.update(state=verdict.state, passed=verdict.ok)
    if verdict.state == PARTIAL:
        report.verdict["partial"] = verdict.misses


def _report(plan: Plan, subject: Subject, settings: RunSettings) -> Report:
    from attn_export.host.environment import capture_environment
    from attn_export.host.process import current_settings

    environment = capture_environment(settings.threads, current_settings())
    environment["target"] = plan.config.target
    if plan.encoding is not None:
        environment["int8_encoding"] = plan.encoding.to_dict()
    report = Report(model=subject.model_info(), inputs=subject.inputs_info(), environment=environment)
    report.notes.extend(plan.notes)
    report.notes.extend(subject.notes())
    if plan.skipped:
        report.selection["skipped_stages"] = dict(plan.skipped)  # the gate reports them as skipped, not missing
    if plan.encoding is not None and plan.encoding.deploy_note():
        report.notes.append(plan.encoding.deploy_note())
    for why in dict.fromkeys(plan.attention.values()):
        report.notes.append(f"attention form: {why}")
    return report


def run(cfg: RunConfig, progress: Progress | None = None, quiet: bool = False) -> RunResult:
    """Run ``cfg`` (a ``RunConfig``): every stage, side-by-side timing, judging, selection, deploy, report.

    What libraries log while loading (transformers' load report) goes to ``OUT/run.log``; with
    ``quiet`` every library record and Python warning does, and none reaches the terminal."""
    from attn_export.config.extras import check_extras
    from attn_export.deploy.folder import claim_deploy_folders
    from attn_export.host.process import ProcessSettings, process_settings
    from attn_export.host.quiet import RUN_LOG_NAME, run_log
    from attn_export.outdir.claim import claim_output
    from attn_export.subjects import make_subject

    say = progress or (lambda msg: log.info(msg))
    cfg.preflight()  # flags, paths, sizes and memory, before anything is built or written
    check_extras(cfg)
    threads = cfg.resolved_threads
    # the run holds its --bundle/--triton folders (lock; --force moves foreign files aside) for as long as
    # it owns --out (lock, earlier run's files aside, run.json; cleaned up on failure): run.json describes them
    with (claim_deploy_folders(cfg) as deploy_claims, claim_output(cfg) as owner, process_settings(ProcessSettings(threads=threads)),
          run_log(cfg.out / RUN_LOG_NAME, terminal=not quiet)):
        moved = [f"{c.flag} {c.folder}: moved what attn-export did not write into {aside}" for c in deploy_claims if (aside := c.make_room(cfg.force))]
        for note in moved:
            say(note)
        say(f"building the subject ({cfg.kind.name}: {cfg.checkpoint or cfg.resolved_layer})")
        clock = StageClock()
        with clock.phase("subject", "subject"):
            subject = make_subject(cfg)
        plan = make_plan(cfg)
        if plan.encoding is not None:
            say(f"int8 weights for ONNX Runtime CPU: {plan.encoding.encoding} ({plan.encoding.reason})")
        say(f"data: {subject.describe_data()}")
        (result,) = run_plans([plan], subject, RunSettings(threads, say, warmup=cfg.warmup, repeats=cfg.repeats, clock=clock))
        result.report.notes.extend(moved)
        owner.stamp(result.report)  # the sha256 of each artifact judged, checked by `attn-export check`
        result.report.write(cfg.out / "report.json")
        if cfg.render:
            from attn_export.validate.render import write_reports
            from attn_export.validate.report import load_report

            say("rendering report.md and report.html")
            with clock.phase("rendering", "render"):  # after report.json is written: in this line and run.log only
                attention = subject.report_attention(load_report(cfg.out / "report.json"), cfg.out)  # maps or why not, while the model is loaded
                write_reports(cfg.out / "report.json", cfg.out, attention=attention)
            say(f"rendering done ({clock.last()})")
        # matplotlib figures (and the run's sessions) sit in reference cycles: collect them before the
        # run is committed, so their finalizers run (and an interrupt landing in one surfaces) while the
        # run can still be rolled back, not at interpreter exit after the signal handlers are gone.
        gc.collect()
        raise_if_interrupted()  # an interrupt a finalizer swallowed in that collection: before the commit, not after
    return result
