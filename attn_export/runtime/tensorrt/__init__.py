"""TensorRT for attn-export: one import for building, loading and running engines.

Names load lazily (PEP 562): ``attn_export.checks`` reads ``spec`` without pulling in the
builder, which itself runs those checks first.

The module is split so that everything but the TensorRT calls runs without TensorRT:

* ``spec``     ``ShapeProfile``/``EngineSpec`` and the flags each TensorRT version needs;
* ``sidecar``  the engine's JSON sidecar, load-time compatibility checks, and fused
  attention detection from the engine inspector's layer list;
* ``attest``   what a built engine runs, read back from the inspector's detailed layer list
                  (standard library only: the Jetson bundle ships it to the device);
* ``build``    ``build_engine`` (static check first, then the TensorRT builder, then the attestation);
* ``runner``   ``EngineFromPath`` / ``load_engine`` / ``TrtRunner`` (cuda-python buffers,
                  ``cudaSetDevice`` first, host code allowed for version-compatible plans).

``tensorrt`` itself is imported lazily, only by the functions that need it, and its
absence is a ``MissingDependencyError`` naming the pip package. Every TensorRT name used
here is checked, without a GPU, against the real bindings of 10.3 to 11.4
(``tools/trt_manifest.py``, ``tests/runtime/tensorrt/test_trt_api_scan.py``).
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "AttentionFusion": "attn_export.runtime.tensorrt.sidecar",
    "BuildPlan": "attn_export.runtime.tensorrt.build_plan",
    "EngineBuildResult": "attn_export.runtime.tensorrt.build",
    "EngineFromPath": "attn_export.runtime.tensorrt.runner",
    "EngineSidecar": "attn_export.runtime.tensorrt.sidecar",
    "EngineSpec": "attn_export.runtime.tensorrt.spec",
    "ShapeProfile": "attn_export.runtime.tensorrt.spec",
    "TrtRunner": "attn_export.runtime.tensorrt.runner",
    "TrtVersion": "attn_export.runtime.tensorrt.spec",
    "build_engine": "attn_export.runtime.tensorrt.build",
    "check_compatible": "attn_export.runtime.tensorrt.sidecar",
    "check_shape_in_profile": "attn_export.runtime.tensorrt.runner",
    "detect_fused_attention": "attn_export.runtime.tensorrt.sidecar",
    "dla_supported": "attn_export.runtime.tensorrt.spec",
    "load_engine": "attn_export.runtime.tensorrt.runner",
    "parse_shape": "attn_export.runtime.tensorrt.spec",
    "parse_trt_version": "attn_export.runtime.tensorrt.spec",
    "plan_build": "attn_export.runtime.tensorrt.build_plan",
    "preflight": "attn_export.runtime.tensorrt.build",
    "read_sidecar": "attn_export.runtime.tensorrt.sidecar",
    "select_device": "attn_export.runtime.tensorrt.runner",
    "verify_engine_file": "attn_export.runtime.tensorrt.sidecar",
}
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


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'attn_export.runtime.tensorrt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
