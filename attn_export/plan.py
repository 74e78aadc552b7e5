"""``make_plan``: a ``RunConfig`` and a subject become the ordered list of stages to build.

Nothing runs here: the plan says what to build from what (each step names its source step),
which built artifacts compete in a selection (the int8 routes), and what is deployed. The
runner (``attn_export.runner``) executes it; the sweep builds its plans from the same steps.

    onnx-<precision> [onnx-fp32] -> lowrank -> lowrank+distill -> <prefix>-{static,dynamic,torchao}
      -> select int8 (model.int8.onnx) -> TensorRT check -> engine -> Jetson bundle / Triton repository

Which int8 routes a target gets, and in which order it prefers them when they are equally
fast, is decided here (``INT8_PREFERENCE``), in one place.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from attn_export.compress.registry import Distill, Int8Dynamic, Int8Qat, Int8Static, LowRank, TorchaoInt8

__all__ = ["DeployStep", "ExportStep", "INT8_PREFERENCE", "Plan", "Selection", "Step", "make_plan"]

log = logging.getLogger(__name__)

# Routes a target can deploy, most preferred first. When two routes that meet the tolerance
# are within the timing noise of each other, the earlier one wins, so the same command ships
# the same route run after run. ORT CPU: dynamic needs no calibration data and is its
# fastest; TensorRT targets can only take static Q/DQ.
INT8_PREFERENCE: dict[str, tuple[str, ...]] = {
    "ort-cpu": ("dynamic", "static"),
    "ort-cuda": ("static", "dynamic"),
    "tensorrt": ("static",),
    "jetson": ("static",),
}
NOISE_BAND = 0.10  # routes within 10% of the fastest count as equally fast (two routes swapped by 7% between runs on a shared box)


@dataclass(frozen=True)
class ExportStep:
    """Export the subject module at ``precision`` with ``spec``."""

    precision: str
    spec: Any


@dataclass(frozen=True)
class Step:
    """Build stage ``name`` by applying ``config`` (an ``ExportStep`` or a method config) to ``source``.

    ``source`` is ``"subject"`` (the eager reference) or an earlier step's name.
    ``required``: a failing stage fails the run; candidates of a selection and intermediate
    students are reported but only their selection (or their chain's last stage) decides.
    """

    name: str
    config: Any
    source: str
    filename: str
    required: bool = True


@dataclass(frozen=True)
class Selection:
    """Pick the fastest of ``candidates`` that meets its tolerance on the select split; copy it to ``filename``."""

    key: str
    candidates: tuple[str, ...]
    preference: tuple[str, ...]
    filename: str
    band: float = NOISE_BAND


@dataclass(frozen=True)
class DeployStep:
    """``trt-check`` | ``engine`` | ``bundle`` | ``triton`` of the deployed ONNX model."""

    kind: str


@dataclass
class Plan:
    steps: list[Step]
    selections: list[Selection] = field(default_factory=list)
    deploy: list[DeployStep] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # stage name -> why the run does not build it
    encoding: Any = None  # compress.int8_encoding.EncodingChoice, when int8 runs
    fp32_spec: Any = None  # the ExportSpec every fp32 graph of the run uses (compression sources, students)
    attention: dict[str, str] = field(default_factory=dict)  # graph precision -> why its attention form was chosen
    deploy_source: str = ""  # the step (or "select:int8") whose ONNX is deployed
    deploy_precision: str = "fp32"

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def describe(self) -> str:
        parts = [s.name for s in self.steps] + [f"select {s.key}" for s in self.selections] + [d.kind for d in self.deploy]
        return " -> ".join(parts)


def _int8_steps(cfg: Any, source: str, prefix: str, encoding: Any) -> tuple[list[Step], dict[str, str]]:
    from attn_export.compress.quant_onnx import DYNAMIC_NOT_FOR_TENSORRT

    target = cfg.target_info
    wanted = {"auto": ["static", "dynamic", "torchao"]}.get(cfg.int8_mode, [cfg.int8_mode])
    if cfg.with_torchao and "torchao" not in wanted:
        wanted.append("torchao")
    steps: list[Step] = []
    notes: dict[str, str] = {}
    for route in wanted:
        name, filename = f"{prefix}-{route}", f"model.{prefix}-{route}.onnx"
        if route == "static":
            config: Any = Int8Static(
                method=cfg.resolved_calib_method, smoothquant_alpha=cfg.resolved_smoothquant, quantize_attention_bmm=target.quantize_attention_bmm,
                reduce_range=bool(encoding.reduce_range) and not target.is_tensorrt, for_tensorrt=target.is_tensorrt,
                session_u8u8=bool(encoding.session_u8u8) and not target.is_tensorrt, fallback=cfg.int8_fallback,
            )  # fmt: skip
        elif route == "dynamic":
            if target.is_tensorrt:  # --int8-mode dynamic on TensorRT is refused by RunConfig
                notes[name] = f"int8 route dynamic skipped for target {target.name}: {DYNAMIC_NOT_FOR_TENSORRT}"
                continue
            # int8 embedding rows and ORT's BiasGelu: measured on MiniLM; reference layers have neither embeddings nor GELU
            config = Int8Dynamic(per_channel=True, reduce_range=bool(encoding.reduce_range), session_u8u8=bool(encoding.session_u8u8),
                                 smoothquant_alpha=cfg.resolved_smoothquant, quantize_embeddings=cfg.is_checkpoint, fuse=cfg.is_checkpoint)  # fmt: skip
        else:
            if not (cfg.int8_mode == "torchao" or cfg.with_torchao):
                from attn_export.compress.quant_eager import TORCHAO_OPT_IN_NOTE

                notes[name] = TORCHAO_OPT_IN_NOTE
                continue
            config = TorchaoInt8()
            filename = ""
        steps.append(Step(name, config, source, filename, required=False))
        if route == "static" and cfg.int8_qat is not None:  # QAT-lite refines the static stage; both compete in the selection
            qat = Int8Qat(steps=int(cfg.int8_qat), learn_scales=cfg.int8_qat_scales == "learned", static=config)
            steps.append(Step(f"{name}+qat", qat, name, f"model.{prefix}-static-qat.onnx", required=False))
    return steps, notes


def _head_dim(subject: Any) -> int | None:
    info = subject.model_info() if subject is not None else {}
    return int(info["d_model"]) // int(info["heads"]) if info.get("d_model") and info.get("heads") else None


def export_spec(cfg: Any, subject: Any, graph_precision: str, engine_precision: str) -> tuple[Any, str | None]:
    """The export for one graph of the run, and why its attention form was chosen (TensorRT targets).

    On a TensorRT target without an explicit ``--attention``, the ONNX ``Attention`` op is
    exported only where TensorRT's IAttention has a fused kernel for this precision and head
    size; IAttention is not decomposable by default, so anywhere else the decomposed form
    (which TensorRT always builds) is exported instead (``export.trt_attention``).
    """
    import dataclasses

    spec = cfg.export_spec(graph_precision)
    target = cfg.target_info
    if cfg.attention not in (None, "auto"):
        return spec, None  # the user's explicit form
    if not target.is_tensorrt:
        from attn_export.export.form_choice import choose_attention_form

        layer = cfg.resolved_layer if not cfg.is_checkpoint else "transformer"
        mask = cfg.resolved_mask if not cfg.is_checkpoint else "padding"
        form, reason = choose_attention_form(target, cfg.max_seq_len, mask, layer=layer)
        if form != spec.attention:
            spec = dataclasses.replace(spec, attention=form, opset=None)
            return spec, f"{form} (--attention auto): {reason}"
        return spec, None
    from attn_export.checks.trt_attention import trt_attention_form

    form, reason = trt_attention_form(engine_precision, _head_dim(subject), cfg.resolved_trt_version, target.strongly_typed,
                                      target.quantize_attention_bmm)  # fmt: skip
    if form != spec.attention:
        spec = dataclasses.replace(spec, attention=form)
    return spec, f"{form} for TensorRT {cfg.resolved_trt_version} at {engine_precision}: {reason}"


def make_plan(cfg: Any, subject: Any) -> Plan:
    """The stages ``cfg`` asks for, for ``subject`` (nothing is built here)."""
    from attn_export.compress.int8_encoding import choose_cpu_encoding

    spec, why = export_spec(cfg, subject, cfg.precision, "int8" if cfg.quantize and cfg.precision == "fp32" else cfg.precision)
    base = f"onnx-{spec.precision}"
    steps = [Step(base, ExportStep(spec.precision, spec), "subject", "model.onnx")]
    plan = Plan(steps, deploy_source=base, deploy_precision=cfg.precision)
    if why:
        plan.attention[spec.precision] = why
    fp32_spec, why32 = export_spec(cfg, subject, "fp32", "int8" if cfg.quantize else "fp32")
    if cfg.quantize and fp32_spec.attention == "long-seq":
        # Static Q/DQ cannot yet rewrite the long-seq graph's Loop/If subgraphs (onnx.checker refuses the
        # result), so the int8 routes start from the target's decomposed form; model.onnx keeps long-seq.
        import dataclasses

        fp32_spec = dataclasses.replace(fp32_spec, attention=cfg.target_info.attention, opset=None, linear_gemm=None)
        why32 = (f"{fp32_spec.attention} for the int8 routes' source graph: static Q/DQ cannot yet quantize the long-seq form's "
                 "subgraphs (model.onnx keeps long-seq)")  # fmt: skip
    plan.fp32_spec = fp32_spec
    if why32:
        plan.attention["fp32" if spec.precision != "fp32" or fp32_spec == spec else "fp32 (int8 source)"] = why32
    fp32_source = base
    if cfg.compresses and fp32_spec != spec:
        name = "onnx-fp32" if spec.precision != "fp32" else f"onnx-fp32-{fp32_spec.attention}"
        steps.append(Step(name, ExportStep("fp32", fp32_spec), "subject", f"model.{name.removeprefix('onnx-')}.onnx"))
        fp32_source = name
    source = fp32_source
    if cfg.low_rank is not None:
        low_rank = LowRank(rank_ratio=float(cfg.low_rank), method=cfg.low_rank_method, targets=cfg.resolved_low_rank_targets)
        steps.append(Step("lowrank", low_rank, fp32_source, "model.lowrank.onnx", required=cfg.distill is None))
        source = "lowrank"
        if cfg.distill is not None:
            steps.append(Step("lowrank+distill", Distill(steps=int(cfg.distill)), "lowrank", "model.lowrank-distilled.onnx"))
            source = "lowrank+distill"
        plan.deploy_source, plan.deploy_precision = source, "fp32"
    if cfg.quantize == "int8":
        plan.encoding = choose_cpu_encoding(cfg.int8_encoding)
        prefix = "int8" if cfg.low_rank is None else "lowrank-int8"
        int8_steps, skipped = _int8_steps(cfg, source, prefix, plan.encoding)
        steps.extend(int8_steps)
        plan.skipped.update(skipped)
        plan.notes.extend(skipped.values())
        preference = INT8_PREFERENCE.get(cfg.target, ("static", "dynamic"))
        candidates = tuple(s.name for s in int8_steps if not isinstance(s.config, TorchaoInt8))
        if candidates:
            plan.selections.append(Selection("int8", candidates, preference, "model.int8.onnx"))
            plan.deploy_source, plan.deploy_precision = "select:int8", "int8"
        else:
            # torchao alone is a reference, not a deployable model: its stage decides the run
            steps[-1] = Step(steps[-1].name, steps[-1].config, steps[-1].source, steps[-1].filename, required=True)
    target = cfg.target_info
    if target.is_tensorrt:
        plan.deploy.append(DeployStep("trt-check"))
        if cfg.build_engine:
            plan.deploy.append(DeployStep("engine"))
        if cfg.bundle is not None:
            plan.deploy.append(DeployStep("bundle"))
    if cfg.triton is not None:
        plan.deploy.append(DeployStep("triton"))
    log.info("plan: %s", plan.describe())
    return plan
