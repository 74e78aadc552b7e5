"""The ONNX Runtime TensorRT execution provider: the provider options a deployment of ``--target ort-tensorrt`` must set.

``onnxruntime-gpu``'s ``TensorrtExecutionProvider`` builds TensorRT engines for the subgraphs it
takes inside an ONNX Runtime session and leaves the rest to the CUDA and CPU providers. What it
builds depends on provider options only the deployment sets (fp16, int8, the engine cache, the
shape profile), so the report carries them (``deploy.session_options``) as data a deployment
copies, rather than a guess left to the user.

Every option key written here is one ONNX Runtime documents (``DOCUMENTED_OPTIONS``, with its
source), and tests/runtime/test_ort_tensorrt.py holds each emitted key to that set.
"""

from __future__ import annotations

import logging
import os
from typing import Any

__all__ = ["ATTESTATION_NOTE", "DOCUMENTED_OPTIONS", "OPTIONS_SOURCE", "deployment_options"]

log = logging.getLogger(__name__)

OPTIONS_SOURCE = (
    "ONNX Runtime, TensorRT Execution Provider, 'Execution Provider Options' "
    "(https://onnxruntime.ai/docs/execution-providers/TensorRT-ExecutionProvider.html#configurations), and "
    "microsoft/onnxruntime onnxruntime/core/providers/tensorrt/tensorrt_execution_provider_info.cc "
    "(namespace tensorrt::provider_option_names)"
)
# The TensorRT EP's provider option names as ONNX Runtime documents them (OPTIONS_SOURCE).
DOCUMENTED_OPTIONS: frozenset[str] = frozenset({
    "device_id", "user_compute_stream", "has_user_compute_stream",
    "trt_max_workspace_size", "trt_max_partition_iterations", "trt_min_subgraph_size",
    "trt_fp16_enable", "trt_bf16_enable", "trt_int8_enable", "trt_int8_calibration_table_name", "trt_int8_use_native_calibration_table",
    "trt_dla_enable", "trt_dla_core",
    "trt_engine_cache_enable", "trt_engine_cache_path", "trt_engine_cache_prefix", "trt_weight_stripped_engine_enable",
    "trt_onnx_model_folder_path", "trt_engine_decryption_enable", "trt_engine_decryption_lib_path",
    "trt_dump_subgraphs", "trt_force_sequential_engine_build", "trt_context_memory_sharing_enable", "trt_layer_norm_fp32_fallback",
    "trt_timing_cache_enable", "trt_timing_cache_path", "trt_force_timing_cache", "trt_detailed_build_log",
    "trt_build_heuristics_enable", "trt_sparsity_enable", "trt_builder_optimization_level", "trt_auxiliary_streams",
    "trt_tactic_sources", "trt_extra_plugin_lib_paths", "trt_profile_min_shapes", "trt_profile_max_shapes", "trt_profile_opt_shapes",
    "trt_cuda_graph_enable", "trt_dump_ep_context_model", "trt_ep_context_file_path", "trt_ep_context_embed_mode",
    "trt_engine_hw_compatible", "trt_op_types_to_exclude",
})  # fmt: skip

# Why this target's engines are not attested (runtime/tensorrt/attest.py attests the engine step's and the Jetson bundle's):
# the EP builds its engines inside the session, hands none to the caller, and none of its documented options
# (DOCUMENTED_OPTIONS) sets the builder's profiling verbosity, so a cached engine's inspector lists layer names only.
ATTESTATION_NOTE = (
    "not attested: ONNX Runtime's TensorRT EP builds its engines inside the session, exposes no engine object and no "
    "provider option for detailed profiling verbosity, so the inspector of a cached engine lists layer names only; "
    "build the engine with --target tensorrt --build-engine to attest the precision it runs"
)

# The engine and timing caches beside the model: a deployment's first session builds, the next ones load.
CACHE_DIR = "trt_cache"
PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


def deployment_options(onnx_path: str | os.PathLike[str], spec: Any) -> dict[str, Any]:
    """The providers and TensorRT EP options that run ``onnx_path`` as ``spec`` (an ``EngineSpec``) asks, each with why.

    A Q/DQ graph is explicit quantization: ``trt_int8_enable`` on and no calibration table, which ONNX
    Runtime documents must not be given for a Q/DQ model (TensorRT refuses a table when the graph has
    Q/DQ nodes); fp16 is TensorRT's builder flag on the fp32 graph (the target's ``fp16_mode``).
    """
    from attn_export.runtime.tensorrt.trtexec import onnx_io_dims

    dims, _graph_float, has_qdq = onnx_io_dims(onnx_path)
    fp16 = spec.precision in ("fp16", "int8")  # int8 keeps the unquantized layers in fp16, as trtexec --int8 --fp16 does
    options: dict[str, Any] = {
        "device_id": 0,
        "trt_fp16_enable": fp16,
        "trt_int8_enable": has_qdq,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": CACHE_DIR,
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": CACHE_DIR,
        "trt_builder_optimization_level": int(spec.optimization_level),
    }
    why = {
        "trt_fp16_enable": "fp16 is TensorRT's builder flag on this fp32 graph" if fp16 else "fp32: the graph's own precision",
        "trt_int8_enable": "the graph carries Q/DQ (explicit quantization): no trt_int8_calibration_table_name, which ONNX Runtime "
        "documents must not be given for a Q/DQ model" if has_qdq else "no Q/DQ in the graph",
        "trt_engine_cache_enable": f"engines built once, reused from {CACHE_DIR}/ (clear it when the model, ONNX Runtime or TensorRT changes)",
    }  # fmt: skip
    if spec.workspace_bytes:
        options["trt_max_workspace_size"] = int(spec.workspace_bytes)
    if spec.hardware_compatibility != "none":
        options["trt_engine_hw_compatible"] = True
        why["trt_engine_hw_compatible"] = "the engine cache is reused on any Ampere or later GPU (ONNX Runtime's only hardware-compatible level)"
    dynamic = {n: d for n, d in dims.items() if any(not isinstance(x, int) or x <= 0 for x in d)}
    if dynamic and spec.profiles is not None:
        per_input = {n: spec.profiles.shapes_for(n, d) for n, d in dynamic.items()}
        for i, key in enumerate(("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes")):
            options[key] = ",".join(f"{n}:{'x'.join(str(v) for v in s[i])}" for n, s in per_input.items())
        why["trt_profile_min_shapes"] = "one explicit profile over the run's shapes: no engine rebuild when a new shape arrives"
    log.debug("TensorRT EP options for %s: %s", onnx_path, options)
    return {"providers": list(PROVIDERS), "provider_options": {"TensorrtExecutionProvider": options}, "why": why, "source": OPTIONS_SOURCE,
            "attestation": ATTESTATION_NOTE}
