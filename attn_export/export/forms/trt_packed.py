"""The ``trt-packed`` form's graph passes: the deployable graph's last touch, and its decomposed twin for ONNX Runtime.

The form (``layers.packed_forms``) writes ``trt.TRT_Attention`` nodes that TensorRT 11's ONNX parser
imports as one ``IAttention`` with packed (``PACKED_NHD``) query and key/value layouts. Two passes:

* ``finish_packed_iattention``: names each node ``packed_iattention_<i>`` in graph order (what check-trt
  and the engine's layer names show, instead of the exporter's ``node__symbolic``), then
  ``separate_lengths``: the exporter's optimizer merges the identical ``query_lengths`` and
  ``kv_lengths`` computations into one value; TensorRT needs two distinct tensors in those positions
  (TensorRT-Edge-LLM, tensorrt_edgellm/models/ops.py, ``trt_ragged_attention``: "TRT requires
  distinct inputs for these positions"), so ``kv_lengths`` goes through an ``Identity``.
* ``decomposed_twin``: ONNX Runtime has no kernel for the TensorRT parser's custom op. The twin is
  the same graph with each ``TRT_Attention`` written in standard ONNX ops with the op's semantics
  (onnx-tensorrt docs/TRT_custom_ops.md): row n of Q attends the K/V rows of its own sequence,
  ``[lengths[i], lengths[i+1])``, scaled by ``scale``, softmax in float32. It materialises a
  (H, T, T) score tensor, so it is for judging the graph's numbers here (tests, the pipeline's ONNX
  Runtime emulation of a TensorRT target), never for speed. Everything else in the graph is the
  deployed graph's own nodes.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnx_ir as ir

from attn_export.errors import ExportError
from attn_export.layers.packed_forms import TRT_ATTENTION, TRT_DOMAIN

__all__ = ["FORM_PASSES", "decomposed_twin", "finish_packed_iattention", "has_trt_attention", "separate_lengths"]

log = logging.getLogger(__name__)

_NEG = float(np.finfo(np.float32).min) / 2  # finite after adding a score: a masked key's weight underflows to 0
_QUERY_LENGTHS, _KV_LENGTHS = 6, 7  # TRT_Attention's input indices (docs/TRT_custom_ops.md)


def _trt_nodes(model: ir.Model) -> list[ir.Node]:
    return [n for n in model.graph.all_nodes() if n.domain == TRT_DOMAIN and n.op_type == TRT_ATTENTION]


def has_trt_attention(model: onnx.ModelProto) -> bool:
    """The graph holds a ``trt.TRT_Attention`` node (ONNX Runtime cannot run it: use ``decomposed_twin``)."""
    return any(n.domain == TRT_DOMAIN and n.op_type == TRT_ATTENTION for n in model.graph.node)


def separate_lengths(model: ir.Model) -> int:
    """Give every ``TRT_Attention`` whose query and key/value lengths are one value a second tensor (in place); returns how many."""
    count = 0
    for node in _trt_nodes(model):
        inputs = list(node.inputs)
        if len(inputs) <= _KV_LENGTHS or inputs[_QUERY_LENGTHS] is None or inputs[_KV_LENGTHS] is not inputs[_QUERY_LENGTHS]:
            continue
        copy = ir.Node("", "Identity", [inputs[_KV_LENGTHS]], name=f"{node.name}_kv_lengths")
        copy.outputs[0].name = f"{node.name}_kv_lengths"
        copy.outputs[0].dtype, copy.outputs[0].shape = inputs[_KV_LENGTHS].dtype, inputs[_KV_LENGTHS].shape
        node.graph.insert_before(node, copy)
        node.replace_input_with(_KV_LENGTHS, copy.outputs[0])
        count += 1
    return count


def finish_packed_iattention(model: ir.Model) -> int:
    """Name every ``TRT_Attention`` ``packed_iattention_<i>`` and give it distinct lengths (in place); returns how many nodes."""
    nodes = _trt_nodes(model)
    for i, node in enumerate(nodes):
        node.name = f"packed_iattention_{i}"
    separate_lengths(model)
    return len(nodes)


def decomposed_twin(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` with every ``trt.TRT_Attention`` in standard ONNX ops, and how many were replaced."""
    twin = ir.serde.deserialize_model(model)
    nodes = _trt_nodes(twin)
    for i, node in enumerate(nodes):
        _decompose(node, f"trt_attention_twin{i}")
    if nodes:
        twin.opset_imports.pop(TRT_DOMAIN, None)
    log.debug("decomposed twin: %d TRT_Attention node(s) written in standard ops", len(nodes))
    return ir.serde.serialize_model(twin), len(nodes)


def _decompose(node: ir.Node, prefix: str) -> None:
    q, k, v = node.inputs[0], node.inputs[1], node.inputs[2]
    q_len = node.inputs[_QUERY_LENGTHS] if len(node.inputs) > _QUERY_LENGTHS else None
    kv_len = node.inputs[_KV_LENGTHS] if len(node.inputs) > _KV_LENGTHS else None
    forms = {name: node.attributes[name].as_string() if name in node.attributes else "padded_bhnd" for name in ("query_form", "kv_form")}
    if q is None or k is None or v is None or q_len is None or kv_len is None or set(forms.values()) != {"packed_nhd"}:
        raise ExportError(f"expected a packed TRT_Attention (q, k, v, lengths; packed_nhd forms) at {node.name!r}, got {forms}; "
                          "the twin covers the trt-packed form's nodes only")  # fmt: skip
    if "scale" not in node.attributes:
        raise ExportError(f"expected a scale attribute on TRT_Attention {node.name!r}; re-export with the trt-packed form")
    scale = node.attributes["scale"].as_float()
    tape = ir.tape.Tape()

    def const(value: np.ndarray) -> ir.Value:
        return tape.op("Constant", [], {"value": ir.tensor(value)})

    def segments(rows_of: ir.Value, lengths: ir.Value) -> ir.Value:
        """(N,) the sequence of each packed row: how many sequence ends lie at or before it."""
        n = tape.op("Squeeze", [tape.op("Shape", [rows_of], {"start": 0, "end": 1}), const(np.array([0], np.int64))])
        rows = tape.op("Range", [const(np.array(0, np.int64)), n, const(np.array(1, np.int64))])  # (N,)
        ends = tape.op("Slice", [tape.op("Cast", [lengths], {"to": int(ir.DataType.INT64)}), const(np.array([1], np.int64)),
                                 const(np.array([np.iinfo(np.int64).max], np.int64))])  # (B,) fmt: skip
        past = tape.op("GreaterOrEqual", [tape.op("Unsqueeze", [rows, const(np.array([1], np.int64))]),
                                          tape.op("Unsqueeze", [ends, const(np.array([0], np.int64))])])  # (N, B) fmt: skip
        return tape.op("ReduceSum", [tape.op("Cast", [past], {"to": int(ir.DataType.INT64)}), const(np.array([1], np.int64))], {"keepdims": 0})

    same = tape.op("Equal", [tape.op("Unsqueeze", [segments(q, q_len), const(np.array([1], np.int64))]),
                             tape.op("Unsqueeze", [segments(k, kv_len), const(np.array([0], np.int64))])])  # (N, M) fmt: skip
    f32 = int(ir.DataType.FLOAT)
    qh = tape.op("Transpose", [tape.op("Cast", [q], {"to": f32})], {"perm": [1, 0, 2]})  # (H, N, Dh)
    kt = tape.op("Transpose", [tape.op("Cast", [k], {"to": f32})], {"perm": [1, 2, 0]})  # (H, Dh, M)
    vh = tape.op("Transpose", [tape.op("Cast", [v], {"to": f32})], {"perm": [1, 0, 2]})  # (H, M, Dh)
    scores = tape.op("Mul", [tape.op("MatMul", [qh, kt]), const(np.array(scale, np.float32))])  # (H, N, M), fp32
    probs = tape.op("Softmax", [tape.op("Where", [same, scores, const(np.array(_NEG, np.float32))])], {"axis": -1})
    out = tape.op("Transpose", [tape.op("MatMul", [probs, vh])], {"perm": [1, 0, 2]})  # (N, H, Dh)
    out = tape.op("Cast", [out], {"to": int(q.dtype if q.dtype is not None else ir.DataType.FLOAT)})
    for i, new in enumerate(tape.nodes):
        new.name = f"{prefix}_{i}"
        for j, value in enumerate(new.outputs):
            value.name = f"{prefix}_{i}_{j}"
    graph = node.graph
    if graph is None:
        raise ExportError(f"TRT_Attention node {node.name!r} is not in a graph")
    name = node.outputs[0].name
    ir.convenience.replace_nodes_and_values(graph, node, [node], list(tape.nodes), [node.outputs[0]], [out])
    out.name = name  # the twin keeps every value name of the deployed graph (what probes and comparisons read)


# The graph pass each attention form needs after export (export.onnx_export runs it): returns how many nodes it changed.
FORM_PASSES = {"trt-packed": finish_packed_iattention}
