"""int8 embedding tables with one scale per row, dequantized after the Gather.

MiniLM's 30522 x 384 word-embedding table is 47 MB of its 90 MB in fp32, and the dynamic
int8 route quantizes only GEMM weights, so its file stays at 59 MB. A lookup table needs no
int8 arithmetic: store it as int8 and dequantize the rows a batch gathers, which costs a
(batch, seq, hidden) Cast and Mul and nothing per vocabulary entry:

    rows  = Gather(table_int8 (V, D), ids)          # (B, S, D) int8
    scale = Gather(row_scale (V, 1), ids)           # (B, S, 1) float
    emb   = Mul(Cast(rows, float), scale)           # (B, S, D) float

One symmetric scale per row (max |row| / 127) keeps rare tokens, whose rows are small,
as precise as frequent ones; a per-tensor scale (what ``quantize_dynamic`` gives a Gather)
spends the levels on the largest row. The dequantization is written as Cast + Mul because
a per-row scale after the Gather is a blocked DequantizeLinear (opset 21), which the
encoder's opset-20 graph cannot use; the arithmetic is the same.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as ir_common

__all__ = ["EmbeddingQuantPass", "MIN_TABLE_ELEMENTS", "QuantizedTable", "quantize_rows"]

log = logging.getLogger(__name__)

MIN_TABLE_ELEMENTS = 1 << 16  # smaller tables (token types) save nothing worth an extra op


def quantize_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per row: (int8 (V, D), scale (V, 1) float32)."""
    t = np.asarray(table, dtype=np.float32)
    scale = (np.maximum(np.abs(t).max(axis=1, keepdims=True), 1e-12) / 127.0).astype(np.float32)
    return np.clip(np.rint(t / scale), -127, 127).astype(np.int8), scale


@dataclass
class QuantizedTable:
    name: str
    shape: tuple[int, ...]
    bytes_before: int
    bytes_after: int
    max_abs_error: float  # largest |dequantized - float| over the table


@dataclass
class _Result:
    tables: list[QuantizedTable] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"tables": [asdict(t) for t in self.tables], "bytes_saved": sum(t.bytes_before - t.bytes_after for t in self.tables)}


class EmbeddingQuantPass(ir.passes.InPlacePass):
    """Replace ``Gather(float table, ids)`` (axis 0, 2-D table >= ``min_elements``) by int8 rows + per-row scales."""

    def __init__(self, min_elements: int = MIN_TABLE_ELEMENTS) -> None:
        super().__init__()
        self.min_elements = min_elements
        self.result = _Result()

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        self.result = _Result()
        done: dict[str, tuple[ir.Value, ir.Value]] = {}  # a table gathered twice is quantized once
        for node in list(graph):
            if node.op_type != "Gather" or node.domain not in ("", "ai.onnx"):
                continue
            table = node.inputs[0]
            axis = node.attributes.get("axis")
            if table is None or table.const_value is None or (axis is not None and axis.as_int() != 0):
                continue
            if table.dtype != ir.DataType.FLOAT or len(table.const_value.shape) != 2 or table.const_value.size < self.min_elements:
                continue
            if node.outputs[0].is_graph_output():
                continue  # the lookup itself is an output: leave it float
            if table.name not in done:
                data = table.const_value.numpy()
                q, scale = quantize_rows(data)
                qv = ir.Value(name=f"{table.name}_int8_rows", const_value=ir.tensor(q), type=ir.TensorType(ir.DataType.INT8), shape=ir.Shape(q.shape))
                sv = ir.Value(name=f"{table.name}_row_scale", const_value=ir.tensor(scale), type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(scale.shape))
                graph.register_initializer(qv)
                graph.register_initializer(sv)
                done[table.name] = (qv, sv)
                err = float(np.abs(q.astype(np.float32) * scale - data).max())
                self.result.tables.append(QuantizedTable(table.name or "", tuple(data.shape), data.nbytes, q.nbytes + scale.nbytes, err))
            qv, sv = done[table.name]
            ids = node.inputs[1]
            base = node.name or table.name
            rows = ir.node("Gather", [qv, ids], attributes={"axis": 0}, name=f"{base}_int8")
            scales = ir.node("Gather", [sv, ids], attributes={"axis": 0}, name=f"{base}_row_scale")
            cast = ir.node("Cast", [rows.outputs[0]], attributes={"to": ir.DataType.FLOAT}, name=f"{base}_dequant_cast")
            mul = ir.node("Mul", [cast.outputs[0], scales.outputs[0]], name=f"{base}_dequant")
            for n, suffix in ((rows, "int8_rows"), (scales, "row_scale"), (cast, "rows_float")):
                n.outputs[0].name = f"{base}_{suffix}_out"
            out = node.outputs[0]
            mul.outputs[0].name = f"{out.name}_dequantized"
            mul.outputs[0].type, mul.outputs[0].shape = out.type, out.shape
            graph.insert_before(node, [rows, scales, cast, mul])
            out.replace_all_uses_with(mul.outputs[0])
        if done:
            ir_common.RemoveUnusedNodesPass()(model)  # the float Gathers and tables
            log.info("embedding tables int8 per row: %s", ", ".join(f"{t.name} {t.shape}" for t in self.result.tables))
        return ir.passes.PassResult(model, bool(done))
