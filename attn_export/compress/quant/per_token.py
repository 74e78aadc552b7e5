"""Per-token dynamic int8: one activation range per row (token), so a text's numbers never depend on its batch.

ONNX Runtime's dynamic quantizer takes ONE activation range per tensor per batch
(``DynamicQuantizeLinear``): a text's int8 error then grows with the widest activation of its
batch mates, and the same text embeds differently alone and in a batch (MiniLM, 160 held-out
texts: min cosine 0.9899 alone vs in batches of 32; all-mpnet-base-v2: 0.953 in batches of 8).
Per-token quantization (LLM.int8's vector-wise and SmoothQuant's per-token mode) gives each row
its own symmetric scale ``max|x_row| / 127``; the integer GEMM is exact, so each output row
depends on its own input row only, and outlier tokens no longer cost the others their precision.

``per_token_pass`` rewrites the graph ``onnxruntime.quantization.quantize_dynamic`` wrote, chain
by chain, so everything that route has (SmoothQuant, int8 embedding rows, the GEMMs the fallback
keeps in float, the node names the fallback reads) carries over::

    DynamicQuantizeLinear(x) -> MatMulInteger(x_q, W_q, x_zp, W_zp) -> Cast -> Mul(Mul(x_scale, W_scale))
    ==>
    s = max(ReduceMax(|x|, -1), eps) / 127;  x_q = QuantizeLinear(x * (127 / max(...)), 1, 128)   (uint8, per row)
    y = MatMulIntegerToFloat(x_q, W_q, 1, W_scale, 128, W_zp) * s

The weights keep the quantizer's per-channel int8 (and its 7-bit ``reduce_range`` where the CPU's
U8S8 kernel saturates, ``int8_encoding``); the activation is symmetric, stored as uint8 with zero
point 128, which ONNX Runtime's x86 U8S8 kernel takes as is. ``com.microsoft.MatMulIntegerToFloat``
applies the per-column weight scale in the GEMM's epilogue (tested exact against numpy); the row
scale is one ``Mul`` after it. Two traps this layout avoids, both measured on ORT 1.32:

* the row scale must not be an input of ``MatMulIntegerToFloat``: its ``a_scale`` is a scalar, and
  a (rows, 1) tensor there gives wrong numbers;
* the graph must not keep ``MatMulInteger -> Cast -> Mul(Mul(row_scale, W_scale))``: ORT's
  ``MatMulIntegerToFloatFusion`` (ORT_ENABLE_EXTENDED and up) fuses that chain without checking the
  scale's shape, and MiniLM's mean cosine fell from 0.998 to 0.70.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from attn_export.errors import ExportError
from attn_export.export.passes.graph_constants import typed_initializer

__all__ = ["MS_DOMAIN", "PerTokenSummary", "per_token_pass", "per_token_view"]

MS_DOMAIN = "com.microsoft"
_EPS = 1e-12  # an all-zero row (padding) gets scale eps / 127 and quantizes to the zero point: exact zeros


@dataclass
class PerTokenSummary:
    """What the pass rewrote, for the report."""

    gemms: int = 0
    activations: int = 0  # one per-row quantization per activation, shared by the GEMMs that read it
    names: list[str] = field(default_factory=list)  # the original MatMul names, as the fallback names them

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _only_use(value: ir.Value, op_type: str) -> ir.Node | None:
    uses = list(value.uses())
    if len(uses) != 1 or uses[0][0].op_type != op_type:
        return None
    return uses[0][0]


def _constants(graph: ir.Graph) -> dict[str, ir.Value]:
    return {
        "axes": typed_initializer(graph, "per_token_axes", np.array([-1], np.int64)),
        "eps": typed_initializer(graph, "per_token_eps", np.array(_EPS, np.float32)),
        "qmax": typed_initializer(graph, "per_token_qmax", np.array(127.0, np.float32)),
        "one": typed_initializer(graph, "per_token_one", np.array(1.0, np.float32)),
        "zp": typed_initializer(graph, "per_token_zero_point", np.array(128, np.uint8)),
    }


def _row_range(x: ir.Value, c: dict[str, ir.Value], prefix: str) -> tuple[list[ir.Node], ir.Value, ir.Value]:
    """Nodes computing ``max(max|x_row|, eps)``: (nodes, the row scale ``range / 127``, its inverse ``127 / range``)."""
    absolute = ir.node("Abs", [x], name=f"{prefix}_abs")
    peak = ir.node("ReduceMax", [absolute.outputs[0], c["axes"]], attributes={"keepdims": 1}, name=f"{prefix}_rowmax")
    floor = ir.node("Max", [peak.outputs[0], c["eps"]], name=f"{prefix}_floor")
    scale = ir.node("Div", [floor.outputs[0], c["qmax"]], name=f"{prefix}_row_scale")
    inverse = ir.node("Div", [c["qmax"], floor.outputs[0]], name=f"{prefix}_row_inverse")
    for n, suffix in ((absolute, "abs"), (peak, "rowmax"), (floor, "range"), (scale, "row_scale"), (inverse, "row_inverse")):
        n.outputs[0].name = f"{prefix}_{suffix}"
        n.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    return [absolute, peak, floor, scale, inverse], scale.outputs[0], inverse.outputs[0]


def per_token_pass(model: ir.Model) -> PerTokenSummary:
    """Rewrite every ``quantize_dynamic`` chain of ``model`` in place (module docstring); returns what changed.

    Raises ExportError when a chain does not have the quantizer's shape (nothing is half-rewritten: the
    graph is checked before the first change).
    """
    graph = model.graph
    plans = []
    for dql in [n for n in graph if n.op_type == "DynamicQuantizeLinear" and n.domain in ("", "ai.onnx")]:
        x_q = dql.outputs[0]
        chains = []
        for use, _ in list(x_q.uses()):
            if use.op_type != "MatMulInteger":
                raise ExportError(f"{dql.name}: expected quantize_dynamic's DynamicQuantizeLinear -> MatMulInteger, got {use.op_type}")
            cast = _only_use(use.outputs[0], "Cast")
            out_mul = _only_use(cast.outputs[0], "Mul") if cast is not None else None
            scales = next((v.producer() for v in out_mul.inputs if v is not None and v is not cast.outputs[0]), None) if out_mul else None
            if scales is None or scales.op_type != "Mul" or len(use.inputs) < 4 or use.inputs[1] is None or use.inputs[1].const_value is None:
                raise ExportError(f"{use.name}: expected MatMulInteger -> Cast -> Mul(Mul(x_scale, W_scale)) with a constant int8 weight")
            w_scale = next((v for v in scales.inputs if v is not None and v is not dql.outputs[1]), None)
            if w_scale is None or w_scale.const_value is None:
                raise ExportError(f"{scales.name}: expected the weight's constant scale beside the activation's")
            chains.append((use, cast, out_mul, scales, w_scale))
        plans.append((dql, chains))
    if not plans:
        raise ExportError("per-token int8: the dynamic model has no DynamicQuantizeLinear to rewrite")
    if not any(o == MS_DOMAIN for o in model.opset_imports):
        model.opset_imports[MS_DOMAIN] = 1
    c = _constants(graph)
    summary = PerTokenSummary()
    for dql, chains in plans:
        x = dql.inputs[0]
        prefix = f"{dql.name}_per_token"
        nodes, row_scale, row_inverse = _row_range(x, c, prefix)  # type: ignore[arg-type]
        scaled = ir.node("Mul", [x, row_inverse], name=f"{prefix}_scaled")
        quant = ir.node("QuantizeLinear", [scaled.outputs[0], c["one"], c["zp"]], name=f"{prefix}_quantize")
        scaled.outputs[0].name, quant.outputs[0].name = f"{prefix}_scaled", f"{prefix}_quantized"
        scaled.outputs[0].type, quant.outputs[0].type = ir.TensorType(ir.DataType.FLOAT), ir.TensorType(ir.DataType.UINT8)
        graph.insert_before(dql, [*nodes, scaled, quant])
        summary.activations += 1
        for mmi, cast, out_mul, scales, w_scale in chains:
            name = mmi.name.removesuffix("_quant")
            gemm = ir.node("MatMulIntegerToFloat", [quant.outputs[0], mmi.inputs[1], c["one"], w_scale, c["zp"], mmi.inputs[3]],
                           domain=MS_DOMAIN, name=f"{name}_per_token")  # fmt: skip
            gemm.outputs[0].name, gemm.outputs[0].type = f"{name}_per_token_columns", ir.TensorType(ir.DataType.FLOAT)
            rows = ir.node("Mul", [gemm.outputs[0], row_scale], name=f"{name}_per_token_rows")
            graph.insert_before(mmi, [gemm, rows])
            out_mul.outputs[0].replace_all_uses_with(rows.outputs[0], replace_graph_outputs=True)
            final_name, final_shape = out_mul.outputs[0].name, out_mul.outputs[0].shape  # a graph output keeps its declared shape
            for dead in (out_mul, cast, mmi):
                graph.remove(dead, safe=True)
            if not list(scales.outputs[0].uses()):
                graph.remove(scales, safe=True)
            rows.outputs[0].name, rows.outputs[0].shape = final_name, final_shape
            rows.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
            summary.gemms += 1
            summary.names.append(name)
        graph.remove(dql, safe=True)
    return summary


def per_token_view(x: ir.Value, width: int, graph: ir.Graph, prefix: str) -> tuple[list[ir.Node], ir.Value]:
    """Float nodes that quantize and dequantize ``x`` (last dimension ``width``) per row as ``per_token_pass``'s model
    does: the fallback's Q/DQ view of the route (``dynamic_groups``). The pair is ``QuantizeLinear -> DequantizeLinear``
    with one block per row (opset 21's blocked quantization, ``block_size = width``), so the sensitivity machinery
    finds and switches it like any other. The view divides by the row scale where the model multiplies by its
    inverse: the two can round a value that falls on .5 differently, one int8 step of one element."""
    c = {"axes": typed_initializer(graph, f"{prefix}_axes", np.array([-1], np.int64)),
         "eps": typed_initializer(graph, f"{prefix}_eps", np.array(_EPS, np.float32)),
         "qmax": typed_initializer(graph, f"{prefix}_qmax", np.array(127.0, np.float32))}  # fmt: skip
    nodes, row_scale, _ = _row_range(x, c, prefix)
    nodes = nodes[:-1]  # the inverse is the model's, not the view's
    blocked = {"axis": -1, "block_size": int(width)}
    quant = ir.node("QuantizeLinear", [x, row_scale], attributes={**blocked, "output_dtype": int(ir.DataType.INT8)}, name=f"{prefix}_q")
    dequant = ir.node("DequantizeLinear", [quant.outputs[0], row_scale], attributes=blocked, name=f"{prefix}_dq")
    quant.outputs[0].name, dequant.outputs[0].name = f"{prefix}_quantized", f"{prefix}_dequantized"
    quant.outputs[0].type, quant.outputs[0].shape = ir.TensorType(ir.DataType.INT8), x.shape
    dequant.outputs[0].type, dequant.outputs[0].shape = ir.TensorType(ir.DataType.FLOAT), x.shape
    return [*nodes, quant, dequant], dequant.outputs[0]
