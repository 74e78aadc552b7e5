"""Runners that share one ``infer(feed) -> dict`` contract: eager, ONNX Runtime, TensorRT."""

from attn_export.runtime.base import Feed, Runner
from attn_export.runtime.eager import EagerRunner
from attn_export.runtime.ort import (
    OrtRunner,
    ProviderSpec,
    SessionFromOnnx,
    available_providers,
)

__all__ = ["EagerRunner", "Feed", "OrtRunner", "ProviderSpec", "Runner", "SessionFromOnnx", "available_providers"]
