"""Run a graph in a float type ONNX Runtime CPU has no kernels for, with that type's rounding.

ONNX Runtime's CPU provider registers bfloat16 for Cast but not for MatMul, Add or most other
ops (a bf16 export fails session creation with ``NOT_IMPLEMENTED : Could not find an
implementation for MatMul(13)``, onnxruntime 1.2x, measured in ``tests/export/test_bf16.py``).
A precision whose ``runtimes`` leave out ``"onnxruntime"`` is therefore judged through an
emulation: every tensor of its ONNX type becomes float32, and each value the graph computes
in that type is rounded to it right after the node that makes it (``Cast(to=T)`` then
``Cast(to=FLOAT)``). That is how TensorRT runs a bf16 layer: fp32 accumulation, the result
stored in bf16; weights are bf16 values already, so float32 holds them exactly. Sub-graphs
(``If``/``Loop`` bodies) are left as they are: the forms such a precision exports have none.
"""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from attn_export.vocab.precisions import PRECISIONS, float_precision_of

__all__ = ["emulated_model", "needs_emulation"]


def needs_emulation(model: onnx.ModelProto) -> str | None:
    """The ONNX type name to emulate when ``model``'s float type is one ONNX Runtime does not run, else None."""
    types = {t.data_type for t in model.graph.initializer} | {i.type.tensor_type.elem_type for i in model.graph.input}
    precision = PRECISIONS[float_precision_of(onnx.TensorProto.DataType.Name(t) for t in types)]
    return None if "onnxruntime" in precision.runtimes else precision.onnx_type


def emulated_model(model: onnx.ModelProto, type_name: str) -> onnx.ModelProto:
    """``model`` with every ``type_name`` tensor in float32 and each computed one rounded to ``type_name``."""
    elem, f32 = getattr(onnx.TensorProto, type_name), onnx.TensorProto.FLOAT
    typed = {v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    typed.update({v.name: v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)})
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for i, t in enumerate(g.initializer):
        if t.data_type == elem:
            g.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype("float32"), t.name))
    for v in (*g.input, *g.output, *g.value_info):
        if v.type.tensor_type.elem_type == elem:
            v.type.tensor_type.elem_type = f32
    nodes: list[onnx.NodeProto] = []
    rounded = {i.name: f"{i.name}__rounded" for i in model.graph.input if i.type.tensor_type.elem_type == elem}
    for name, to in rounded.items():  # what arrives in T is T: the feed keeps its name, the nodes read it rounded
        nodes += _round(to, elem, name)
    for node in g.node:
        node.input[:] = [rounded.get(i, i) for i in node.input]
        for a in node.attribute:
            if a.name == "to" and a.i == elem:
                a.i = f32
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == elem:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype("float32"), a.t.name))
        outs = [o for o in node.output if o and typed.get(o) == elem]
        renames = {o: f"{o}__unrounded" for o in outs}
        node.output[:] = [renames.get(o, o) for o in node.output]
        nodes.append(node)
        for o in outs:
            nodes += _round(o, elem, renames[o])
    g.ClearField("node")
    g.node.extend(nodes)
    return out


def _round(name: str, elem: int, src: str) -> list[onnx.NodeProto]:
    """``name`` = ``src`` rounded to the type ``elem`` and widened back to float32."""
    return [helper.make_node("Cast", [src], [f"{name}__t"], to=elem, name=f"{name}__round"),
            helper.make_node("Cast", [f"{name}__t"], [name], to=onnx.TensorProto.FLOAT, name=f"{name}__widen")]  # fmt: skip
