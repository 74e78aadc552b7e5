"""check-trt's rules for ``trt.TRT_Attention``: the parser's custom op that imports as an ``IAttention`` with packed layouts.

What the node must hold for TensorRT's ONNX parser to import it, from onnx-tensorrt
docs/TRT_custom_ops.md (``TRT_Attention``): ``query_form``/``kv_form`` are ``"padded_bhnd"`` or
``"packed_nhd"``; ``past_key``/``past_value`` (inputs 4, 5) are unsupported; a packed form needs its
lengths (input 6 ``query_lengths``, input 7 ``kv_lengths``, INT32, cumulative [batch + 1]); ``attn_mask``
(input 3) "is not supported when query_form is packed_nhd". The two lengths must be distinct tensors
(TensorRT-Edge-LLM, tensorrt_edgellm/models/ops.py: "TRT requires distinct inputs for these positions").
Which release imports the op at all is ``trt_support.CUSTOM_OP_SUPPORT`` (11.0); its packed forms need 11.1
("Updated TRT_Attention to support raggedness", onnx/onnx-tensorrt#1057). Whether a fused kernel exists follows ``trt_attention.iattention_kernel``
(fp16/bf16, head sizes 16-256 in multiples of 8); a node without one builds only when
``TRT_decomposable`` is 1.
"""

from __future__ import annotations

import onnx_ir as ir

from attn_export.checks.trt_attention import iattention_kernel
from attn_export.checks.trt_support import Finding
from attn_export.targets.trt_releases import PACKED_ATTENTION, TrtVersion

__all__ = ["trt_attention_rules"]

_FORMS = ("padded_bhnd", "packed_nhd")
_MASK, _PAST_KEY, _PAST_VALUE, _QUERY_LENGTHS, _KV_LENGTHS = 3, 4, 5, 6, 7


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if len(node.inputs) > index else None


def _string(node: ir.Node, name: str, default: str) -> str:
    return node.attributes[name].as_string() if name in node.attributes else default


def trt_attention_rules(node: ir.Node, version: TrtVersion) -> list[Finding]:
    """The findings for one ``trt.TRT_Attention`` node on TensorRT ``version`` (its import release is checked by the caller)."""
    name, op = node.name or "", f"{node.domain}.{node.op_type}"
    out: list[Finding] = []
    forms = {attr: _string(node, attr, "padded_bhnd") for attr in ("query_form", "kv_form")}
    for attr, form in forms.items():
        if form not in _FORMS:
            out.append(Finding("error", name, op, f"{attr} {form!r} is not an IO form the parser knows; use {' or '.join(_FORMS)}"))
        elif form == "packed_nhd" and version < PACKED_ATTENTION:
            out.append(Finding("error", name, op, f"{attr} packed_nhd needs TensorRT >= {PACKED_ATTENTION} (TRT_Attention gained raggedness "
                                                  f"there), target is {version}; export --encoder-form padded for this TensorRT"))  # fmt: skip
    if forms["query_form"] == "packed_nhd" and _input(node, _MASK) is not None:
        out.append(Finding("error", name, op, "attn_mask is not supported with a packed query (query_form packed_nhd); drop the mask "
                                              "(the lengths bound each sequence) or use the padded form"))  # fmt: skip
    for index, what in ((_PAST_KEY, "past_key"), (_PAST_VALUE, "past_value")):
        if _input(node, index) is not None:
            out.append(Finding("error", name, op, f"{what} (input {index}) is unsupported by the parser's TRT_Attention; drop it"))
    for attr, index, what in (("query_form", _QUERY_LENGTHS, "query_lengths"), ("kv_form", _KV_LENGTHS, "kv_lengths")):
        lengths = _input(node, index)
        if forms[attr] == "packed_nhd" and lengths is None:
            out.append(Finding("error", name, op, f"{attr} packed_nhd needs {what} (input {index}, INT32 cumulative offsets [batch + 1])"))
        elif lengths is not None and lengths.dtype is not None and lengths.dtype != ir.DataType.INT32:
            out.append(Finding("error", name, op, f"{what} ({lengths.name}) is {lengths.dtype.name}; the parser takes INT32: Cast it"))
    q_lengths, kv_lengths = _input(node, _QUERY_LENGTHS), _input(node, _KV_LENGTHS)
    if q_lengths is not None and q_lengths is kv_lengths:
        out.append(Finding("error", name, op, f"query_lengths and kv_lengths are one tensor ({q_lengths.name}); TensorRT needs two "
                                              "distinct tensors there: route kv_lengths through an Identity"))  # fmt: skip
    q = _input(node, 0)
    dtype = q.dtype.name if q is not None and q.dtype is not None else None
    shape = q.shape if q is not None else None
    head = shape[-1] if shape is not None and len(shape) and isinstance(shape[-1], int) else None
    fused, why = iattention_kernel(dtype, head, version, strongly_typed=True)
    decomposable = "TRT_decomposable" in node.attributes and node.attributes["TRT_decomposable"].as_int() == 1
    if fused is False and not decomposable:
        out.append(Finding("error", name, op, f"{why}; set TRT_decomposable=1 (the trt-packed export does)"))
    elif fused is False:
        out.append(Finding("warning", name, op, f"no fused kernel ({why.split(';')[0]}): TRT_decomposable=1 lets TensorRT decompose it "
                                                "into several kernels, still over the real tokens only; export fp16 for the fused one"))  # fmt: skip
    else:
        out.append(Finding("info", name, op, f"packed IAttention ({forms['query_form']} query, {forms['kv_form']} key/value): {why}"))
    return out
