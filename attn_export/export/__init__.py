"""ONNX export: ``export_onnx(layer, path, ExportSpec(...))`` and graph inspection."""

from attn_export.export.inspect import GraphSummary, summarize_graph
from attn_export.export.onnx_export import (
    ExportResult,
    example_inputs_for,
    export_module,
    export_onnx,
)
from attn_export.export.spec import DEFAULT_OPSET, PRECISIONS, ExportSpec

__all__ = [
    "DEFAULT_OPSET",
    "PRECISIONS",
    "ExportResult",
    "ExportSpec",
    "GraphSummary",
    "example_inputs_for",
    "export_module",
    "export_onnx",
    "summarize_graph",
]
