"""Split an exported fused Q/K/V projection back into three: the int8 dynamic route's source graph without a second export.

Why: the fp32 graphs are exported with one fused QKV GEMM (``layers.projections.fuse_qkv_``:
one GEMM instead of three), but ONNX Runtime's CPU int8 kernels run three
DynamicQuantizeMatMuls faster than one fused GEMM whose output a Split then copies
(``compress/methods/int8_dynamic.py``), so the dynamic route quantizes an unfused graph. It
used to get it from a second ``torch.onnx.export`` of the same module with ``fuse_qkv=False``:
on a small checkpoint, a third of an ``--quantize int8`` run's time (profiled: 2 of its 4 exports).
The fused graph already holds the three products, as column blocks of one weight; this pass
writes them out:

    MatMul(x, W[K, 3N]) -> Add(b[3N]) -> Split(3, last axis)
      =>  MatMul(x, W[:, 0:N]) -> Add(b[0:N]),  ... [N:2N],  ... [2N:3N]

The same products, column for column, so the graph computes what the unfused export computes.
Each new MatMul carries the fused one's torch name scope with ``w_qkv`` renamed ``w_q``/``w_k``/
``w_v``, so ``compress.quant.gemm_groups.gemm_label`` names it as the unfused export would.
Only that exact pattern is rewritten (constant weight and bias, each read once, a Split into
three equal blocks of the product's last axis); ``fused_qkv_left`` says what was not, and the
caller exports again when anything was.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

__all__ = ["fused_qkv_left", "unfuse_qkv"]

log = logging.getLogger(__name__)

_SCOPE = "pkg.torch.onnx.name_scopes"
_FUSED = "w_qkv"
_PARTS = ("w_q", "w_k", "w_v")


def _is_fused_qkv(node: ir.Node) -> bool:
    return node.op_type in ("MatMul", "Gemm") and _FUSED in (node.metadata_props.get(_SCOPE) or "")


def fused_qkv_left(model: ir.Model) -> int:
    """How many GEMMs of the graph still come from a fused ``w_qkv`` Linear."""
    return sum(_is_fused_qkv(node) for node in model.graph)


def _split_sizes(split: ir.Node) -> list[int] | None:
    """The block sizes a Split cuts, when they are known constants (``split`` input) or ``num_outputs`` equal blocks."""
    if len(split.inputs) > 1 and split.inputs[1] is not None:
        const = split.inputs[1].const_value
        return None if const is None else [int(s) for s in const.numpy().reshape(-1)]
    return None  # equal blocks: sized from the weight by the caller


def _constant(value: ir.Value) -> np.ndarray | None:
    """A constant's array, also through the ``Transpose(perm=[1, 0])`` the exporter leaves on a weight read by several GEMMs."""
    if value.const_value is not None:
        return value.const_value.numpy()
    producer = value.producer()
    if producer is None or producer.op_type != "Transpose" or producer.inputs[0] is None or producer.inputs[0].const_value is None:
        return None
    perm = producer.attributes.get("perm")
    if perm is None or list(perm.as_ints()) != [1, 0]:
        return None
    return producer.inputs[0].const_value.numpy().T


def _match(matmul: ir.Node) -> tuple[ir.Value, ir.Value, ir.Value | None, ir.Node, ir.Node | None] | None:
    """(x, W, b or None, Split, Add or None) when ``matmul`` is a fused QKV Linear followed by its three-way Split."""
    if not _is_fused_qkv(matmul) or matmul.op_type != "MatMul" or len(matmul.inputs) != 2:
        return None
    x, weight = matmul.inputs
    array = None if weight is None else _constant(weight)
    if x is None or array is None or array.ndim != 2 or array.shape[1] % 3:
        return None
    out, add, bias = matmul.outputs[0], None, None
    uses = list(out.uses())
    if len(uses) != 1 or out.is_graph_output():
        return None
    if uses[0].node.op_type == "Add":
        add = uses[0].node
        bias = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
        if bias is None or bias.const_value is None or bias.shape is None or bias.shape.dims != (array.shape[1],):
            return None
        out = add.outputs[0]
        uses = list(out.uses())
        if len(uses) != 1 or out.is_graph_output():
            return None
    split = uses[0].node
    if split.op_type != "Split" or len(split.outputs) != 3 or any(o.is_graph_output() for o in split.outputs):
        return None
    axis = split.attributes.get("axis")
    rank = None if x.shape is None else len(x.shape)
    axis_value = 0 if axis is None else int(axis.as_int())
    if not (axis_value == -1 or (rank is not None and axis_value == rank - 1)):
        return None
    sizes = _split_sizes(split)
    block = int(array.shape[1]) // 3
    if sizes is not None and sizes != [block] * 3:
        return None
    return x, weight, bias, split, add


def _block(blocks: dict[str, list[ir.Value]], value: ir.Value, i: int, axis: int) -> ir.Value:
    """Block ``i`` of three of a constant along ``axis`` (W's columns, b's entries), as its own initializer."""
    if value.name not in blocks:
        array = _constant(value)
        n = array.shape[axis] // 3
        tensors = [ir.tensor(np.ascontiguousarray(np.take(array, range(j * n, (j + 1) * n), axis=axis))) for j in range(3)]
        blocks[value.name] = [
            ir.Value(name=f"{value.name}.{part}", shape=t.shape, type=ir.TensorType(t.dtype), const_value=t) for part, t in zip(_PARTS, tensors)
        ]
    return blocks[value.name][i]


def _drop_unused(model: ir.Model, value: ir.Value) -> None:
    """Remove a fused constant no node reads any more (and the Transpose that fed it, and that one's initializer)."""
    if list(value.uses()):
        return
    producer = value.producer()
    if producer is not None:
        source = producer.inputs[0]
        model.graph.remove(producer, safe=True)
        if source is not None:
            _drop_unused(model, source)
    elif value.name in model.graph.initializers and not value.is_graph_input():
        del model.graph.initializers[value.name]


def unfuse_qkv(model: ir.Model) -> int:
    """Rewrite every fused QKV MatMul(+Add) -> Split(3) of the main graph into three MatMul(+Add); returns how many."""
    count = 0
    blocks: dict[str, list[ir.Value]] = {}  # constant name -> its three column blocks, made once: shared weights stay shared
    for node in list(model.graph):
        match = _match(node)
        if match is None:
            continue
        x, weight, bias, split, add = match
        tape = ir.tape.Tape()
        outs, parts = [], []  # parts: the projection each new node belongs to, in tape order
        for i, part in enumerate(_PARTS):
            out = tape.op("MatMul", [x, _block(blocks, weight, i, axis=1)])
            parts.append(part)
            if bias is not None:
                out = tape.op("Add", [out, _block(blocks, bias, i, axis=0)])
                parts.append(part)
            outs.append(out)
        scope = node.metadata_props.get(_SCOPE, "")
        for new_node, part in zip(tape.nodes, parts):
            new_node.name = f"{node.name or 'qkv'}_{part}_{new_node.op_type.lower()}"
            new_node.metadata_props.update(node.metadata_props)
            if scope:
                new_node.metadata_props[_SCOPE] = scope.replace(_FUSED, part)
            for j, value in enumerate(new_node.outputs):
                value.name = f"{new_node.name}_{j}"
        for value in (v for vs in blocks.values() for v in vs):
            if value.name not in model.graph.initializers:
                model.graph.register_initializer(value)
        old = [node, *([add] if add is not None else []), split]
        ir.convenience.replace_nodes_and_values(model.graph, split, old, tape.nodes, list(split.outputs), outs)
        _drop_unused(model, weight)
        if bias is not None:
            _drop_unused(model, bias)
        count += 1
    log.debug("unfuse_qkv: %d fused QKV projections split into three", count)
    return count
