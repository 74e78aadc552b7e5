"""TensorRT for attn-export: one import for building, loading and running engines.

The module is split so that everything but the TensorRT calls runs without TensorRT:

* ``trt_spec``    ``ShapeProfile``/``EngineSpec`` and the flags each TensorRT version needs;
* ``trt_sidecar`` the engine's JSON sidecar, load-time compatibility checks, and fused
  attention detection from the engine inspector's layer list;
* ``trt_build``   ``build_engine`` (static check first, then the TensorRT builder);
* ``trt_runner``  ``EngineFromPath`` / ``load_engine`` / ``TrtRunner`` (cuda-python buffers,
                  ``cudaSetDevice`` first, host code allowed for version-compatible plans).

``tensorrt`` itself is imported lazily, only by the functions that need it, and its
absence is a ``MissingDependencyError`` naming the pip package. Every TensorRT name used
here is checked, without a GPU, against the real bindings of 10.3 to 11.4
(``tools/trt_manifest.py``, ``tests/runtime/test_trt_api_scan.py``).
"""

from attn_export.runtime.trt_build import EngineBuildResult, build_engine, preflight
from attn_export.runtime.trt_runner import (
    EngineFromPath,
    TrtRunner,
    check_shape_in_profile,
    load_engine,
    select_device,
)
from attn_export.runtime.trt_sidecar import (
    AttentionFusion,
    EngineSidecar,
    check_compatible,
    detect_fused_attention,
    read_sidecar,
    verify_engine_file,
)
from attn_export.runtime.trt_spec import (
    BuildPlan,
    EngineSpec,
    ShapeProfile,
    TrtVersion,
    dla_supported,
    parse_shape,
    parse_trt_version,
    plan_build,
)

__all__ = [
    "AttentionFusion",
    "BuildPlan",
    "EngineBuildResult",
    "EngineFromPath",
    "EngineSidecar",
    "EngineSpec",
    "ShapeProfile",
    "TrtRunner",
    "TrtVersion",
    "build_engine",
    "check_compatible",
    "check_shape_in_profile",
    "detect_fused_attention",
    "dla_supported",
    "load_engine",
    "parse_shape",
    "parse_trt_version",
    "plan_build",
    "preflight",
    "read_sidecar",
    "select_device",
    "verify_engine_file",
]
