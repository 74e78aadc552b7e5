"""Attention-specific TensorRT rules: the ``Attention`` op's contract and MHA fusion odds.

Split from ``trt_compat`` because attention is where a graph can parse fine and still run
badly: TensorRT fuses Q.K^T -> softmax -> .V into one MHA kernel only for head sizes of
16-256 in multiples of 8 (fp16), or 16/32/64 with sequences up to 512 (int8), and a fp32
softmax island pinned between the two BMMs of a strongly typed fp16 graph stops the fusion.
Those are warnings: the engine still runs, slower. A mask TensorRT cannot broadcast, or an
``Attention`` input it does not import, is an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx_ir as ir

from attn_export.export.trt_support import Finding
from attn_export.runtime.trt_spec import ShapeProfile, TrtVersion

__all__ = ["AttentionBlock", "find_attention_blocks", "attention_findings", "mha_fusion_findings"]

log = logging.getLogger(__name__)

_PASS_UP = ("Cast", "Add", "Where", "Mul", "Div", "Sub")
_PASS_DOWN = ("Cast", "Where", "Mul")


@dataclass(frozen=True)
class AttentionBlock:
    """One attention computation: a fused ``Attention`` node or a MatMul-Softmax-MatMul chain."""

    node: str  # Attention node or the Softmax of a decomposed block
    form: str  # "onnx-attention" | "decomposed"
    head_size: int | None
    seq: int | None  # static sequence length when known
    bmm_dtype: str | None  # dtype of the BMMs (FLOAT16, FLOAT...)
    softmax_dtype: str | None
    quantized: bool  # BMM inputs come from DequantizeLinear


def _dim(shape: ir.Shape | None, axis: int) -> int | str | None:
    if shape is None or len(shape) <= abs(axis) - (1 if axis < 0 else 0):
        return None
    d = shape[axis]
    return d if isinstance(d, int) else d.value


def _dtype(value: ir.Value | None) -> str | None:
    return None if value is None or value.dtype is None else value.dtype.name


def _up(value: ir.Value | None, skip: tuple[str, ...]) -> ir.Node | None:
    node = value.producer() if value is not None else None
    for _ in range(8):
        if node is None or node.op_type not in skip:
            return node
        node = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
    return node


def _down_matmul(value: ir.Value, hops: int = 0) -> ir.Node | None:
    for user, idx in value.uses():
        if user.op_type == "MatMul" and idx == 0:
            return user
        if user.op_type in _PASS_DOWN and hops < 4:
            found = _down_matmul(user.outputs[0], hops + 1)
            if found is not None:
                return found
    return None


def _from_dq(value: ir.Value | None) -> bool:
    src = _up(value, ("Transpose", "Reshape", "Mul"))
    return src is not None and src.op_type == "DequantizeLinear"


def find_attention_blocks(model: ir.Model) -> list[AttentionBlock]:
    """Every attention block in the graph, with its head size and precision."""
    blocks: list[AttentionBlock] = []
    for node in model.graph.all_nodes():
        if node.op_type == "Attention" and not node.domain:
            q = node.inputs[0]
            quant = all(_from_dq(v) for v in node.inputs[:3])
            seq = _dim(q.shape, 2) if q is not None else None
            sp = node.attributes.get("softmax_precision")
            softmax = "FLOAT" if sp is not None and sp.as_int() == 1 else _dtype(q)
            head = _dim(q.shape, -1) if q is not None else None
            blocks.append(AttentionBlock(node.name or "", "onnx-attention", _int(head), _int(seq), _dtype(q), softmax, quant))
        elif node.op_type == "Softmax":
            bmm1 = _up(node.inputs[0], _PASS_UP)
            bmm2 = _down_matmul(node.outputs[0])
            if bmm1 is None or bmm1.op_type != "MatMul" or bmm2 is None:
                continue
            q = bmm1.inputs[0]
            quant = _from_dq(bmm1.inputs[0]) and _from_dq(bmm1.inputs[1])
            head, seq = (_dim(q.shape, -1), _dim(q.shape, -2)) if q is not None else (None, None)
            blocks.append(AttentionBlock(node.name or "", "decomposed", _int(head), _int(seq), _dtype(bmm1.outputs[0]), _dtype(node.inputs[0]), quant))
    return blocks


def _int(d: int | str | None) -> int | None:
    return d if isinstance(d, int) and d > 0 else None


def attention_findings(model: ir.Model, version: TrtVersion) -> list[Finding]:
    """The ONNX ``Attention`` op as TensorRT's importer takes it (4D Q/K/V, mask [B|1,H|1,Lq,Lk])."""
    out: list[Finding] = []
    for node in model.graph.all_nodes():
        if node.op_type != "Attention" or node.domain:
            continue
        name, op = node.name or "", "Attention"
        q, k = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
        for i, label in ((0, "Q"), (1, "K"), (2, "V")):
            v = node.inputs[i] if i < len(node.inputs) else None
            if v is not None and v.shape is not None and len(v.shape) != 4:
                out.append(Finding("error", name, op, f"{label} is {len(v.shape)}D; TensorRT imports only 4D [B, H, L, Dh] Q/K/V (no q_num_heads 3D form)"))
        for i, label in ((4, "past_key"), (5, "past_value"), (6, "nonpad_kv_seqlen")):
            if i < len(node.inputs) and node.inputs[i] is not None:
                out.append(Finding("error", name, op, f"input {label} is not supported by TensorRT's Attention importer"))
        for i, label in ((1, "present_key"), (2, "present_value"), (3, "qk_matmul_output")):
            if i < len(node.outputs) and (node.outputs[i].uses() or node.outputs[i].is_graph_output()):
                out.append(Finding("error", name, op, f"output {label} is not supported by TensorRT's Attention importer"))
        for attr in ("qk_matmul_output_mode", "softcap"):
            a = node.attributes.get(attr)
            if a is not None and (a.as_int() if attr == "qk_matmul_output_mode" else a.as_float()) != 0:
                out.append(Finding("error", name, op, f"attribute {attr} is not supported by TensorRT's Attention importer"))
        mask = node.inputs[3] if len(node.inputs) > 3 else None
        if mask is not None:
            out.extend(_mask_findings(name, op, q, k, mask))
        sp = node.attributes.get("softmax_precision")
        if _dtype(q) in ("FLOAT16", "BFLOAT16") and (sp is None or sp.as_int() != 1):
            out.append(Finding("warning", name, op, "softmax runs in the input precision; set softmax_precision=1 (FLOAT) for a fp32 softmax inside IAttention"))
    return out


def _mask_findings(name: str, op: str, q: ir.Value | None, k: ir.Value | None, mask: ir.Value) -> list[Finding]:
    out: list[Finding] = []
    mdt, qdt = _dtype(mask), _dtype(q)
    if mdt is not None and qdt is not None and mdt not in ("BOOL", qdt):
        out.append(Finding("error", name, op, f"attn_mask is {mdt} but Q is {qdt}; IAttention takes a BOOL mask or an add mask of Q's type"))
    if mask.shape is None:
        return out
    if len(mask.shape) != 4:
        out.append(Finding("error", name, op, f"attn_mask is {len(mask.shape)}D; TensorRT needs a 4D mask [B|1, H|1, Lq, Lk]"))
        return out
    lq, lk = _dim(mask.shape, 2), _dim(mask.shape, 3)
    q_lq = _dim(q.shape, 2) if q is not None else None
    k_lk = _dim(k.shape, 2) if k is not None else None
    shape = [_dim(mask.shape, i) for i in range(4)]
    if lq == 1 and q_lq != 1:
        out.append(Finding("error", name, op, f"attn_mask shape {shape} broadcasts over the query axis; IAttention needs [B, 1, Lq, Lk]: expand the mask to Lq (the toolkit's onnx-attention export does)"))
    elif lq is not None and q_lq is not None and lq != q_lq:
        out.append(Finding("error", name, op, f"attn_mask dim 2 is {lq} but Q's sequence is {q_lq}; IAttention needs [B, 1, Lq, Lk]"))
    if lk is not None and k_lk is not None and lk != k_lk:
        out.append(Finding("error", name, op, f"attn_mask dim 3 is {lk} but K's sequence is {k_lk}; IAttention needs [B, 1, Lq, Lk]"))
    return out


def mha_fusion_findings(model: ir.Model, version: TrtVersion, precision: str, profiles: ShapeProfile | None) -> list[Finding]:
    """Warnings for attention blocks TensorRT will probably not fuse into an MHA kernel."""
    out: list[Finding] = []
    for blk in find_attention_blocks(model):
        op = "Attention" if blk.form == "onnx-attention" else "Softmax"
        dh = blk.head_size
        if blk.quantized:
            max_seq = profiles.max[1] if profiles is not None else blk.seq
            if dh is not None and dh not in (16, 32, 64):
                out.append(Finding("warning", blk.node, op, f"head size {dh}: int8 fused MHA needs 16, 32 or 64; this attention will run unfused"))
            if max_seq is None:
                out.append(Finding("warning", blk.node, op, "sequence length unknown: int8 fused MHA only covers seq <= 512; pass --max-shape to check"))
            elif max_seq > 512:
                out.append(Finding("warning", blk.node, op, f"max sequence {max_seq} > 512: int8 fused MHA only covers seq <= 512; attention will run unfused (or keep the BMMs in fp16)"))
            continue
        half = blk.bmm_dtype in ("FLOAT16", "BFLOAT16") or precision in ("fp16", "int8")
        if not half:
            out.append(Finding("info", blk.node, op, "fp32 attention: TensorRT's fused MHA kernels are fp16/bf16/int8; build --precision fp16 to fuse"))
            continue
        if dh is not None and not (16 <= dh <= 256 and dh % 8 == 0):
            out.append(Finding("warning", blk.node, op, f"head size {dh}: fused fp16 MHA needs 16-256 in multiples of 8; this attention will run unfused"))
        if blk.form == "decomposed" and blk.bmm_dtype in ("FLOAT16", "BFLOAT16") and blk.softmax_dtype == "FLOAT":
            hint = "export --attention onnx-attention (IAttention keeps the softmax in fp32 inside the kernel)" if version >= TrtVersion(10, 14) else "build a fp32 graph with --fp16 instead (--target jetson)"
            out.append(Finding("warning", blk.node, op, f"fp32 softmax island between fp16 BMMs: a strongly typed build will not fuse this attention into an MHA kernel; {hint}"))
    return out
