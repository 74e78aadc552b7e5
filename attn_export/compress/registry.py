"""Compression methods as configs, dispatched through one registry (torchao's ``quantize_`` pattern).

A method is a frozen config dataclass plus one function registered for its type:

    @register_method(MyMethod)
    def _my_method(config: MyMethod, ctx: BuildContext, source: Artifact) -> Artifact: ...

``compress(config, ctx, source)`` looks the function up by the config's type and returns the
new artifact; the plan only builds configs, and every subject (reference layer, checkpoint,
layer N of a checkpoint) goes through the same functions. Adding a method is: a config class
here, a function here (or in its own module that registers itself), and the plan line that
asks for it.
"""

from __future__ import annotations

import copy
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from attn_export.artifacts import Artifact, OnnxRuntimeChoice, onnx_runtime_for, ort_runner_factory
from attn_export.errors import ConfigError
from attn_export.vocabulary import LOW_RANK_METHODS, LOW_RANK_TARGET_NAMES

__all__ = [
    "BuildContext",
    "Distill",
    "Int8Dynamic",
    "Int8Qat",
    "Int8Static",
    "LowRank",
    "METHODS",
    "TorchaoInt8",
    "compress",
    "register_method",
]

log = logging.getLogger(__name__)


# -- configs -----------------------------------------------------------------------------
@dataclass(frozen=True)
class LowRank:
    """Factorize Linears keeping ``rank_ratio`` of their parameters (activation-aware SVD by default)."""

    rank_ratio: float = 0.5
    method: str = "activation"
    targets: tuple[str, ...] = ("q", "k", "v", "o")

    def __post_init__(self) -> None:
        if not 0.0 < self.rank_ratio < 1.0:
            raise ConfigError(f"expected a rank ratio in (0, 1), got {self.rank_ratio}; use e.g. 0.5")
        if self.method not in LOW_RANK_METHODS:
            raise ConfigError(f"expected a low-rank method in {LOW_RANK_METHODS}, got {self.method!r}")
        if not self.targets or any(t not in LOW_RANK_TARGET_NAMES for t in self.targets):
            raise ConfigError(f"expected low-rank targets from {','.join(LOW_RANK_TARGET_NAMES)}, got {self.targets}")


@dataclass(frozen=True)
class Distill:
    """Train the compressed student towards the original (the teacher) for up to ``steps`` steps."""

    steps: int = 200

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"expected --distill STEPS >= 1, got {self.steps}")


@dataclass(frozen=True)
class Int8Static:
    """Static Q/DQ, calibrated on the train split: TensorRT's int8 (symmetric, zero point 0).

    ``for_tensorrt`` keeps full-range weights and judges the graph by its reference Q/DQ
    arithmetic; otherwise the weights use the CPU encoding (``reduce_range``) and the graph is
    judged on ONNX Runtime's int8 kernels, as a CPU deployment runs it.

    ``method``: a global calibration method or ``per-tensor``; ``smoothquant_alpha``: a number,
    ``"auto"`` (searched per activation, applied where it helps) or None. ``fallback``:
    ``"auto"`` keeps the most sensitive GEMM groups in float until the goal is met on the
    select split, N keeps exactly N, ``"none"`` quantizes every GEMM
    (``compress/mixed_precision.py``); ``sensitivity_items`` caps the select-split items each
    sensitivity measurement uses.
    """

    method: str = "minmax"
    smoothquant_alpha: float | str | None = None
    per_channel: bool = True
    quantize_attention_bmm: bool = False
    reduce_range: bool = False
    for_tensorrt: bool = False
    session_u8u8: bool = False  # validate (and deploy) with session.x64quantprecision=1
    fallback: str | int = "none"
    sensitivity_items: int = 64

    def __post_init__(self) -> None:
        from attn_export.compress.quant_static import STATIC_CALIB_CHOICES

        if self.method not in STATIC_CALIB_CHOICES:
            raise ConfigError(f"expected --calib-method in {'|'.join(STATIC_CALIB_CHOICES)}, got {self.method!r}")
        if self.for_tensorrt and self.reduce_range:
            raise ConfigError("TensorRT's Q/DQ keeps full-range int8 weights; reduce-range is for ONNX Runtime CPU")
        _check_alpha(self.smoothquant_alpha)
        fb = self.fallback
        if not (fb in ("auto", "none") or (isinstance(fb, int) and not isinstance(fb, bool) and fb >= 0)):
            raise ConfigError(f"expected --int8-fallback auto|none|N (N >= 0), got {fb!r}; use auto")
        if self.sensitivity_items < 1:
            raise ConfigError(f"expected sensitivity_items >= 1, got {self.sensitivity_items}")

    @property
    def float_precision(self) -> str:
        """What a GEMM without Q/DQ runs in: fp16 on TensorRT (weakly typed INT8+FP16 build), fp32 elsewhere."""
        return "fp16" if self.for_tensorrt else "fp32"


@dataclass(frozen=True)
class Int8Dynamic:
    """ONNX Runtime CPU's dynamic int8: int8 weights offline, uint8 activations per batch at run time.

    ``smoothquant_alpha``: a number, ``"auto"`` (searched per activation for the dynamic
    quantizer) or None. ``quantize_embeddings``: int8 embedding tables, one scale per row
    (their own accuracy cost is measured on the select split and reported). ``fuse``: the
    ONNX Runtime CPU fusions that measured faster (BiasGelu; not SkipLayerNorm).
    """

    per_channel: bool = True
    reduce_range: bool = False
    session_u8u8: bool = False  # validate (and deploy) with session.x64quantprecision=1
    smoothquant_alpha: float | str | None = None
    quantize_embeddings: bool = False
    fuse: bool = False  # ONNX Runtime CPU fusions that measured faster (quant_onnx.fuse_for_ort_cpu)

    def __post_init__(self) -> None:
        _check_alpha(self.smoothquant_alpha)


def _check_alpha(alpha: object) -> None:
    if alpha is None or alpha == "auto":
        return
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= float(alpha) <= 1.0:
        raise ConfigError(f"expected --smoothquant ALPHA in [0, 1] or auto, got {alpha!r}; use auto")


@dataclass(frozen=True)
class Int8Qat:
    """int8 recovery by distillation (QAT-lite) of a static int8 stage: fake-quant fine-tuning, then Q/DQ.

    Starts from the static stage it follows (its float module and the GEMM groups it keeps in
    float), trains for up to ``steps`` steps against the fp32 teacher on the train split
    (early stopping on the select split), and writes a Q/DQ graph with the trained weights
    and ranges (``learn_scales``) or the calibrated ones (frozen). ``static`` is the config
    of that stage (calibration method, target, CPU encoding).
    """

    steps: int = 200
    learn_scales: bool = True
    static: Int8Static = field(default_factory=Int8Static)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"expected --int8-qat STEPS >= 1, got {self.steps}")


@dataclass(frozen=True)
class TorchaoInt8:
    """torchao's eager int8 (``quantize_``): the PyTorch accuracy reference; not exportable."""

    mode: str = "int8-dynamic"


# -- the registry ------------------------------------------------------------------------
@dataclass
class BuildContext:
    """What every method needs besides its config: the subject, where to write, how to run."""

    subject: Any
    out: Path
    target: Any
    fp32_spec: Any  # ExportSpec of the target at fp32
    threads: int
    say: Callable[[str], None] = field(default=lambda msg: None)

    def runtime(self, qdq_reference: bool = False, u8u8: bool = False) -> OnnxRuntimeChoice:
        return onnx_runtime_for(self.target, qdq_reference, u8u8)

    def onnx_artifact(
        self, name: str, path: Path, precision: str, tolerance_key: str, qdq_reference: bool = False, u8u8: bool = False, **kw: Any
    ) -> Artifact:
        """An artifact for an ONNX file, run where the target says (stand-ins named)."""
        choice = self.runtime(qdq_reference, u8u8)
        art = Artifact(
            name=name, precision=precision, tolerance_key=tolerance_key,
            make_runner=ort_runner_factory(path, choice, self.threads, name), path=path,
            size_bytes=path.stat().st_size, label=choice.label(name), **kw,
        )  # fmt: skip
        art.details["runtime"] = choice.record()
        return art


C = TypeVar("C")
Method = Callable[[Any, BuildContext, Artifact, str, str], Artifact]
METHODS: dict[type, Method] = {}


def register_method(config_type: type[C]) -> Callable[[Method], Method]:
    """Register the function that applies configs of ``config_type``."""

    def deco(fn: Method) -> Method:
        METHODS[config_type] = fn
        return fn

    return deco


def compress(config: Any, ctx: BuildContext, source: Artifact, name: str, filename: str) -> Artifact:
    """Apply the method registered for ``type(config)`` to ``source``; the result is stage ``name``."""
    fn = METHODS.get(type(config))
    if fn is None:
        raise ConfigError(f"no compression method is registered for {type(config).__name__}; known: {', '.join(t.__name__ for t in METHODS)}")
    return fn(config, ctx, source, name, filename)


def _params(module: Any) -> int:
    return int(sum(p.numel() for p in module.parameters()))


def _tolerance_after(source: Artifact, lossy: bool) -> str:
    """int8 of a low-rank student is held to the combined bar (both errors add)."""
    low_rank = source.tolerance_key in ("lowrank", "lowrank-int8")
    if lossy:
        return "lowrank-int8" if low_rank else "int8"
    return "lowrank"


# -- methods -----------------------------------------------------------------------------
@register_method(LowRank)
def _low_rank(config: LowRank, ctx: BuildContext, source: Artifact, name: str, filename: str) -> Artifact:
    from attn_export.compress.lowrank import LowRankConfig

    ctx.say(f"low-rank: {config.method} SVD at {config.rank_ratio} of {','.join(config.targets)} parameters")
    student = copy.deepcopy(source.module)
    summary = ctx.subject.low_rank(student, LowRankConfig(rank_ratio=config.rank_ratio, method=config.method, targets=config.targets))
    ctx.say(summary.describe())
    path = ctx.out / filename
    result = ctx.subject.export(student, path, ctx.fp32_spec)
    return ctx.onnx_artifact(
        name, path, "fp32", "lowrank", module=student, onnx_fp32=path, params=_params(student),
        details={"low_rank": summary.to_dict(), "export": result.to_dict()},
    )  # fmt: skip


@register_method(Distill)
def _distill(config: Distill, ctx: BuildContext, source: Artifact, name: str, filename: str) -> Artifact:
    ctx.say(f"distillation: up to {config.steps} steps, early stopping on the select split")
    student = copy.deepcopy(source.module)
    settings = replace(ctx.subject.default_distill_config, steps=config.steps)
    summary = ctx.subject.distill(student, settings)
    ctx.say(summary.describe())
    path = ctx.out / filename
    result = ctx.subject.export(student, path, ctx.fp32_spec)
    details = {"distill": {k: v for k, v in summary.to_dict().items() if k != "history"}, "export": result.to_dict()}
    return ctx.onnx_artifact(name, path, "fp32", "lowrank", module=student, onnx_fp32=path, params=_params(student), details=details)


@register_method(Int8Static)
def _int8_static(config: Int8Static, ctx: BuildContext, source: Artifact, name: str, filename: str) -> Artifact:
    from attn_export.compress.mixed_precision import EMBEDDING_GOAL, FallbackGoal, mixed_precision_
    from attn_export.compress.quant_static import StaticQuantSpec, quantize_static_onnx

    if source.onnx_fp32 is None:
        raise ConfigError(f"{name}: static int8 starts from an fp32 ONNX export, and {source.name} has none")
    spec = StaticQuantSpec(
        method=config.method, smoothquant_alpha=config.smoothquant_alpha, per_channel=config.per_channel,
        quantize_attention_bmm=config.quantize_attention_bmm, reduce_range=config.reduce_range,
    )  # fmt: skip
    weights = "full-range (TensorRT)" if config.for_tensorrt else ("7-bit reduce-range" if config.reduce_range else "full-range")
    sq = "" if config.smoothquant_alpha is None else f", SmoothQuant {config.smoothquant_alpha}"
    ctx.say(f"int8 static Q/DQ: {config.method} calibration{sq}, {weights} weights, fallback {config.fallback}")
    path = ctx.out / filename
    key = _tolerance_after(source, lossy=True)
    details: dict[str, Any] = {"route": "static"}
    with tempfile.TemporaryDirectory(prefix="attn_export_q8s_") as tmp:
        all_int8 = path if config.fallback == "none" else Path(tmp) / "all_int8.onnx"
        float_graph = Path(tmp) / "float.onnx"
        result = quantize_static_onnx(source.onnx_fp32, all_int8, ctx.subject.calibration(), spec, float_model_out=float_graph)
        if config.fallback != "none":
            # the encoder's static bar (issue 11) for a dense model; a low-rank student is held to its tolerance only
            goal = EMBEDDING_GOAL if ctx.subject.kind == "encoder" and key == "int8" else FallbackGoal()
            # the cost is a speed figure: int8 kernels (QDQ fusion on) against the float GEMMs, whatever judges accuracy
            timing = {"feed": ctx.subject.latency_feed(), "qdq_fusion": True, "u8u8": config.session_u8u8}
            mp = mixed_precision_(all_int8, float_graph, path, ctx.subject, key, goal, config.fallback, config.float_precision,
                                  config.sensitivity_items, ctx.threads, timing, ctx.say)  # fmt: skip
            details["mixed_precision"] = mp.to_dict()
    from attn_export.compress.qdq import inspect_qdq

    summary = inspect_qdq(path)
    quant = result.to_dict()
    quant.update(size_bytes=path.stat().st_size, n_quantize_linear=summary.n_quantize_linear, n_dequantize_linear=summary.n_dequantize_linear)
    details.update(quantization=quant, size_ratio_vs_fp32=path.stat().st_size / source.onnx_fp32.stat().st_size)
    return ctx.onnx_artifact(
        name, path, "int8", key, qdq_reference=config.for_tensorrt, u8u8=config.session_u8u8,
        module=source.module, params=source.params, route="static", details=details,
    )  # fmt: skip


@register_method(Int8Dynamic)
def _int8_dynamic(config: Int8Dynamic, ctx: BuildContext, source: Artifact, name: str, filename: str) -> Artifact:
    """Exported with unfused Q/K/V: ONNX Runtime CPU runs three DynamicQuantizeMatMuls faster than
    one fused QKV GEMM followed by the Split that copies its output (default layer: 20.4 vs 22.0 ms;
    MiniLM: 3-6% less CPU time per batch)."""
    from attn_export.compress.quant_onnx import quantize_dynamic_onnx

    extras = [w for w, on in (("SmoothQuant " + str(config.smoothquant_alpha), config.smoothquant_alpha is not None),
                              ("int8 embedding rows", config.quantize_embeddings), ("ORT CPU fusions", config.fuse)) if on]  # fmt: skip
    ctx.say(f"int8 dynamic: ONNX Runtime quantize_dynamic ({'per-channel' if config.per_channel else 'per-tensor'}, "
            f"{'7-bit reduce-range' if config.reduce_range else 'full-range'} weights{', ' + ', '.join(extras) if extras else ''})")  # fmt: skip
    path = ctx.out / filename
    key = _tolerance_after(source, lossy=True)
    details: dict[str, Any] = {"route": "dynamic"}
    with tempfile.TemporaryDirectory(prefix="attn_export_dyn_") as tmp:
        unfused = Path(tmp) / "unfused.onnx"
        float_tables = Path(tmp) / "float_tables.onnx"
        # ONNX Runtime's dynamic quantizer quantizes MatMul, not the Gemm the long-seq form writes for Linears
        ctx.subject.export(source.module, unfused, replace(ctx.fp32_spec, fuse_qkv=False, precision="fp32", linear_gemm=False))
        calib = ctx.subject.calibration() if config.smoothquant_alpha is not None else None
        result = quantize_dynamic_onnx(unfused, path, per_channel=config.per_channel, reduce_range=config.reduce_range,
                                       smoothquant_alpha=config.smoothquant_alpha, calib=calib, quantize_embeddings=config.quantize_embeddings,
                                       fuse=config.fuse, unquantized_embeddings_out=float_tables)  # fmt: skip
        if result.embeddings.get("tables"):
            details["embedding_quantization"] = _table_cost(ctx, path, float_tables, config.session_u8u8)
    details["quantization"] = result.to_dict()
    if source.onnx_fp32 is not None:
        details["size_ratio_vs_fp32"] = result.size_bytes / source.onnx_fp32.stat().st_size
    return ctx.onnx_artifact(name, path, "int8", key, u8u8=config.session_u8u8,
                             module=source.module, params=source.params, route="dynamic", details=details)  # fmt: skip


def _table_cost(ctx: BuildContext, with_int8: Path, with_float: Path, u8u8: bool) -> dict[str, Any]:
    """The int8 embedding tables' own accuracy cost: the same model with float tables, both on the whole select split."""
    choice = ctx.runtime(u8u8=u8u8)
    errors = {}
    for label, p in (("float_tables", with_float), ("int8_tables", with_int8)):
        runner = ort_runner_factory(p, choice, ctx.threads, label)()
        try:
            errors[label] = float(ctx.subject.quick_error(runner, "select", 1 << 30))
        finally:
            runner.deactivate()
    cost = errors["int8_tables"] - errors["float_tables"]
    ctx.say(f"int8 embedding tables: select-split error {errors['float_tables']:.2e} -> {errors['int8_tables']:.2e} ({cost:+.2e})")
    return {"select_error_float_tables": errors["float_tables"], "select_error_int8_tables": errors["int8_tables"], "cost": cost,
            "error": "1 - mean embedding cosine" if ctx.subject.kind == "encoder" else "relative L2 of the output"}  # fmt: skip


@register_method(Int8Qat)
def _int8_qat(config: Int8Qat, ctx: BuildContext, source: Artifact, name: str, filename: str) -> Artifact:
    import onnx_ir as ir

    from attn_export.compress.mixed_precision import apply_fallback
    from attn_export.compress.qat import QatConfig, qat_
    from attn_export.compress.qdq import inspect_qdq
    from attn_export.compress.quant_static import StaticQuantSpec, quantize_static_onnx

    if source.route != "static" or source.module is None:
        raise ConfigError(f"{name}: QAT-lite refines a static int8 stage, and {source.name} is not one")
    static = config.static
    mp = source.details.get("mixed_precision") or {}
    float_groups = list(mp.get("float_groups") or [])
    ctx.say(f"int8 QAT-lite: up to {config.steps} steps through fake int8 ({'learned' if config.learn_scales else 'frozen'} ranges), "
            f"{len(float_groups)} GEMM group(s) kept float as in {source.name}")  # fmt: skip
    student = copy.deepcopy(source.module)
    method = static.method
    qat_config = QatConfig(steps=config.steps, learn_scales=config.learn_scales, method=method, smoothquant=static.smoothquant_alpha is not None)
    summary = qat_(student, source.module, ctx.subject, set(float_groups), qat_config)
    ctx.say(summary.describe())
    by_label, smoothing = dict(summary.thresholds), dict(summary.scales)
    for path in list(summary.thresholds):  # the export fuses plain Q/K/V into one w_qkv GEMM reading the same input
        if path.endswith(".w_q"):
            fused = path[: -len("w_q")] + "w_qkv"
            by_label[fused] = summary.thresholds[path]
            if path in summary.scales:
                smoothing[fused] = summary.scales[path]
    path = ctx.out / filename
    spec = StaticQuantSpec(method=method, smoothquant_alpha=None, per_channel=static.per_channel,
                           quantize_attention_bmm=static.quantize_attention_bmm, reduce_range=static.reduce_range)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="attn_export_qat_") as tmp:
        fp32 = Path(tmp) / "student.onnx"
        ctx.subject.export(student, fp32, ctx.fp32_spec)
        all_int8, float_graph = Path(tmp) / "all_int8.onnx", Path(tmp) / "float.onnx"
        result = quantize_static_onnx(fp32, all_int8, ctx.subject.calibration(), spec, float_model_out=float_graph,
                                      range_overrides=by_label, smoothing=smoothing or None)  # fmt: skip
        moved = apply_fallback(all_int8, ir.load(str(float_graph)), float_groups, path)
    qdq = inspect_qdq(path)
    quant = result.to_dict()
    quant.update(size_bytes=path.stat().st_size, n_quantize_linear=qdq.n_quantize_linear, n_dequantize_linear=qdq.n_dequantize_linear)
    details: dict[str, Any] = {"route": "static", "qat": {k: v for k, v in summary.to_dict().items() if k != "thresholds"},
                               "quantization": quant, "refines": source.name, "gemms_in_float": moved}  # fmt: skip
    return ctx.onnx_artifact(
        name, path, "int8", source.tolerance_key, qdq_reference=static.for_tensorrt, u8u8=static.session_u8u8,
        module=student, params=source.params, route="static", details=details,
    )  # fmt: skip


def module_bytes(model: Any) -> int:
    """Bytes of parameters and buffers as stored (torchao's int8 tensors count 1 byte per element)."""
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        inner = [getattr(t, a) for a in ("qdata", "int_data", "scale", "zero_point") if hasattr(t, a)]
        total += sum(i.numel() * i.element_size() for i in inner) if inner else t.numel() * t.element_size()
    return total


@register_method(TorchaoInt8)
def _torchao(config: TorchaoInt8, ctx: BuildContext, source: Artifact, name: str, filename: str) -> Artifact:
    from attn_export.compress.quant_eager import quantize_eager_

    ctx.say(f"int8 torchao: quantize_ with {config.mode} (eager reference, not exported)")
    qmodel = quantize_eager_(source.module, config.mode)  # works on a copy
    subject = ctx.subject
    return Artifact(
        name=name, precision="int8", tolerance_key=_tolerance_after(source, lossy=True),
        make_runner=lambda: subject.eager_runner(qmodel, name=name), module=qmodel, size_bytes=module_bytes(qmodel),
        params=source.params, route="torchao", deployable=False,
        details={"route": "torchao", "quantization": {"route": "torchao", "mode": config.mode}, "runtime": {"backend": "torch eager (torchao)"}},
    )  # fmt: skip
