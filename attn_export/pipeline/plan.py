"""``make_plan``: a ``RunConfig`` becomes the ordered list of stages to build. The only place stages are made.

Nothing runs here: the plan says what to build from what (each step names its source step), which built artifacts
compete in a selection (the 8-bit routes of a precision), and what is deployed. ``pipeline.runner.run_plans`` executes
one plan or several merged ones (the sweep's points, the bench's variants), building every shared stage once.

    onnx-<precision> [onnx-fp32] -> transforms (lowrank -> lowrank+distill)
      -> routes of --quantize's precision (+ their refinements) -> select (model.<precision>.onnx)
      -> TensorRT check -> engine -> Jetson bundle / Triton repository

The plan never names a method: it asks the compression registry for its transforms and for the routes of the requested
precision (``compress.registry``), each method building its own config from the ``RunConfig`` or saying why it is
skipped; which routes a target prefers (and builds padded only) is target data (``targets.targets.Target``).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attn_export.compress.registry import Method, PlanContext, Skip, methods, stage_prefix
from attn_export.errors import ConfigError
from attn_export.pipeline.select import NOISE_BAND
from attn_export.vocab.precisions import EIGHT_BIT, PRECISIONS, engine_precision

if TYPE_CHECKING:
    from attn_export.config.run import RunConfig
    from attn_export.export.spec import ExportSpec
    from attn_export.subjects.kinds import SubjectProfile
    from attn_export.targets.targets import Target

__all__ = ["DeployStep", "ExportStep", "Plan", "Selection", "Step", "make_plan"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportStep:
    """Export the source's module at ``precision`` with ``spec``."""

    precision: str
    spec: ExportSpec


@dataclass(frozen=True)
class Step:
    """Build stage ``name`` by applying ``config`` (an ``ExportStep`` or a method config) to ``source``.

    ``source`` is ``"subject"`` (the eager reference) or an earlier step's name.
    ``required``: a failing stage fails the run; candidates of a selection and intermediate
    students are reported but only their selection (or their chain's last stage) decides.
    """

    name: str
    config: ExportStep | Method
    source: str
    filename: str
    required: bool = True
    form: str = "padded"  # "packed": the second encoder form of an --encoder-form auto run (Plan.form_specs); else the plan's own


@dataclass(frozen=True)
class Selection:
    """Pick one of ``candidates`` that meets its tolerance on the select split; copy it to ``filename``.

    ``criterion``: ``latency`` (the fastest, ties within ``band`` broken by ``preference``) where
    the run times the target's own runtime; ``accuracy`` (the best score) for TensorRT targets,
    whose speed this machine does not measure. ``precisions``: the 8-bit formats of a
    ``--quantize auto`` selection, preferred first (``EIGHT_BIT``: FP8 where the GPU runs it): on
    ``accuracy`` the first that meets its tolerance ships. ``filename`` may hold ``{precision}``:
    the chosen artifact's (``--quantize auto`` ships ``model.fp8.onnx`` or ``model.int8.onnx``).
    """

    key: str
    candidates: tuple[str, ...]
    preference: tuple[str, ...]
    filename: str
    band: float = NOISE_BAND
    criterion: str = "latency"
    why: str = ""  # why these candidates (the --quantize auto decision)
    precisions: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeployStep:
    """``trt-check`` | ``engine`` | ``bundle`` | ``triton`` of the deployed ONNX model."""

    kind: str


@dataclass
class Plan:
    """Every stage one ``RunConfig`` asks for, in build order, and what becomes of them."""

    config: RunConfig
    profile: SubjectProfile
    steps: list[Step]
    selections: list[Selection] = field(default_factory=list)
    deploy: list[DeployStep] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # stage name -> why the run does not build it
    form_decision: dict[str, Any] = field(default_factory=dict)  # the fp32 twins' timing that chose the 8-bit routes' form
    encoding: Any = None  # compress.int8_encoding.EncodingChoice, when an 8-bit precision runs
    fp32_spec: ExportSpec | None = None  # the ExportSpec every fp32 graph of the run uses (compression sources, students)
    form_specs: dict[str, ExportSpec] = field(default_factory=dict)  # a second encoder form -> its fp32 ExportSpec
    attention: dict[str, str] = field(default_factory=dict)  # graph precision -> why its attention form was chosen
    deploy_source: str = ""  # the step (or "select:<precision>") whose ONNX is deployed
    deploy_precision: str = "fp32"  # the deployed graph's precision; "8bit": the format selection ships (--quantize auto)

    def engine_precision(self, shipped: str | None = None) -> str:
        """The precision the deployed engine is built in, decided here only: an 8-bit graph's own, a float
        graph's the user's ``--precision``, or for ``--quantize auto`` the 8-bit format the selection shipped (``shipped``; the target's first 8-bit
        format the run planned when nothing has shipped yet). The deploy step passes it to
        ``RunConfig.engine_spec``; no other module decides it."""
        if self.deploy_precision in PRECISIONS:  # a float graph's engine runs the float type the user asked for
            return self.deploy_precision if PRECISIONS[self.deploy_precision].quantized else self.config.precision
        if shipped is not None and shipped in PRECISIONS and PRECISIONS[shipped].quantized:
            return shipped
        planned = next((s.precisions for s in self.selections if s.precisions), ())
        return planned[0] if planned else engine_precision(self.config.quantize, "fp32")

    def graph_precision(self, shipped: str | None = None) -> str:
        """The deployed graph's own precision (the key of its tolerances): ``deploy_precision`` where the plan fixed it,
        else, under ``--quantize auto`` (``"8bit"`` until the selection picks), the 8-bit format that shipped."""
        return self.deploy_precision if self.deploy_precision in PRECISIONS else self.engine_precision(shipped)

    @property
    def out(self) -> Path:
        return Path(self.config.out)

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def content_key(self, name: str) -> str:
        """What stage ``name`` is, independent of its name: its config chain back to the subject, the target
        and the fp32 export spec. Two plans' stages with one key are one artifact (built once when merged)."""
        parts = []
        while name != "subject":
            step = self.step(name)
            parts.append(repr(step.config))
            name = step.source
        return f"{self.config.target}|{self.fp32_spec!r}|" + " <- ".join(parts)

    @property
    def deployed_stage(self) -> str | None:
        """The stage whose artifact the run ships (a selection's candidates: None until selected)."""
        return None if self.deploy_source.startswith("select:") else self.deploy_source

    def fp32_spec_for(self, step: Step) -> ExportSpec | None:
        """The fp32 export a step's method re-exports students with: its encoder form's."""
        return self.form_specs.get(step.form, self.fp32_spec)

    def describe(self) -> str:
        parts = [s.name for s in self.steps] + [f"select {s.key}" for s in self.selections] + [d.kind for d in self.deploy]
        return " -> ".join(parts)


def export_spec(cfg: RunConfig, profile: SubjectProfile, graph_precision: str, engine_precision: str,
                form: str = "padded") -> tuple[ExportSpec, str | None]:  # fmt: skip
    """The export for one graph of the run, and why its attention form was chosen.

    On a TensorRT target without an explicit ``--attention``, the ONNX ``Attention`` op is
    exported only where TensorRT's IAttention has a fused kernel for this precision and head
    size; IAttention is not decomposable by default, so anywhere else the decomposed form
    (which TensorRT always builds) is exported instead (``checks.trt_attention``).
    """
    spec = cfg.export_spec(graph_precision)
    target = cfg.target_info
    if form == "packed":
        return packed_spec(cfg, spec), None  # its attention form is the packed encoder's (packed_spec)
    if cfg.attention not in (None, "auto"):
        return spec, None  # the user's explicit form
    if not target.trt_releases:  # no TensorRT parser reads the graph: the ONNX Runtime form choice
        from attn_export.targets.form_choice import choose_attention_form

        form, reason = choose_attention_form(target, cfg.max_seq_len, profile.mask, layer=profile.layer, score_bias=profile.score_bias)
        if form != spec.attention:
            return dataclasses.replace(spec, attention=form, opset=None), f"{form} (--attention auto): {reason}"
        return spec, None
    from attn_export.checks.trt_attention import trt_attention_form

    form, reason = trt_attention_form(engine_precision, profile.head_dim, cfg.resolved_trt_version, target.strongly_typed,
                                      target.quantize_attention_bmm)  # fmt: skip
    if form != spec.attention:
        spec = dataclasses.replace(spec, attention=form)
    return spec, f"{form} for TensorRT {cfg.resolved_trt_version} at {engine_precision}: {reason}"


def _fp32_source(cfg: RunConfig, plan: Plan, spec: ExportSpec, form: str) -> str:
    """The fp32 graph compression starts from: the run's own export, or a second fp32 export of the subject."""
    fp32_spec, why = export_spec(cfg, plan.profile, "fp32", engine_precision(cfg.quantize, "fp32"), form)
    if cfg.quantize and fp32_spec.attention == "long-seq":
        # Static Q/DQ cannot yet rewrite the long-seq graph's Loop/If subgraphs (onnx.checker refuses the
        # result), so the 8-bit routes start from the target's decomposed form; model.onnx keeps long-seq.
        fp32_spec = dataclasses.replace(fp32_spec, attention=cfg.target_info.attention, opset=None, linear_gemm=None)
        why = (f"{fp32_spec.attention} for the 8-bit routes' source graph: static Q/DQ cannot yet quantize the long-seq form's "
               "subgraphs (model.onnx keeps long-seq)")  # fmt: skip
    planned = eight_bit_precisions(cfg, cfg.target_info)[0] if cfg.quantize else ()
    if (need := max((PRECISIONS[p].min_opset for p in planned), default=0)) > fp32_spec.resolved_opset:
        fp32_spec = dataclasses.replace(fp32_spec, opset=need)  # e.g. float8 Q/DQ from opset 19 on jetson's opset-18 export
        which = " and ".join(p for p in planned if PRECISIONS[p].min_opset == need)
        why = f"opset {need} for the 8-bit routes' source graph: {which} Q/DQ needs it (model.onnx keeps opset {spec.resolved_opset})"
    plan.fp32_spec = fp32_spec
    if why:
        plan.attention["fp32" if spec.precision != "fp32" or fp32_spec == spec else "fp32 (8-bit source)"] = why
    if cfg.compresses and fp32_spec != spec:
        name = "onnx-fp32" if spec.precision != "fp32" else f"onnx-fp32-{fp32_spec.attention}"
        plan.steps.append(Step(name, ExportStep("fp32", fp32_spec), "subject", f"model.{name.removeprefix('onnx-')}.onnx"))
        return name
    return plan.steps[0].name


def _transforms(cfg: RunConfig, plan: Plan, ctx: PlanContext, source: str) -> tuple[str, list[type[Method]]]:
    """The model transforms the run asks for, chained in registry order; returns the last stage and the transforms it went through."""
    applied: list[type[Method]] = []
    chain = []
    for method in methods("transform"):
        config = method.from_run(cfg, ctx)
        if isinstance(config, Skip):
            plan.skipped[method.stage] = config.reason
            plan.notes.append(config.reason)
        elif config is not None:
            chain.append(Step(method.stage, config, source, method.filename, required=method.required))
            source = method.stage
            applied.append(method)
    if chain:
        chain[-1] = dataclasses.replace(chain[-1], required=True)  # the chain's result decides the run
        plan.steps.extend(chain)
        plan.deploy_source, plan.deploy_precision = source, "fp32"
    return source, applied


def eight_bit_precisions(cfg: RunConfig, target: Target) -> tuple[tuple[str, ...], str]:
    """The 8-bit precisions ``--quantize`` plans, and why: itself, or for ``auto`` every format the target's GPU runs."""
    if cfg.quantize != "auto":
        return (str(cfg.quantize),), ""
    listed = tuple(p for p in EIGHT_BIT if target.routes(p))  # the route policy: what the target ships at all
    if not listed:
        raise ConfigError(f"--quantize auto: the {target.name} target's route policy ships no 8-bit format; drop --quantize")
    if len(listed) == 1:
        return listed, f"--quantize auto: {listed[0]} ({target.name}'s route policy ships no {', '.join(p for p in EIGHT_BIT if p not in listed)})"
    from attn_export.targets.gpu_arch import best_8bit, supports

    arch = cfg.resolved_gpu_arch
    if arch is None:
        return ("int8",), "--quantize auto: int8, which every TensorRT GPU runs; pass --gpu-arch to consider FP8 (sm89 and later)"
    best, why = best_8bit(arch, str(cfg.resolved_trt_version))
    both = tuple(p for p in listed if supports(arch, p, str(cfg.resolved_trt_version)))
    if len(both) > 1:
        return both, (f"--quantize auto on {arch}: {' and '.join(both)} both run ({why}); {both[0]} ships when it meets its tolerance "
                      f"on the select split, else {' or '.join(both[1:])}")  # fmt: skip
    return (best,), f"--quantize auto on {arch}: {why}"


def _routes(cfg: RunConfig, plan: Plan, ctx: PlanContext, source: str, transforms: list[type[Method]]) -> None:
    """Every route of the planned 8-bit precisions (and their refinements) as candidates of one selection."""
    precisions, why = eight_bit_precisions(cfg, ctx.target)
    if why:
        plan.notes.append(why)
    built: list[Step] = []
    for precision in precisions:
        ctx.precision = precision
        prefix = stage_prefix(transforms, precision)
        for method in methods("route"):
            if method.precision != precision:
                continue
            name = method.stage.format(prefix=prefix)
            config = method.from_run(cfg, ctx)
            if isinstance(config, Skip):
                plan.skipped[name] = config.reason
                plan.notes.append(config.reason)
                continue
            if config is None:
                continue
            built.append(Step(name, config, source, method.filename.format(prefix=prefix), required=False))
            for refinement in methods("refine"):
                if refinement.refines is method and (r := refinement.from_run(cfg, ctx, parent=config)) is not None and not isinstance(r, Skip):
                    built.append(Step(refinement.stage.format(prefix=prefix), r, name, refinement.filename.format(prefix=prefix), required=False))
    plan.steps.extend(built)
    candidates = tuple(s.name for s in built if isinstance(s.config, Method) and s.config.deployable)
    key = str(cfg.quantize)
    if candidates:
        preference = tuple(r for p in precisions for r in ctx.target.route_preference.get(p, ()))
        criterion = ctx.target.select_by  # TensorRT's speed is not measured on this machine: accuracy ranks there
        filename = "model.{precision}.onnx" if len(precisions) > 1 else f"model.{precisions[0]}.onnx"
        plan.selections.append(Selection(key, candidates, preference, filename, criterion=criterion, why=why, precisions=precisions))
        plan.deploy_source, plan.deploy_precision = f"select:{key}", precisions[0] if len(precisions) == 1 else "8bit"
    else:  # only eager references (torchao): they are what the run measures, so they decide it
        plan.steps[:] = [dataclasses.replace(s, required=True) if s in built else s for s in plan.steps]


def packed_spec(cfg: RunConfig, spec: ExportSpec) -> ExportSpec:
    """``spec`` for the packed encoder form: ONNX Runtime's MultiHeadAttention on an ORT target, the decomposed math elsewhere.
    An explicit ``--attention`` the packed form can export is kept (config_rules refuses the others)."""
    from attn_export.vocab.choices import PACKED_ATTENTION_FORMS

    if cfg.attention not in (None, "auto") and cfg.attention in PACKED_ATTENTION_FORMS:
        return dataclasses.replace(spec, encoder_form="packed")
    attention = cfg.target_info.packed_attention
    opset = spec.opset if cfg.opset is not None else None
    return dataclasses.replace(spec, encoder_form="packed", attention=attention, opset=opset, linear_gemm=None)


def encoder_forms(cfg: RunConfig, profile: SubjectProfile) -> tuple[tuple[str, ...], str]:
    """The encoder forms the run builds, and why: the one asked for, or for ``auto`` both where the run can time them."""
    if profile.kind != "encoder":
        return ("padded",), ""  # a reference layer and layer N of a checkpoint run on (B, S, D) states: no form to choose
    asked = cfg.encoder_form or "auto"
    if asked != "auto":
        return (asked,), ""
    from attn_export.vocab.choices import PACKED_ATTENTION_FORMS

    target = cfg.target_info
    if target.select_by != "latency":  # the two forms cannot be timed against each other here
        return ("padded",), ("--encoder-form auto: padded for TensorRT: the packed graph passes check-trt's static checks, but its "
                             "data-dependent shapes (NonZero) are unverified without a GPU build and its speed is not measured here; "
                             "pass --encoder-form packed to ship it (TensorRT >= 11.1: packed IAttention)")  # fmt: skip
    if cfg.attention not in (None, "auto") and cfg.attention not in PACKED_ATTENTION_FORMS:
        return ("padded",), f"--encoder-form auto: padded (--attention {cfg.attention} has no packed form)"
    if cfg.low_rank is not None or cfg.distill is not None:
        return ("padded",), ("--encoder-form auto: padded (with --low-rank/--distill the students would be trained once per form; "
                             "pass --encoder-form packed to build them packed)")  # fmt: skip
    return ("padded", "packed"), "--encoder-form auto: padded and packed both built; the faster on the real-text batches ships"


def _packed_name(name: str) -> str:
    return f"{name}-packed"


def _packed_filename(filename: str) -> str:
    return "model.packed.onnx" if filename == "model.onnx" else filename.removesuffix(".onnx") + "-packed.onnx"


def _add_packed_form(cfg: RunConfig, plan: Plan, why: str) -> None:
    """Every stage again in the packed form (but the target's ``padded_only_routes``), beside its padded twin in the same
    selections. The padded export moves to ``model.padded.onnx``; a ``form`` selection (the faster fp32 graph meeting its
    tolerance) writes ``model.onnx``, and the 8-bit selections take both forms' routes (``form_first`` may drop one's)."""
    padded = list(plan.steps)
    base = padded[0].name
    unfused = cfg.target_info.padded_only_routes  # a route (and what refines it) the packed form cannot win with
    for step in padded:
        config = step.config
        why_not = unfused.get(str(getattr(config, "route", ""))) or plan.skipped.get(_packed_name(step.source))
        if why_not and isinstance(config, Method):
            plan.skipped[_packed_name(step.name)] = why_not
            continue
        if isinstance(config, ExportStep):
            config = ExportStep(config.precision, packed_spec(cfg, config.spec))
        source = step.source if step.source == "subject" else _packed_name(step.source)
        plan.steps.append(Step(_packed_name(step.name), config, source, _packed_filename(step.filename), step.required, form="packed"))
    plan.form_specs["packed"] = packed_spec(cfg, plan.fp32_spec) if plan.fp32_spec is not None else None  # type: ignore[assignment]
    plan.steps[0] = dataclasses.replace(plan.steps[0], filename="model.padded.onnx", required=False)
    plan.steps[len(padded)] = dataclasses.replace(plan.steps[len(padded)], required=False)
    plan.steps.insert(1, plan.steps.pop(len(padded)))  # both fp32 twins first: the form can be decided before the rest (form_first)
    twins = {s.name for s in plan.steps}
    plan.selections[:] = [dataclasses.replace(sel, candidates=(*sel.candidates, *(n for n in map(_packed_name, sel.candidates) if n in twins)))
                          for sel in plan.selections]  # fmt: skip
    plan.selections.insert(0, Selection("form", (base, _packed_name(base)), (_packed_name(base), base), "model.onnx", why=why))
    if plan.deploy_source == base:  # an fp32 run ships the selected form's graph
        plan.deploy_source = "select:form"


def make_plan(cfg: RunConfig) -> Plan:
    """The stages ``cfg`` asks for (nothing is built here)."""
    profile = cfg.kind.profile(cfg)
    forms, form_why = encoder_forms(cfg, profile)
    form = forms[0] if len(forms) == 1 else "padded"
    # the engine model.onnx is built into: an fp16 graph stays fp16 even when --quantize adds 8-bit routes
    engine = engine_precision(cfg.quantize, cfg.precision) if cfg.precision == "fp32" else cfg.precision
    spec, why = export_spec(cfg, profile, cfg.precision, engine, form)
    base = f"onnx-{spec.precision}"
    plan = Plan(cfg, profile, [Step(base, ExportStep(spec.precision, spec), "subject", "model.onnx")], deploy_source=base,
                deploy_precision=cfg.precision)  # fmt: skip
    if why:
        plan.attention[spec.precision] = why
    if form_why:
        plan.notes.append(form_why)
    fp32_source = _fp32_source(cfg, plan, spec, form)
    target = cfg.target_info
    ctx = PlanContext(target, profile)
    source, transforms = _transforms(cfg, plan, ctx, fp32_source)
    if cfg.quantize:
        from attn_export.compress.quant.int8_encoding import choose_cpu_encoding

        plan.encoding = ctx._encoding = choose_cpu_encoding(cfg.int8_encoding)
        _routes(cfg, plan, ctx, source, transforms)
    if "packed" in forms and len(forms) > 1:
        _add_packed_form(cfg, plan, form_why)
    asked = {"engine": cfg.build_engine, "bundle": cfg.bundle is not None}  # the steps a flag asks for; the others always run
    plan.deploy.extend(DeployStep(kind) for kind in target.deploys if asked.get(kind, True))
    if cfg.triton is not None:
        plan.deploy.append(DeployStep("triton"))
    log.info("plan: %s", plan.describe())
    return plan
