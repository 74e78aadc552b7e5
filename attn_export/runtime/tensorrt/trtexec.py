"""The ``trtexec`` command line equivalent to an ``EngineSpec``, for building on the device.

Jetson bundles and users without the Python API build with ``trtexec``; this module spells
the same decisions ``build_engine`` makes with the flags trtexec takes (every line the
toolkit can write is tested against the option lists of trtexec 10.3, 10.14 and 11.0,
recorded from each release branch's samples/common/sampleOptions.cpp in
tests/fixtures/trtexec/): ``--fp16``/``--int8``/``--fp8`` on
weakly typed 10.x, ``--stronglyTyped`` when the precision lives in the graph (nothing on
11, where every network is strongly typed and the precision flags are gone; ``build_plan``),
``--minShapes/--optShapes/--maxShapes`` per
input, ``--memPoolSize=workspace:<N>M``, ``--timingCacheFile``, ``--useDLACore`` with
``--allowGPUFallback``, ``--builderOptimizationLevel``, ``--hardwareCompatibilityLevel``
and ``--versionCompatible``.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Mapping, Sequence

import onnx

from attn_export.errors import ConfigError
from attn_export.runtime.tensorrt.build_plan import plan_build
from attn_export.runtime.tensorrt.spec import HARDWARE_COMPATIBILITY, EngineSpec
from attn_export.vocab.precisions import float_precision_of

__all__ = ["trtexec_command", "onnx_io_dims", "shell_line"]

log = logging.getLogger(__name__)

_FLAG_ARGS = {"FP16": "--fp16", "INT8": "--int8", "GPU_FALLBACK": "--allowGPUFallback", "VERSION_COMPATIBLE": "--versionCompatible"}


def onnx_io_dims(onnx_path: str | os.PathLike[str]) -> tuple[dict[str, list[int | str | None]], str, bool]:
    """(input name -> dims, graph float (an export precision's name), has Q/DQ) read from an ONNX file."""
    path = os.fspath(onnx_path)
    if not os.path.isfile(path):
        raise ConfigError(f"ONNX model {path} does not exist; export it first")
    proto = onnx.load(path, load_external_data=False)
    inits = {t.name for t in proto.graph.initializer}
    dims: dict[str, list[int | str | None]] = {}
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        dims[vi.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi.type.tensor_type.shape.dim]
    types = {t.data_type for t in proto.graph.initializer} | {i.type.tensor_type.elem_type for i in proto.graph.input}
    has_qdq = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in proto.graph.node)
    return dims, float_precision_of(onnx.TensorProto.DataType.Name(t) for t in types), has_qdq


def _shape(dims: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in dims)


def trtexec_command(
    onnx_path: str | os.PathLike[str],
    engine_path: str | os.PathLike[str],
    spec: EngineSpec,
    trt_version: str,
    *,
    inputs: Mapping[str, Sequence[int | str | None]] | None = None,
    graph_float: str | None = None,
    has_qdq: bool | None = None,
    layer_info: bool = True,
    skip_inference: bool = True,
    executable: str = "trtexec",
) -> list[str]:
    """argv for trtexec building ``engine_path`` from ``onnx_path`` as ``spec`` asks on ``trt_version``.

    ``inputs``/``graph_float``/``has_qdq`` default to what ``onnx_path`` contains; pass them
    to write a command for a file that lives elsewhere (a bundle's relative paths).
    """
    if inputs is None or graph_float is None or has_qdq is None:
        dims, gf, q = onnx_io_dims(onnx_path)
        inputs = dims if inputs is None else inputs
        graph_float = gf if graph_float is None else graph_float
        has_qdq = q if has_qdq is None else has_qdq
    plan = plan_build(spec, trt_version, graph_float, has_qdq)
    cmd = [executable, f"--onnx={os.fspath(onnx_path)}", f"--saveEngine={os.fspath(engine_path)}"]
    cmd += list(plan.trtexec_precision_args)  # --stronglyTyped on 10.x, nothing on 11.x (every network typed), or the weakly typed flags
    dynamic = {n: d for n, d in inputs.items() if any(not isinstance(x, int) or x <= 0 for x in d)}
    if dynamic:
        if spec.profiles is None:
            raise ConfigError(f"inputs {', '.join(dynamic)} have dynamic dims; pass --min-shape/--opt-shape/--max-shape (BATCHxSEQ)")
        per_input = {n: spec.profiles.shapes_for(n, d) for n, d in dynamic.items()}
        for i, flag in enumerate(("--minShapes", "--optShapes", "--maxShapes")):
            cmd.append(f"{flag}=" + ",".join(f"{n}:{_shape(s[i])}" for n, s in per_input.items()))
    if spec.workspace_bytes:
        cmd.append(f"--memPoolSize=workspace:{max(1, spec.workspace_bytes // 2**20)}M")
    if spec.timing_cache:
        cmd.append(f"--timingCacheFile={spec.timing_cache}")
    if spec.dla_core is not None:
        cmd.append(f"--useDLACore={spec.dla_core}")
    cmd += [_FLAG_ARGS[f] for f in plan.builder_flags if f in ("GPU_FALLBACK", "VERSION_COMPATIBLE")]
    cmd.append(f"--builderOptimizationLevel={spec.optimization_level}")
    if spec.hardware_compatibility != "none":
        cmd.append(f"--hardwareCompatibilityLevel={HARDWARE_COMPATIBILITY[spec.hardware_compatibility][1]}")
    if layer_info:
        cmd += ["--profilingVerbosity=detailed", f"--exportLayerInfo={os.fspath(engine_path)}.layers.json"]
    if skip_inference:
        cmd.append("--skipInference")
    log.debug("trtexec: %s", shell_line(cmd))
    return cmd


def shell_line(cmd: Sequence[str]) -> str:
    """A copy-pasteable shell line for ``cmd``."""
    return shlex.join(list(cmd))
