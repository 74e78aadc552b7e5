"""One build plan per TensorRT release: the typing, builder flags and trtexec precision arguments for a graph.

``precision_plan("10.14", "fp8", arch="sm90")`` says how TensorRT ``10.14`` is asked to build a
graph whose GEMMs carry FP8 Q/DQ: weakly typed with ``BuilderFlag.FP8`` + ``FP16``
(``--fp8 --fp16``), or strongly typed when the graph's float parts are already fp16. The
rules, each with its source (``SOURCES``):

* **TensorRT 10.x, fp32 graph**: weakly typed; ``--fp16`` lets the builder pick fp16 (the
  Jetson route). **int8 Q/DQ**: ``--int8 --fp16`` (Q/DQ regions int8, the rest fp16).
  **fp8 Q/DQ**: ``--fp8 --fp16``, as NVIDIA's own FP8 ONNX demos build; trtexec refuses
  ``--fp8`` together with ``--int8``; ``BuilderFlag.FP8`` is deprecated from 10.12
  ("superseded by strong typing") and not allowed with hardware compatibility ``ampere+``.
* **TensorRT 10.x, graph already typed** (fp16 weights, or Q/DQ with fp16 float parts):
  strongly typed (``--stronglyTyped``), no precision flags (trtexec drops them anyway).
* **TensorRT 11.x**: always strongly typed; the precision flags are gone from trtexec and
  ``BuilderFlag.FP16/INT8/FP8`` from the API. ``--stronglyTyped`` is "no longer needed"; 11.0
  and 11.1 still parse it (``tests/fixtures/trtexec``), but the line leaves it out, so that it
  keeps working on a release that drops it. An fp32 graph with Q/DQ
  runs its float layers in fp32 (cast the graph to fp16 first for fp16 float layers).
* **Architecture**: a precision the GPU lacks is refused before any build
  (``gpu_arch.require_precision``): FP8 on Turing/Ampere/Jetson Orin, FP4 before Blackwell.

``BuilderFlag`` names are the bindings' own (checked against the strict doubles of 10.3,
10.14 and 11.4); every trtexec argument is one of the release's recorded options
(``tests/fixtures/trtexec``). ``plan_build(spec, ...)`` is the one plan every builder uses:
the engine builder (``runtime/tensorrt/build.py``), the trtexec line of a Jetson bundle and of
the Triton repository (``runtime/tensorrt/trtexec.py``): the precision part from
``precision_plan``, then DLA, version compatibility and hardware compatibility.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from attn_export.errors import ConfigError
from attn_export.runtime.tensorrt.spec import DLA_RELEASES, EngineSpec, TrtVersion, dla_supported, parse_trt_version
from attn_export.vocab.precisions import PRECISIONS, get_precision, precision_names

__all__ = ["GRAPH_PRECISIONS", "SOURCES", "BuildPlan", "PrecisionPlan", "plan_build", "plan_table", "precision_plan", "trtexec_precision_args"]

log = logging.getLogger(__name__)

GRAPH_PRECISIONS: tuple[str, ...] = tuple(PRECISIONS)  # a graph in any precision of the vocabulary
_FLOATS: tuple[str, ...] = precision_names(export_float=True)  # what a graph's float parts are
FP8_FLAG_DEPRECATED = TrtVersion(10, 12)
# trtexec's precision flag is the BuilderFlag's name in lower case (--fp16, --int8, --fp8, --bf16).
_REDUCED: tuple[str, ...] = tuple(p for p in _FLOATS if p != "fp32")  # export floats a graph or a weak build can run in

SOURCES: dict[str, str] = {
    "weak-fp16": "TensorRT 10.x weak typing: BuilderFlag::kFP16 'Enable FP16 layer selection, with FP32 fallback' (NvInfer.h, release/10.3)",
    "weak-int8": "BuilderFlag::kINT8 'Enable Int8 layer selection, with FP32 fallback with FP16 fallback if kFP16 also specified' (NvInfer.h, release/10.3)",
    "weak-fp8": "NVIDIA/TensorRT release/10.14 demo/Diffusion/demo_diffusion/engine.py builds FP8 Q/DQ ONNX with --fp16 --fp8; "
    "BuilderFlag::kFP8 'deprecated in TensorRT 10.12. Superseded by strong typing', 'not supported when HardwareCompatibilityLevel::kAMPERE_PLUS "
    "is enabled' (NvInfer.h, release/10.14)",
    "fp8-int8": "trtexec: 'Invalid usage, fp8 and int8 aren't allowed to be enabled together' (samples/common/sampleOptions.cpp, release/10.3 and 10.14)",
    "strong": "trtexec --stronglyTyped disables --fp16/--int8/--bf16/--fp8/--int4 with a warning (sampleOptions.cpp, release/10.14)",
    "trt11": "TensorRT 11.x removes all precision flags (--fp16, --int8, --bf16, --fp8, --int4, --best) because all networks are strongly "
    "typed; --stronglyTyped is no longer needed (https://docs.nvidia.com/deeplearning/tensorrt/11.4.1/api/migration/tensorrt-10x-to-11x-trtexec.html); "
    "BuilderFlag::kFP8 and friends removed (tensorrt-10x-to-11x-c-api-reference.html)",
}


@dataclass(frozen=True)
class PrecisionPlan:
    """How one release builds one graph: network typing, ``BuilderFlag`` names, trtexec arguments, why."""

    trt_version: TrtVersion
    graph: str
    float_type: str
    strongly_typed: bool
    builder_flags: tuple[str, ...]
    reasons: tuple[str, ...]
    sources: tuple[str, ...]
    arch: str | None = None

    @property
    def trtexec_args(self) -> tuple[str, ...]:
        return trtexec_precision_args(self)

    def describe(self) -> str:
        how = "strongly typed" if self.strongly_typed else ("weakly typed, " + (" ".join(self.trtexec_args) or "no precision flags"))
        on = f" on {self.arch}" if self.arch else ""
        return f"TensorRT {self.trt_version}{on}, {self.graph} graph ({self.float_type} float parts): {how}"


def trtexec_precision_args(plan: PrecisionPlan) -> tuple[str, ...]:
    """The precision part of the trtexec line: ``--stronglyTyped`` (10.x; 11.x types every network) or the weakly typed flags."""
    if plan.strongly_typed:
        return ("--stronglyTyped",) if plan.trt_version.major < 11 else ()
    return tuple(f"--{f.lower()}" for f in plan.builder_flags if any(f in p.trt_weak_flags for p in PRECISIONS.values()))


def precision_plan(
    trt_version: str | TrtVersion,
    graph: str,
    *,
    float_type: str = "fp32",
    engine_precision: str | None = None,
    arch: str | None = None,
    strongly_typed: bool | None = None,
    hardware_compatibility: str = "none",
) -> PrecisionPlan:
    """The plan for a ``graph`` ("fp32", "fp16", "int8" or "fp8" Q/DQ) on ``trt_version`` (and ``arch``, when known).

    float_type: the float type of a Q/DQ graph's unquantized parts ("fp32" or "fp16").
    engine_precision: for an fp32 graph, "fp32" or "fp16" (weakly typed fp16 on 10.x); ignored otherwise.
    strongly_typed: None = the release's default for this graph; True/False to insist (refused where impossible).
    """
    v = trt_version if isinstance(trt_version, TrtVersion) else parse_trt_version(str(trt_version))
    get_precision(graph, what="a graph precision", choices=GRAPH_PRECISIONS)
    if float_type not in _FLOATS:
        raise ConfigError(f"expected float_type in {', '.join(_FLOATS)}, got {float_type!r}")
    if graph in _REDUCED:
        float_type = graph
    want = engine_precision or ("fp32" if graph == "fp32" else graph)
    if graph == "fp32" and want not in _FLOATS:
        raise ConfigError(f"an fp32 graph builds as {' or '.join(_FLOATS)}, got --precision {want}; quantize the graph first for {want}")
    weak_float = graph == "fp32" and want in _REDUCED  # an fp32 graph the builder may run in a reduced float (weak typing)
    if arch is not None:
        from attn_export.targets.gpu_arch import parse_gpu_arch, require_precision

        arch = parse_gpu_arch(arch)
        needed = want if weak_float else graph if graph in _REDUCED or PRECISIONS[graph].quantized else None
        if needed is not None and PRECISIONS[needed].arch_column:
            require_precision(arch, needed, v)
        if float_type in _REDUCED and PRECISIONS[float_type].arch_column:
            require_precision(arch, float_type, v)
    reasons: list[str] = []
    sources: list[str] = []
    typed_in_graph = float_type in _REDUCED  # reduced-float weights or float parts: the precision already lives in the graph
    if v.major >= 11:
        if strongly_typed is False:
            raise ConfigError(f"TensorRT {v} builds only strongly typed networks; drop --weakly-typed")
        if weak_float:
            raise ConfigError(f"TensorRT {v} removed BuilderFlag.{PRECISIONS[want].trt_weak_flags[0]}: the {want} precision must be in the graph; "
                              f"export with --precision {want}")  # fmt: skip
        reasons.append(f"TensorRT {v} is always strongly typed: each tensor runs in its ONNX type, no precision flags")
        if PRECISIONS[graph].quantized and float_type == "fp32":
            reasons.append(f"the {graph} graph's float layers (Softmax, LayerNorm, fallback GEMMs) run in fp32; cast them to fp16 in the graph for speed")
        sources.append("trt11")
        return _plan(v, graph, float_type, True, (), reasons, sources, arch)
    strongly = typed_in_graph if strongly_typed is None else strongly_typed
    if strongly:
        if weak_float:
            raise ConfigError(f"a strongly typed build runs the graph's own types, and this graph is fp32; export {want} or build weakly typed")
        reasons.append("strongly typed: the precision lives in the graph")
        sources.append("strong")
        return _plan(v, graph, float_type, True, (), reasons, sources, arch)
    flags: tuple[str, ...] = ()
    if weak_float:
        flags = PRECISIONS[want].trt_weak_flags
        reasons.append(f"fp32 graph, {want} chosen by the builder (weak typing)")
        sources.append(f"weak-{want}" if f"weak-{want}" in SOURCES else "weak-fp16")
    elif graph in _REDUCED:  # a reduced-float graph built weakly: the builder needs the flag to keep its layers in that float
        flags = PRECISIONS[graph].trt_weak_flags
        reasons.append(f"{graph} graph built weakly typed: {' '.join(flags)} lets the builder keep its layers in {graph}")
        sources.append(f"weak-{graph}" if f"weak-{graph}" in SOURCES else "weak-fp16")
    elif graph == "int8":
        flags = PRECISIONS[graph].trt_weak_flags
        reasons.append("Q/DQ regions run int8, the rest fp16 (weakly typed)")
        sources.append("weak-int8")
    elif graph == "fp8":
        if hardware_compatibility == "ampere+":
            raise ConfigError("BuilderFlag.FP8 is not supported with --hardware-compatibility ampere+ (Ampere has no FP8); use none")
        flags = PRECISIONS[graph].trt_weak_flags
        reasons.append("FP8 Q/DQ regions run fp8, the rest fp16 (weakly typed, as NVIDIA's FP8 ONNX demos build); never with --int8")
        if v >= FP8_FLAG_DEPRECATED:
            reasons.append(f"BuilderFlag.FP8 is deprecated from TensorRT {FP8_FLAG_DEPRECATED}: a strongly typed build of an fp16-cast graph is the lasting form")
        sources += ["weak-fp8", "fp8-int8"]
    else:
        reasons.append(f"{graph} graph, no reduced precision")
    return _plan(v, graph, float_type, False, flags, reasons, sources, arch)


def plan_table(releases: tuple[str, ...] = ("10.3", "10.14", "11.4")) -> str:
    """Markdown: GPU generation x TensorRT release -> the 8-bit format, attention form and precision flags (docs/targets.md).

    The attention of an 8-bit graph is the decomposed form: its GEMMs carry the Q/DQ and the
    two BMMs stay float unless FP8 MHA (``quantize_attention_bmm``) is asked for.
    """
    from attn_export.targets.gpu_arch import ARCHS, best_8bit, supports

    lines = ["| GPU | TensorRT | 8-bit | attention | precision flags (fp32 graph + Q/DQ) | why |", "|---|---|---|---|---|---|"]
    for a in ARCHS.values():
        for r in releases:
            try:
                fmt, _ = best_8bit(a, r)
            except ConfigError:
                lines.append(f"| {a.name} | {r} | – | – | – | {supports(a, 'int8', r).reason} |")
                continue
            plan = precision_plan(r, fmt, arch=a.name)
            flags = " ".join(plan.trtexec_args) or "none (strongly typed)"
            lines.append(f"| {a.name} | {r} | {fmt} | decomposed | `{flags}` | {'; '.join(plan.reasons[:1])} [{', '.join(plan.sources)}] |")
    return "\n".join(lines)


def _plan(v: TrtVersion, graph: str, float_type: str, strongly: bool, flags: tuple[str, ...], reasons: list[str], sources: list[str],
          arch: str | None) -> PrecisionPlan:  # fmt: skip
    plan = PrecisionPlan(v, graph, float_type, strongly, flags, tuple(reasons), tuple(sources), arch)
    log.debug("%s", plan.describe())
    return plan


@dataclass(frozen=True)
class BuildPlan:
    """What the builder is asked for: network flag and config flags by TensorRT name, and the precision plan behind them."""

    strongly_typed: bool
    builder_flags: tuple[str, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    precision: PrecisionPlan | None = None

    @property
    def trtexec_precision_args(self) -> tuple[str, ...]:
        return () if self.precision is None else self.precision.trtexec_args


def plan_build(spec: EngineSpec, trt_version: str | TrtVersion, graph_float: str, has_qdq: bool, arch: str | None = None) -> BuildPlan:
    """The build of ``spec`` on ``trt_version`` for a graph of float type ``graph_float`` (with Q/DQ or not), on ``arch`` when known."""
    ver = trt_version if isinstance(trt_version, TrtVersion) else parse_trt_version(str(trt_version))
    quantized = PRECISIONS[spec.precision].quantized
    if quantized and not has_qdq:
        raise ConfigError(
            f"{spec.precision} engines need Q/DQ nodes in the ONNX graph (explicit quantization; calibrators are deprecated "
            f"in 10.x and gone in 11); quantize first with --quantize {spec.precision}"
        )
    if spec.precision == "fp32" and graph_float == "fp16":
        raise ConfigError("--precision fp32 asked for a fp16 graph; export the fp32 graph instead")
    graph = spec.precision if quantized else graph_float
    precision = precision_plan(ver, graph, float_type=graph_float, engine_precision=None if quantized else spec.precision, arch=arch or spec.gpu_arch,
                               strongly_typed=spec.strongly_typed, hardware_compatibility=spec.hardware_compatibility)  # fmt: skip
    flags = list(precision.builder_flags)
    notes = [r for r in precision.reasons if "weakly typed" in r]
    if spec.dla_core is not None:
        if not dla_supported(ver):
            raise ConfigError(
                f"--dla-core needs a TensorRT with DLA, got {ver}: DLA exists in {DLA_RELEASES}, "
                f"not in 10.8-11.3; drop --dla-core or build with the device's own TensorRT"
            )
        flags.append("GPU_FALLBACK")
    if spec.version_compatible:
        flags.append("VERSION_COMPATIBLE")
    if spec.hardware_compatibility == "same-compute-capability" and ver < TrtVersion(10, 9):
        raise ConfigError(f"--hardware-compatibility same-compute-capability needs TensorRT >= 10.9, got {ver}")
    log.debug("build plan for TensorRT %s: strongly_typed=%s flags=%s", ver, precision.strongly_typed, flags)
    return BuildPlan(strongly_typed=precision.strongly_typed, builder_flags=tuple(flags), notes=tuple(notes), precision=precision)
