"""Read back what an exported graph contains: attention blocks, fused ops and fp32 islands.

An export that claims fused attention but contains none shows up here as ``fused == 0``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import onnx
import onnx_ir as ir

__all__ = ["FUSED_ATTENTION_OPS", "GraphSummary", "Island", "summarize_graph"]

# (domain, op_type) of single-node attention kernels the toolkit emits.
FUSED_ATTENTION_OPS: frozenset[tuple[str, str]] = frozenset(
    {("", "Attention"), ("com.microsoft", "MultiHeadAttention"), ("com.microsoft", "GroupQueryAttention"), ("trt", "TRT_Attention")}
)
_ISLAND_OPS = ("Softmax", "LayerNormalization")


@dataclass
class Island:
    """One precision-sensitive node with the dtypes it actually sees."""

    op: str
    node: str
    input_dtype: str
    output_dtype: str


@dataclass
class GraphSummary:
    opset: int
    attention_blocks: int  # decomposed MatMul->Softmax->MatMul chains plus fused ops
    fused_attention: int  # single-node attention kernels
    fused_ops: dict[str, int]
    islands: list[Island] = field(default_factory=list)
    op_counts: dict[str, int] = field(default_factory=dict)
    dtypes_of_floats: list[str] = field(default_factory=list)

    @property
    def island_dtypes_ok(self) -> bool:
        """True when every Softmax/LayerNorm reads and writes float32."""
        return all(i.input_dtype == "FLOAT" and i.output_dtype == "FLOAT" for i in self.islands)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["island_dtypes_ok"] = self.island_dtypes_ok
        return d


def _dtype_name(value: ir.Value | None) -> str:
    if value is None or value.dtype is None:
        return "UNKNOWN"
    return value.dtype.name


def _producer_through(value: ir.Value | None, skip: Iterable[str]) -> ir.Node | None:
    """Walk up through pass-through ops (Cast, Add of a mask, Where...) to the real producer."""
    skip = set(skip)
    node = value.producer() if value is not None else None
    hops = 0
    while node is not None and node.op_type in skip and hops < 8:
        node = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
        hops += 1
    return node


def _feeds_matmul(value: ir.Value, hops: int = 0) -> bool:
    for user, _ in value.uses():
        if user.op_type == "MatMul":
            return True
        if user.op_type in ("Cast", "Where", "Mul") and hops < 4 and _feeds_matmul(user.outputs[0], hops + 1):
            return True
    return False


def summarize_graph(model: onnx.ModelProto | str) -> GraphSummary:
    """Count attention blocks/fused ops and list Softmax/LayerNorm dtypes (shape-inferred)."""
    proto = onnx.load(model) if isinstance(model, str) else model
    try:
        proto = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:  # inference is best effort: contrib ops have no schema in onnx
        pass
    graph_ir = ir.serde.deserialize_model(proto)
    opset = graph_ir.opset_imports.get("", 0)
    op_counts: dict[str, int] = {}
    fused: dict[str, int] = {}
    decomposed = 0
    islands: list[Island] = []
    float_types: set[str] = set()
    for node in graph_ir.graph.all_nodes():
        key = node.op_type if not node.domain else f"{node.domain}.{node.op_type}"
        op_counts[key] = op_counts.get(key, 0) + 1
        if (node.domain or "", node.op_type) in FUSED_ATTENTION_OPS:
            fused[key] = fused.get(key, 0) + 1
        if node.op_type in _ISLAND_OPS:
            islands.append(Island(node.op_type, node.name or "", _dtype_name(node.inputs[0]), _dtype_name(node.outputs[0])))
        if node.op_type == "Softmax":
            src = _producer_through(node.inputs[0], ("Cast", "Add", "Where", "Mul", "Div"))
            if src is not None and src.op_type == "MatMul" and _feeds_matmul(node.outputs[0]):
                decomposed += 1
        for out in node.outputs:
            if out.dtype is not None and out.dtype.name in ("FLOAT", "FLOAT16", "BFLOAT16"):
                float_types.add(out.dtype.name)
    n_fused = sum(fused.values())
    return GraphSummary(
        opset=opset,
        attention_blocks=decomposed + n_fused,
        fused_attention=n_fused,
        fused_ops=fused,
        islands=islands,
        op_counts=dict(sorted(op_counts.items())),
        dtypes_of_floats=sorted(float_types),
    )
