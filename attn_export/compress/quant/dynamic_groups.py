"""The dynamic int8 route's GEMMs written as Q/DQ, so the static route's sensitivity machinery can rank them.

ONNX Runtime's ``quantize_dynamic`` rewrites each weight MatMul ``N`` as
``DynamicQuantizeLinear(x) -> MatMulInteger(N_quant) -> Cast -> Mul(scales)``, with the
int8 weight ``W_quantized`` and its per-channel ``W_scale`` / ``W_zero_point`` as
initializers. That chain has no float twin to switch to, so ``dynamic_qdq_model`` writes
the same arithmetic on the float graph the quantizer read: the activation through
``DynamicQuantizeLinear -> DequantizeLinear`` (ranges taken per batch, as at run time) and
the weight through ``DequantizeLinear`` of the quantizer's own int8 weight. The result is a
Q/DQ graph ``gemm_groups.find_gemms`` inventories and ``SwitchableGraph`` switches group by
group, in one session; the GEMMs the search keeps in float are then excluded from a second
``quantize_dynamic`` (``nodes_to_exclude``), so the shipped model is the quantizer's own.

What the view does not reproduce: MatMulInteger's int32 accumulation (float here: a
difference of ~1e-7 relative) and the U8S8 saturation of CPUs without VNNI, which the
route's 7-bit weights already prevent (``int8_encoding``). The shipped model is judged again
on the real kernels by the pipeline.
"""

from __future__ import annotations

import onnx_ir as ir

from attn_export.compress.quant.per_token import per_token_view
from attn_export.errors import ExportError
from attn_export.export.passes.graph_constants import typed_initializer

__all__ = ["dynamic_qdq_model", "quantized_matmuls"]

_QUANT_SUFFIX = "_quant"  # onnxruntime.quantization.operators.matmul: MatMulInteger is named f"{node.name}_quant"


def quantized_matmuls(quantized: ir.Model) -> dict[str, ir.Node]:
    """Original MatMul name -> the MatMulInteger ``quantize_dynamic`` wrote for it."""
    return {n.name.removesuffix(_QUANT_SUFFIX): n for n in quantized.graph if n.op_type == "MatMulInteger" and n.name.endswith(_QUANT_SUFFIX)}


def _per_token_matmuls(quantized: ir.Model) -> dict[str, ir.Node]:
    """Original MatMul name -> the MatMulIntegerToFloat ``per_token_pass`` wrote for it."""
    suffix = "_per_token"
    return {n.name.removesuffix(suffix): n for n in quantized.graph if n.op_type == "MatMulIntegerToFloat" and n.name.endswith(suffix)}


def _weight_quantization(node: ir.Node, initializers: dict[str, ir.Value]) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(int8 weight, scale, zero point) of a MatMulInteger (or the per-token route's MatMulIntegerToFloat, which keeps
    the same weight and zero point): the quantizer names the scale after the weight."""
    zp_index = 5 if node.op_type == "MatMulIntegerToFloat" else 3
    weight, zero_point = node.inputs[1], node.inputs[zp_index] if len(node.inputs) > zp_index else None
    base = (weight.name or "").removesuffix("_quantized") if weight is not None else ""
    scale = initializers.get(f"{base}_scale")
    if weight is None or weight.const_value is None or zero_point is None or zero_point.const_value is None or scale is None:
        raise ExportError(f"{node.name}: expected quantize_dynamic's int8 weight with its _scale and _zero_point initializers")
    return weight, scale, zero_point


def dynamic_qdq_model(float_model: ir.Model, quantized: ir.Model, per_token: bool = False) -> ir.Model:
    """A copy of ``float_model`` whose quantized MatMuls read Q/DQ activations and weights (see the module docstring).

    ``float_model`` must be the graph ``quantize_dynamic`` read (node names are the link); ``quantized`` its
    output. ``per_token``: the activations are quantized per row, as the per-token route's model does
    (``per_token.per_token_view``), and ``quantized`` is that route's model (its GEMMs named ``<MatMul>_per_token``).
    """
    model = ir.serde.deserialize_model(ir.serde.serialize_model(float_model))
    graph = model.graph
    integer = _per_token_matmuls(quantized) if per_token else quantized_matmuls(quantized)
    if per_token:
        model.opset_imports[""] = max(model.opset_imports.get("", 0), 21)  # blocked QuantizeLinear / DequantizeLinear
    initializers = dict(quantized.graph.initializers)
    activations: dict[int, ir.Value] = {}  # one DynamicQuantizeLinear per activation, as the quantizer shares it
    found = 0
    for node in list(graph):
        if node.op_type != "MatMul" or node.name not in integer:
            continue
        wq, scale, zp = _weight_quantization(integer[node.name], initializers)
        weight_in = [typed_initializer(graph, v.name or "w", v.const_value.numpy()) for v in (wq, scale, zp)]  # type: ignore[union-attr]
        axis = 1 if len(scale.const_value.shape) == 1 and scale.const_value.shape[0] > 1 else None  # type: ignore[union-attr]
        w_dq = ir.node("DequantizeLinear", weight_in, attributes={"axis": axis} if axis is not None else {}, name=f"{node.name}_weight_dq")
        w_dq.outputs[0].name = f"{node.name}_weight_dequantized"
        w_dq.outputs[0].type, w_dq.outputs[0].shape = ir.TensorType(ir.DataType.FLOAT), wq.shape
        new = [w_dq]
        x = node.inputs[0]
        if id(x) not in activations and per_token:
            width = int(wq.const_value.shape[0])  # type: ignore[union-attr]
            view, activations[id(x)] = per_token_view(x, width, graph, f"{node.name}_input_per_token")  # type: ignore[arg-type]
            new = [*view, w_dq]
        elif id(x) not in activations:
            dql = ir.node("DynamicQuantizeLinear", [x], num_outputs=3, name=f"{node.name}_input_dql")
            for out, suffix in zip(dql.outputs, ("quantized", "scale", "zero_point")):
                out.name = f"{node.name}_input_{suffix}"
            dq = ir.node("DequantizeLinear", list(dql.outputs), name=f"{node.name}_input_dq")
            dq.outputs[0].name = f"{node.name}_input_dequantized"
            dq.outputs[0].type, dq.outputs[0].shape = ir.TensorType(ir.DataType.FLOAT), x.shape  # type: ignore[union-attr]
            activations[id(x)] = dq.outputs[0]
            new = [dql, dq, w_dq]
        graph.insert_before(node, new)
        node.replace_input_with(0, activations[id(x)])
        node.replace_input_with(1, w_dq.outputs[0])
        found += 1
    if not found:
        raise ExportError("the dynamic int8 model has no MatMulInteger named after a MatMul of the float graph; pass the graph quantize_dynamic read")
    return model
