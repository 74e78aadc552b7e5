"""ONNX export: ``export_onnx(layer, path, ExportSpec(...))`` and graph inspection.

Names load lazily (PEP 562): ``export.targets`` and ``export.spec`` are read while flags are
validated, before torch or onnx is imported.
"""

from __future__ import annotations

from attn_export.host.lazy import lazy_exports

_WHERE = {
    "DEFAULT_OPSET": "spec", "PRECISIONS": "spec", "ExportSpec": "spec",
    "ExportResult": "onnx_export", "example_inputs_for": "onnx_export", "export_module": "onnx_export", "export_onnx": "onnx_export",
    "GraphSummary": "inspect", "summarize_graph": "inspect",
}  # fmt: skip
__all__ = ["DEFAULT_OPSET", "PRECISIONS", "ExportResult", "ExportSpec", "GraphSummary", "example_inputs_for", "export_module", "export_onnx",
           "summarize_graph"]  # fmt: skip
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
