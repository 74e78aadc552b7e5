"""Runners that share one ``infer(feed) -> dict`` contract: eager, ONNX Runtime, TensorRT.

Names are imported lazily (PEP 562), so ``attn_export.runtime.tensorrt.spec`` or the CLI's
``--help`` never pull in torch or onnxruntime.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["EagerRunner", "Feed", "OrtRunner", "ProviderSpec", "Runner", "SessionFromOnnx", "available_providers"]

_WHERE = {
    "Feed": "attn_export.runtime.base",
    "Runner": "attn_export.runtime.base",
    "EagerRunner": "attn_export.runtime.eager",
    "OrtRunner": "attn_export.runtime.ort",
    "ProviderSpec": "attn_export.runtime.ort",
    "SessionFromOnnx": "attn_export.runtime.ort",
    "available_providers": "attn_export.runtime.ort",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'attn_export.runtime' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
