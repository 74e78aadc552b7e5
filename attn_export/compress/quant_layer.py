"""Dynamic int8 straight from a layer: the export the dynamic route should start from.

ONNX Runtime CPU runs separate Q/K/V DynamicQuantizeMatMuls faster than one fused QKV GEMM
followed by the Split that copies its output (default layer, B=8, L=128, 1 thread: 20.4 vs
22.0 ms), so this route exports the layer with ``fuse_qkv=False`` before quantizing. The
pipeline, the benchmarks and the sweep all call this one function.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

from torch import nn

from attn_export.compress.quant_onnx import QuantResult, quantize_dynamic_onnx
from attn_export.export import ExportSpec, export_onnx

__all__ = ["quantize_dynamic_layer"]


def quantize_dynamic_layer(
    layer: nn.Module, out_path: str | os.PathLike[str], spec: ExportSpec | None = None, per_channel: bool = False
) -> QuantResult:
    """Export ``layer`` (a ``MaskedLayer``) unfused in fp32 and quantize it with the dynamic route."""
    spec = dataclasses.replace(spec or ExportSpec(), fuse_qkv=False, precision="fp32")
    with tempfile.TemporaryDirectory(prefix="attn_export_dyn_") as tmp:
        unfused = Path(tmp) / "unfused.onnx"
        export_onnx(layer, unfused, spec)  # type: ignore[arg-type]
        return quantize_dynamic_onnx(unfused, out_path, per_channel=per_channel)
