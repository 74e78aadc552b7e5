"""Residual Add + LayerNorm on 2-D rows, so a plain ONNX Runtime CPU session cannot fuse them into SkipLayerNormalization.

Why: ONNX Runtime's ``SkipLayerNormFusion`` (an extended-level fusion, on in every default
session) rewrites ``LayerNormalization(Add(a, b))`` into ``com.microsoft.SkipLayerNormalization``,
and that CPU kernel measured ~5x slower than the Add + LayerNormalization it replaces on ORT
1.32 (docs/quantization.md). The project's own sessions turn the fusion off, but a user who
loads the shipped file in a plain ``InferenceSession`` does not know to. The fusion only
matches an Add whose inputs are 3-D (``CheckFirstAdd`` in
onnxruntime/core/optimizer/skip_layer_norm_fusion.cc), so this pass runs the residual Add and
the LayerNorm on ``(rows, D)`` views of the same tensors and reshapes the result back:

    Add(a, b) -> LayerNorm          becomes
    Reshape(a, [-1, D]), Reshape(b, [-1, D]) -> Add -> LayerNorm -> Reshape(to Shape(a))

The arithmetic is the same (LayerNorm normalises the last axis either way) and a Reshape is a
view in ONNX Runtime, so the graph stays as fast in a plain session as in the project's. The
ONNX Runtime targets' export turns it on (``ExportSpec.layernorm_rows``); TensorRT graphs are
left as exported.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

__all__ = ["layernorm_on_rows"]

log = logging.getLogger(__name__)


def _width(ln: ir.Node) -> int | None:
    """D of a LayerNormalization over the last axis, from its scale (None when it cannot be told)."""
    scale = ln.inputs[1] if len(ln.inputs) > 1 else None
    axis = ln.attributes.get("axis")
    if scale is None or scale.shape is None or len(scale.shape) != 1 or not isinstance(scale.shape[0], int):
        return None
    if axis is not None and axis.as_int() not in (-1,) and not (ln.inputs[0].shape is not None and axis.as_int() == len(ln.inputs[0].shape) - 1):
        return None
    return int(scale.shape[0])


def layernorm_on_rows(model: ir.Model) -> int:
    """Rewrite every ``LayerNormalization(Add(a, b))`` of the main graph whose Add feeds only it; returns how many."""
    graph = model.graph
    done = 0
    for ln in list(graph):
        if ln.op_type != "LayerNormalization" or ln.domain not in ("", "ai.onnx"):
            continue
        add = ln.inputs[0].producer() if ln.inputs[0] is not None else None
        width = _width(ln)
        if add is None or add.op_type != "Add" or width is None or len(add.outputs[0].uses()) != 1 or add.outputs[0] in graph.outputs:
            continue
        a, b = add.inputs[0], add.inputs[1]
        if a is None or b is None or a.shape is None or b.shape is None or len(a.shape) != 3 or len(b.shape) != 3:
            continue  # only what SkipLayerNormFusion would match
        rows = ir.Value(name=f"{ln.name}_rows_shape", const_value=ir.tensor(np.array([-1, width], np.int64)))
        graph.register_initializer(rows)
        shape = ir.node("Shape", [a], name=f"{ln.name}_shape")
        ra = ir.node("Reshape", [a, rows], name=f"{ln.name}_rows_a")
        rb = ir.node("Reshape", [b, rows], name=f"{ln.name}_rows_b")
        row_add = ir.node("Add", [ra.outputs[0], rb.outputs[0]], name=f"{add.name}_rows")
        row_ln = ir.node("LayerNormalization", [row_add.outputs[0], *ln.inputs[1:]], attributes=dict(ln.attributes),
                         name=f"{ln.name}_rows", num_outputs=1)  # fmt: skip
        back = ir.node("Reshape", [row_ln.outputs[0], shape.outputs[0]], name=f"{ln.name}_back")
        for node in (shape, ra, rb, row_add, row_ln, back):
            node.outputs[0].dtype = ln.outputs[0].dtype if node is not shape else ir.DataType.INT64
        back.outputs[0].shape = ln.outputs[0].shape
        graph.insert_before(ln, [shape, ra, rb, row_add, row_ln, back])
        old = ln.outputs[0]
        name, is_output = old.name, old in graph.outputs
        old.replace_all_uses_with(back.outputs[0], replace_graph_outputs=True)
        graph.remove([ln, add], safe=True)
        if is_output:
            back.outputs[0].name = name
        done += 1
    log.debug("layernorm on rows: %d residual Add + LayerNorm pairs", done)
    return done
