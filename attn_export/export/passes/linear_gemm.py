"""Row-wise Linear layers as 2-D ``Gemm`` with the bias fused, for dynamic-shape graphs.

Why: torch exports ``nn.Linear`` on (B, L, D) activations as ``MatMul`` + ``Add(bias)``.
ONNX Runtime's ``MatMulAddFusion`` turns that pair into one ``Gemm`` only when the input
shape is fully static (core/optimizer/matmul_add_fusion.cc: "we require both inputs have
concrete shape for now"), so with a dynamic batch and sequence both the product and the
sum stay alive: the FFN's (B, L, 4D) intermediate counts twice, 64 MiB at L=4096. This
pass writes what the fusion would: ``Reshape(x, [-1, K]) -> Gemm(x, W, b) -> Reshape`` back
to ``Shape(x)[:-1] + [N]``; the Reshapes are views, the bias is added inside the GEMM.

It is part of the ``long-seq`` form (whose point is memory at long L). It is opt-in for
other forms because ONNX Runtime's dynamic int8 quantizer quantizes ``MatMul`` and not
``Gemm`` (onnxruntime.quantization.registry.IntegerOpsRegistry).

``gemm_to_linear`` is the inverse, for graphs whose Linears run on 2-D rows (the packed
encoder form, ``layers.packed``): torch writes ``nn.Linear`` on (T, D) as ``Gemm(transB=1)``,
which that quantizer skips; ``MatMul`` + ``Add`` is what it reads, and ONNX Runtime fuses a
2-D ``MatMul`` + ``Add`` back into one ``Gemm`` in the session (measured: the same
optimized graph and speed).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

__all__ = ["gemm_to_linear", "linear_to_gemm"]

log = logging.getLogger(__name__)


def linear_to_gemm(model: ir.Model) -> int:
    """Rewrite float32 ``MatMul(x, W) + b`` (x rank >= 3, W and b constant) into 2-D Gemm; returns how many."""
    count = 0
    for node in list(model.graph):  # top-level only: the pairs torch emits for nn.Linear
        match = _match(node)
        if match is None:
            continue
        add, x, weight, bias = match
        k, n = weight.shape[0], weight.shape[1]
        prefix = f"linear_gemm{count}"
        tape = ir.tape.Tape()
        lead = tape.op("Shape", [x], {"end": -1})  # (rank - 1,) leading dims, e.g. (B, L)
        rows = tape.op("Reshape", [x, tape.op("Constant", [], {"value": ir.tensor(np.array([-1, k], np.int64))})])
        prod = tape.op("Gemm", [rows, weight, bias])  # (B*L, N), bias fused
        shape = tape.op("Concat", [lead, tape.op("Constant", [], {"value": ir.tensor(np.array([n], np.int64))})], {"axis": 0})
        out = tape.op("Reshape", [prod, shape])  # (..., N)
        for i, new_node in enumerate(tape.nodes):
            for j, value in enumerate(new_node.outputs):
                value.name = f"{prefix}_{i}_{j}"
        ir.convenience.replace_nodes_and_values(model.graph, add, [node, add], tape.nodes, [add.outputs[0]], [out])
        count += 1
    log.debug("linear_to_gemm: %d MatMul+Add pairs rewritten", count)
    return count


def _match(node: ir.Node) -> tuple[ir.Node, ir.Value, ir.Value, ir.Value] | None:
    """(Add node, x, W, b) when ``node`` is the MatMul of a float32 row-wise Linear."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return None
    x, weight = node.inputs
    if x is None or weight is None or weight.const_value is None or weight.shape is None or len(weight.shape) != 2:
        return None
    if x.dtype != ir.DataType.FLOAT or x.shape is None or len(x.shape) < 3:
        return None  # rank 2 is fused by ONNX Runtime itself; fp16 Gemm coverage varies by CPU
    product = node.outputs[0]
    uses = list(product.uses())
    if len(uses) != 1 or product.is_graph_output():
        return None
    add = uses[0].node
    if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or add.outputs[0].is_graph_output():
        return None
    bias = add.inputs[1] if add.inputs[0] is product else add.inputs[0]
    if bias is None or bias.const_value is None or bias.shape is None or bias.shape.dims != (weight.shape[1],):
        return None
    return add, x, weight, bias


def gemm_to_linear(model: ir.Model) -> int:
    """Rewrite ``Gemm(x, W, b)`` with a constant 2-D W (torch's 2-D ``nn.Linear``) into ``MatMul(x, W') + b``.

    W' is W laid out (K, N) (transposed in place when ``transB=1``, keeping its name); the new
    nodes keep the Gemm's metadata (its torch name scope, which ``gemm_label`` reads).
    Only plain Gemms are rewritten: ``transA=0``, ``alpha = beta = 1``, a 1-D constant bias or none.
    Returns how many.
    """
    count = 0
    for node in list(model.graph):  # top-level only: the Gemms torch emits for nn.Linear
        if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or not _plain_gemm(node):
            continue
        x, weight = node.inputs[0], node.inputs[1]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if x is None or weight is None or weight.const_value is None or len(list(weight.uses())) != 1:
            continue
        if bias is not None and (bias.const_value is None or bias.shape is None or len(bias.shape) != 1):
            continue
        if _attr(node, "transB", 0):
            w = weight.const_value.numpy().T  # (N, K) -> (K, N)
            weight.const_value = ir.tensor(np.ascontiguousarray(w), name=weight.name)
            weight.shape = ir.Shape(w.shape)
        tape = ir.tape.Tape()
        out = tape.op("MatMul", [x, weight])  # (T, N)
        if bias is not None:
            out = tape.op("Add", [out, bias])
        prefix = f"gemm_linear{count}"
        for i, new_node in enumerate(tape.nodes):
            new_node.name = f"{node.name or prefix}_{new_node.op_type.lower()}"
            new_node.metadata_props.update(node.metadata_props)
            for j, value in enumerate(new_node.outputs):
                value.name = f"{prefix}_{i}_{j}"
        ir.convenience.replace_nodes_and_values(model.graph, node, [node], tape.nodes, [node.outputs[0]], [out])
        count += 1
    log.debug("gemm_to_linear: %d Gemms rewritten as MatMul + Add", count)
    return count


def _attr(node: ir.Node, name: str, default: float) -> float:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _plain_gemm(node: ir.Node) -> bool:
    return not _attr(node, "transA", 0) and _attr(node, "alpha", 1.0) == 1.0 and _attr(node, "beta", 1.0) == 1.0
