"""Read back where quantization sits in an ONNX graph: zero points, weight granularity, quantized ops.

TensorRT's explicit quantization accepts only symmetric Q/DQ (zero point 0) and per-channel
weight scales, and fuses its int8 attention only for a fixed Q/DQ pattern. Counting nodes is
not enough to prove either, so ``inspect_qdq`` lists every QuantizeLinear / DequantizeLinear
with its zero points, every quantized weight with its axis, and for each other op which of
its inputs come from a DequantizeLinear and which of its outputs go into a QuantizeLinear.
Tests, the quantizer's own post-check and the TensorRT static checker all read this summary.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

__all__ = ["OpQdq", "QdqNode", "QdqSummary", "WeightQuant", "attention_bmms", "inspect_qdq", "is_constant"]

log = logging.getLogger(__name__)

_PASS_THROUGH = frozenset({"DequantizeLinear", "Transpose", "Reshape", "Cast", "Identity", "Unsqueeze", "Squeeze"})


def is_constant(value: ir.Value | None, _depth: int = 0) -> bool:
    """True for an initializer, a Constant's output, or a DequantizeLinear/Transpose/... of one."""
    if value is None:
        return False
    if value.const_value is not None or value.is_initializer():
        return True
    node = value.producer()
    if node is None:
        return False  # a graph input
    if node.op_type == "Constant":
        return True
    return node.op_type in _PASS_THROUGH and _depth < 4 and is_constant(node.inputs[0], _depth + 1)


def attention_bmms(graph: ir.Graph) -> list[ir.Node]:
    """MatMuls that are not ``activation @ 2-D weight``: Q @ K^T and P @ V of decomposed attention, whose two
    operands are both activations, and DeBERTa's content->position / position->content products
    (``layers.disentangled``), whose per-head operand (1, H, Dh, 2A) becomes a constant once ONNX Runtime folds
    the relative table's projection: batched per head, not a weight ONNX Runtime's int8 MatMul kernels take.

    Found by structure, not by name, so it works on any export (and on low-rank graphs,
    whose factor MatMuls all have a constant 2-D operand).
    """
    return [n for n in graph if n.op_type == "MatMul" and (not any(is_constant(v) for v in n.inputs) or _batched_constant(n.inputs[1]))]


def _batched_constant(value: ir.Value | None) -> bool:
    """A constant of rank > 2 (a weight is 2-D); unknown ranks count as weights."""
    if value is None or not is_constant(value):
        return False
    shape = value.const_value.shape if value.const_value is not None else value.shape
    return shape is not None and len(shape) > 2


@dataclass(frozen=True)
class QdqNode:
    """One QuantizeLinear or DequantizeLinear and its quantization parameters."""

    name: str
    op_type: str
    tensor: str  # the float tensor quantized (Q) or the int tensor dequantized (DQ)
    zero_points: tuple[int, ...]  # distinct values; () when the input is absent (= 0)
    scale_size: int
    axis: int | None
    dtype: str  # integer type of the quantized tensor, e.g. INT8

    @property
    def zero_point_is_zero(self) -> bool:
        return all(z == 0 for z in self.zero_points)


@dataclass(frozen=True)
class WeightQuant:
    """A constant weight stored quantized and read through a DequantizeLinear."""

    name: str
    shape: tuple[int, ...]
    per_channel: bool  # 1-D scale with one value per channel along ``axis``
    axis: int | None
    channels: int
    dtype: str


@dataclass(frozen=True)
class OpQdq:
    """A compute op and the Q/DQ on its edges (input/output positions)."""

    name: str
    op_type: str
    dq_inputs: tuple[int, ...]  # activation inputs read through a DequantizeLinear
    dq_weights: tuple[int, ...]  # constant inputs read through a DequantizeLinear
    q_outputs: tuple[int, ...]  # outputs that feed a QuantizeLinear


@dataclass
class QdqSummary:
    """Everything quantization-related in one graph; ``ops`` lists only ops that touch a Q/DQ."""

    quantize_linear: list[QdqNode] = field(default_factory=list)
    dequantize_linear: list[QdqNode] = field(default_factory=list)
    weights: list[WeightQuant] = field(default_factory=list)
    ops: list[OpQdq] = field(default_factory=list)
    attention_bmms: list[str] = field(default_factory=list)
    mask_adds: list[str] = field(default_factory=list)  # Adds producing a Softmax's input
    n_dynamic_quantize_linear: int = 0  # ONNX Runtime's dynamic route; TensorRT cannot parse it

    @property
    def n_quantize_linear(self) -> int:
        return len(self.quantize_linear)

    @property
    def n_dequantize_linear(self) -> int:
        return len(self.dequantize_linear)

    @property
    def nonzero_zero_points(self) -> list[str]:
        """Q/DQ nodes whose zero point is not 0 (TensorRT rejects them)."""
        return [q.name for q in self.quantize_linear + self.dequantize_linear if not q.zero_point_is_zero]

    @property
    def zero_points_all_zero(self) -> bool:
        return not self.nonzero_zero_points

    @property
    def per_tensor_weights(self) -> list[str]:
        return [w.name for w in self.weights if not w.per_channel]

    def op(self, name: str) -> OpQdq | None:
        return next((o for o in self.ops if o.name == name), None)

    def ops_of(self, op_type: str) -> list[OpQdq]:
        return [o for o in self.ops if o.op_type == op_type]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            n_quantize_linear=self.n_quantize_linear,
            n_dequantize_linear=self.n_dequantize_linear,
            zero_points_all_zero=self.zero_points_all_zero,
            per_tensor_weights=self.per_tensor_weights,
        )
        return d

    def describe(self) -> str:
        quantized = sorted({o.op_type for o in self.ops if o.dq_inputs or o.dq_weights})
        return (
            f"{self.n_quantize_linear} Q / {self.n_dequantize_linear} DQ, zero points "
            f"{'all 0' if self.zero_points_all_zero else 'NONZERO in ' + ', '.join(self.nonzero_zero_points[:3])}, "
            f"{len(self.weights) - len(self.per_tensor_weights)}/{len(self.weights)} weights per channel, "
            f"quantized ops: {', '.join(quantized) or 'none'}"
        )


def _ints(value: ir.Value | None) -> tuple[int, ...]:
    if value is None or value.const_value is None:
        return ()
    return tuple(sorted({int(v) for v in np.asarray(value.const_value.numpy()).ravel()}))


def _qdq_node(node: ir.Node) -> QdqNode:
    scale = node.inputs[1]
    zp = node.inputs[2] if len(node.inputs) > 2 else None
    size = int(np.prod(scale.shape.numpy())) if scale is not None and scale.shape is not None else 1
    axis_attr = node.attributes.get("axis")
    int_value = node.outputs[0] if node.op_type == "QuantizeLinear" else node.inputs[0]
    if zp is not None and zp.dtype is not None:
        dtype = zp.dtype.name
    elif node.op_type == "QuantizeLinear":
        dtype = "UINT8"  # the ONNX default when the zero point is omitted
    else:
        dtype = int_value.dtype.name if int_value is not None and int_value.dtype is not None else "UNKNOWN"
    tensor = node.inputs[0].name if node.op_type == "QuantizeLinear" else node.outputs[0].name
    return QdqNode(
        name=node.name or "",
        op_type=node.op_type,
        tensor=tensor or "",
        zero_points=_ints(zp),
        scale_size=size,
        axis=(axis_attr.as_int() if axis_attr is not None else (1 if size > 1 else None)),
        dtype=dtype,
    )


def inspect_qdq(model: str | os.PathLike[str] | onnx.ModelProto | ir.Model) -> QdqSummary:
    """Summarise the quantization of an ONNX model (a path, a ModelProto or an onnx_ir Model)."""
    if isinstance(model, ir.Model):
        graph = model.graph
    else:
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model))
        graph = ir.serde.deserialize_model(proto).graph
    summary = QdqSummary()
    summary.attention_bmms = [n.name or "" for n in attention_bmms(graph)]
    for node in graph.all_nodes():
        if node.op_type == "DynamicQuantizeLinear":
            summary.n_dynamic_quantize_linear += 1
        elif node.op_type == "QuantizeLinear":
            summary.quantize_linear.append(_qdq_node(node))
        elif node.op_type == "DequantizeLinear":
            q = _qdq_node(node)
            summary.dequantize_linear.append(q)
            src = node.inputs[0]
            if src is not None and is_constant(src):
                shape = tuple(int(d) for d in src.shape.numpy()) if src.shape is not None else ()
                summary.weights.append(WeightQuant(src.name or "", shape, q.scale_size > 1, q.axis, q.scale_size, q.dtype))
        else:
            if node.op_type == "Add" and any(u.op_type == "Softmax" for u, _ in node.outputs[0].uses()):
                summary.mask_adds.append(node.name or "")
            op = _op_qdq(node)
            if op.dq_inputs or op.dq_weights or op.q_outputs:
                summary.ops.append(op)
    log.debug("qdq summary: %s", summary.describe())
    return summary


def _op_qdq(node: ir.Node) -> OpQdq:
    dq_in: list[int] = []
    dq_w: list[int] = []
    for i, value in enumerate(node.inputs):
        producer = value.producer() if value is not None else None
        if producer is not None and producer.op_type == "DequantizeLinear":
            (dq_w if is_constant(producer.inputs[0]) else dq_in).append(i)
    q_out = [i for i, out in enumerate(node.outputs) if any(u.op_type == "QuantizeLinear" for u, _ in out.uses())]
    return OpQdq(node.name or "", node.op_type, tuple(dq_in), tuple(dq_w), tuple(q_out))
