"""Build a TensorRT engine from ONNX with the Python API, after the static check passes.

``build_engine(onnx, engine, EngineSpec(precision="fp16", profiles=...))`` runs
``check_trt_compat`` against the installed TensorRT first (errors abort before the parser
sees the model), then: parse (every parser error is listed), one optimization profile
over (batch, seq) (one per length bucket with ``length_buckets``), fp16/int8 the way the version wants it (builder flags on weakly typed
10.x, strong typing on 11), workspace limit, timing cache reused across builds, hardware
and version compatibility, optimisation level, DLA with GPU fallback, all on the GPU
``device`` selects. The engine is deserialised and inspected before anything is written,
then written atomically with its sidecar and the inspector's layer list; the result says
whether attention became a fused MHA kernel (an unfused attention is a warning with the
likely reason from the static check) and carries the engine's attestation (``attest``): per
GEMM group the precision it runs against the one the plan placed it in, fused attention
against the static check's kernel table. Its violations are warnings here; the run fails on
them (``pipeline.deploy``) unless ``--accept-engine-mismatch`` accepts them.

The timing cache follows trtexec (release/10.3 samples/utils/timingCache.cpp): loaded with
``ignore_mismatch=True``, the result of ``set_timing_cache`` checked, and a cache that
TensorRT refuses (another TensorRT version, or corrupt) is a warning and a fresh cache,
never a failed build.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import onnx

from attn_export.outdir.atomic import atomic_write_bytes
from attn_export.host.lazy import require
from attn_export.checks.trt_attention import find_attention_blocks
from attn_export.checks.trt_compat import CompatReport, check_trt_compat
from attn_export.errors import ConfigError, EngineError
from attn_export.outdir.manifest import sha256_file
from attn_export.runtime.tensorrt.attest import EngineExpectation, InspectorFormatError, PlannedGemm, attest_engine
from attn_export.runtime.tensorrt.build_plan import BuildPlan, plan_build
from attn_export.runtime.tensorrt.runner import deserialize, gpu_identity, select_device
from attn_export.runtime.tensorrt.sidecar import (
    EngineSidecar,
    detect_fused_attention,
    layers_path_for,
    sidecar_path_for,
    write_sidecar,
)
from attn_export.runtime.tensorrt.spec import (
    HARDWARE_COMPATIBILITY,
    EngineSpec,
)
from attn_export.vocab.precisions import float_precision_of

__all__ = ["EngineBuildResult", "Preflight", "attach_timing_cache", "build_engine", "engine_expectation", "preflight", "save_timing_cache",
           "unfused_warning"]

log = logging.getLogger(__name__)


@dataclass
class EngineBuildResult:
    engine_path: str
    sidecar_path: str
    layers_path: str
    tensorrt_version: str
    precision: str
    strongly_typed: bool
    builder_flags: list[str]
    build_seconds: float
    size_bytes: int
    attention_blocks: int
    attention_fused: int
    fused_layers: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    attestation: dict[str, Any] | None = None  # attest.Attestation.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        typing_ = "strongly typed" if self.strongly_typed else f"flags {','.join(self.builder_flags) or 'none'}"
        return (
            f"TensorRT {self.tensorrt_version} {self.precision} engine ({typing_}), {self.size_bytes / 2**20:.1f} MiB in "
            f"{self.build_seconds:.1f} s: attention fused {self.attention_fused}/{self.attention_blocks}"
        )


@dataclass(frozen=True)
class Preflight:
    report: CompatReport
    plan: BuildPlan
    attention_blocks: int
    onnx_sha256: str
    graph_float: str = "fp32"  # the graph's float type (an export precision's name)


def preflight(onnx_path: str | os.PathLike[str], spec: EngineSpec, trt_version: str) -> Preflight:
    """Static check + build plan for ``trt_version``; raises CompatibilityError/ConfigError."""
    path = Path(onnx_path)
    if not path.is_file():
        raise ConfigError(f"ONNX model {path} does not exist; export it first")
    report = check_trt_compat(path, trt_version, spec.profiles, spec.precision, gpu_arch=spec.gpu_arch)
    report.raise_if_failed()
    import onnx_ir as ir

    proto = onnx.load(str(path), load_external_data=False)
    types = {t.data_type for t in proto.graph.initializer} | {i.type.tensor_type.elem_type for i in proto.graph.input}
    has_qdq = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in proto.graph.node)
    graph_float = float_precision_of(onnx.TensorProto.DataType.Name(t) for t in types)
    plan = plan_build(spec, trt_version, graph_float, has_qdq)
    blocks = len(find_attention_blocks(ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(proto))))
    return Preflight(report, plan, blocks, sha256_file(path), graph_float)


def _fusion_reasons(report: CompatReport) -> list[str]:
    """The static check's reasons an attention will not fuse (its kernel table: head size, sequence, fp32 softmax island)."""
    return [f.message for f in report.findings if f.op in ("Attention", "Softmax") and f.severity in ("warning", "info")]


def engine_expectation(pre: Preflight, spec: EngineSpec, gemms: tuple[PlannedGemm, ...] = ()) -> EngineExpectation:
    """What the engine must run: ``gemms`` (a ``"float"`` GEMM becomes the float type this build runs: fp16 under a weakly
    typed ``FP16``/``BF16`` flag, else the graph's own), and fused attention where the static check finds no reason against it."""
    flags = set(pre.plan.builder_flags)
    weak = next((p for f, p in (("FP16", "fp16"), ("BF16", "bf16")) if f in flags), None) if not pre.plan.strongly_typed else None
    floating = weak or pre.graph_float
    resolved = tuple(PlannedGemm(g.node, g.group, floating if g.precision == "float" else g.precision) for g in gemms)
    fuses = pre.attention_blocks > 0 and not _fusion_reasons(pre.report)
    return EngineExpectation(spec.precision, resolved, pre.attention_blocks, fuses)


def unfused_warning(fused: int, blocks: int, softmax_layers: list[str], report: CompatReport) -> str:
    """The report line for an attention TensorRT did not fuse, with the static check's reasons."""
    reasons = _fusion_reasons(report)
    left = f"; standalone softmax layers: {', '.join(softmax_layers[:3])}" if softmax_layers else ""
    why = "; likely: " + " | ".join(reasons) if reasons else "; no static reason found (inspect the .layers.json)"
    return f"attention not fused into an MHA kernel ({fused} fused of {blocks}{left}){why}"


def _atomic_write_bytes(path: Path, data: bytes | memoryview) -> None:
    atomic_write_bytes(path, data)


def _parser_errors(parser: Any) -> list[str]:
    out = []
    for i in range(parser.num_errors):
        err = parser.get_error(i)
        out.append(f"{err.node_name() or f'node {err.node()}'} ({err.node_operator()}): {err.desc()}")
    return out


def attach_timing_cache(config: Any, cache_path: Path | None) -> list[str]:
    """Give ``config`` a timing cache (the file's, else a fresh one); returns warnings.

    Mirrors trtexec's buildTimingCacheFromFile: ``create_timing_cache`` may return None for
    a blob TensorRT cannot read, and ``set_timing_cache`` returns False for a cache it
    refuses. ``ignore_mismatch=True`` (as trtexec passes) accepts a cache recorded on a GPU
    with other CUDA device properties; NvInfer.h warns that such a cache may lead to
    functional or performance bugs, so keep one cache file per GPU model.
    """
    if cache_path is None:
        return []
    warnings: list[str] = []
    blob = cache_path.read_bytes() if cache_path.is_file() else b""
    cache = config.create_timing_cache(blob)
    if cache is not None and config.set_timing_cache(cache, ignore_mismatch=True):
        return warnings
    if blob:
        warnings.append(
            f"timing cache {cache_path} was refused by this TensorRT (another TensorRT version, or a damaged file); "
            f"building with a fresh cache, which replaces it"
        )
        cache = config.create_timing_cache(b"")
        if cache is not None and config.set_timing_cache(cache, ignore_mismatch=True):
            return warnings
    warnings.append(f"TensorRT could not create or attach a timing cache; building without one and leaving {cache_path} untouched")
    return warnings


def save_timing_cache(config: Any, cache_path: Path | None) -> list[str]:
    """Write the config's (updated) timing cache back; ``get_timing_cache`` may return None."""
    if cache_path is None:
        return []
    cache = config.get_timing_cache()
    if cache is None:
        return [f"TensorRT returned no timing cache after the build; {cache_path} not updated"]
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_bytes(cache_path, memoryview(cache.serialize()))
    return []


def build_engine(onnx_path: str | os.PathLike[str], engine_path: str | os.PathLike[str], spec: EngineSpec, device: int = 0,
                 gemms: tuple[PlannedGemm, ...] = ()) -> EngineBuildResult:  # fmt: skip
    """Build, save (engine + sidecar + layer list), inspect and attest a TensorRT engine on GPU ``device``.

    ``gemms``: the plan's GEMMs and their precisions (``pipeline.deploy``); without them a 16-bit
    engine's every GEMM is held to its precision and an 8-bit engine's GEMMs are counted, not attested."""
    trt = require("tensorrt", "tensorrt", what="TensorRT", extra="gpu")
    pre = preflight(onnx_path, spec, trt.__version__)
    engine_path = Path(engine_path)
    select_device(device)  # the builder times tactics on, and the sidecar names, this GPU
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    net_flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if pre.plan.strongly_typed else 0
    network = builder.create_network(net_flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(os.fspath(onnx_path)):
        errors = _parser_errors(parser)
        raise EngineError(f"TensorRT's ONNX parser rejected {onnx_path} with {len(errors)} error(s): {' | '.join(errors)}")
    config = builder.create_builder_config()
    if spec.workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(spec.workspace_bytes))
    config.builder_optimization_level = spec.optimization_level
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # the inspector then shows kernels/tactics
    if spec.hardware_compatibility != "none":
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, HARDWARE_COMPATIBILITY[spec.hardware_compatibility][0])
    for flag in pre.plan.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    if spec.dla_core is not None:
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = spec.dla_core
    profiles = _add_profile(builder, network, config, spec)
    cache_path = Path(spec.timing_cache) if spec.timing_cache else None
    warnings = attach_timing_cache(config, cache_path)
    t0 = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - t0
    if serialized is None:
        raise EngineError(f"TensorRT failed to build {onnx_path} (see the TensorRT log above); try a larger --workspace or --precision fp32")
    warnings += save_timing_cache(config, cache_path)
    engine = deserialize(trt, serialized, spec.version_compatible, f"the engine just built from {onnx_path}")
    info = json.loads(engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_bytes(engine_path, memoryview(serialized))
    layers_path = layers_path_for(engine_path)
    _atomic_write_bytes(layers_path, (json.dumps(info, indent=1) + "\n").encode())
    fusion = detect_fused_attention(info, pre.attention_blocks)
    if not fusion.all_fused:
        warnings.append(unfused_warning(fusion.fused, pre.attention_blocks, fusion.softmax_layers, pre.report))
    try:
        attestation = attest_engine(info, engine_expectation(pre, spec, gemms))
    except InspectorFormatError as err:
        raise EngineError(f"the engine inspector of {engine_path} gave no layer details ({err}); this is a bug in attn-export") from None
    warnings += attestation.violations
    for w in warnings:
        log.warning("%s", w)
    gpu, cc = gpu_identity(device)
    names = [network.get_input(i).name for i in range(network.num_inputs)]
    sidecar = EngineSidecar(
        tensorrt_version=trt.__version__, gpu_name=gpu, compute_capability=cc, precision=spec.precision,
        strongly_typed=pre.plan.strongly_typed, builder_flags=list(pre.plan.builder_flags), profiles=profiles[0] if profiles else {},
        optimization_profiles=profiles if len(profiles) > 1 else [],
        onnx_sha256=pre.onnx_sha256, engine_sha256=sha256_file(engine_path), engine_size_bytes=engine_path.stat().st_size,
        hardware_compatibility=spec.hardware_compatibility, version_compatible=spec.version_compatible,
        dla_core=spec.dla_core, input_names=names,
        output_names=[network.get_output(i).name for i in range(network.num_outputs)],
        attention_fused=fusion.fused, attention_blocks=pre.attention_blocks,
    )
    write_sidecar(engine_path, sidecar)
    result = EngineBuildResult(
        engine_path=str(engine_path), sidecar_path=str(sidecar_path_for(engine_path)), layers_path=str(layers_path),
        tensorrt_version=trt.__version__, precision=spec.precision, strongly_typed=pre.plan.strongly_typed,
        builder_flags=list(pre.plan.builder_flags), build_seconds=seconds, size_bytes=sidecar.engine_size_bytes,
        attention_blocks=pre.attention_blocks, attention_fused=fusion.fused, fused_layers=fusion.fused_layers, warnings=warnings,
        attestation=attestation.to_dict(),
    )
    log.info("built %s: %s", engine_path, result.describe())
    return result


def _add_profile(builder: Any, network: Any, config: Any, spec: EngineSpec) -> list[dict[str, dict[str, list[int]]]]:
    """Add ``spec.optimization_profiles`` (one per length bucket, else one) and return them as the sidecar records them.

    Profile i of the config is profile i of the engine (``add_optimization_profile`` returns its
    index), which is the index the runner passes to ``set_optimization_profile_async``.
    """
    dynamic = [network.get_input(i) for i in range(network.num_inputs) if any(d < 0 for d in network.get_input(i).shape)]
    if not dynamic:
        return []
    if spec.profiles is None:
        names = ", ".join(t.name for t in dynamic)
        raise ConfigError(f"inputs {names} have dynamic dims; pass --min-shape/--opt-shape/--max-shape (BATCHxSEQ)")
    out: list[dict[str, dict[str, list[int]]]] = []
    for shape_profile in spec.optimization_profiles:
        profile = builder.create_optimization_profile()
        shapes: dict[str, dict[str, list[int]]] = {}
        for tensor in dynamic:
            mn, opt, mx = shape_profile.shapes_for(tensor.name, [d if d >= 0 else None for d in tensor.shape])
            profile.set_shape(tensor.name, mn, opt, mx)
            shapes[tensor.name] = {"min": list(mn), "opt": list(opt), "max": list(mx)}
        index = config.add_optimization_profile(profile)
        if index != len(out):
            raise EngineError(f"TensorRT refused optimization profile {len(out)} ({shape_profile}); see the TensorRT log above")
        out.append(shapes)
    return out
