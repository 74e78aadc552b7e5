"""Attention-specific TensorRT rules: which attention form TensorRT can build, and MHA fusion odds.

Split from ``trt_compat`` because attention is where a graph can parse fine and still fail
or run badly. Two forms reach TensorRT:

* **ONNX ``Attention``** (TensorRT >= 10.14) becomes ``IAttention``. The onnx-tensorrt
  importer leaves it non-decomposable (``TRT_decomposable`` defaults to 0), and "by default,
  IAttention is not decomposable and TensorRT will try to use a single fused kernel"
  (NvInfer.h, release/10.14 and release/11.0): an ``Attention`` node with no fused kernel
  (fp32, int8 under strong typing, a head size outside the kernels' range) most likely
  fails the build. ``trt_attention_form`` therefore picks the decomposed form at export
  time for those cases and says why, and the static check reports such a node as an error.
* **Decomposed** MatMul -> Softmax -> MatMul always builds; TensorRT fuses it into one MHA
  kernel only for head sizes of 16-256 in multiples of 8 (fp16), or 16/32/64 with sequences
  up to 512 (int8), and a fp32 softmax island pinned between the two BMMs of a strongly
  typed fp16 graph stops the fusion. Those are warnings: the engine runs, slower.

The importer does not read ``Attention``'s ``softmax_precision`` attribute, so nothing here
claims a fp32 softmax inside IAttention; the decomposed form keeps its softmax in fp32 by
construction (Cast -> Softmax -> Cast).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx_ir as ir

from attn_export.checks.trt_support import Finding
from attn_export.errors import ConfigError
from attn_export.targets.shape_profile import ShapeProfile
from attn_export.targets.trt_releases import TrtVersion, parse_trt_version
from attn_export.vocab.precisions import PRECISIONS, float_precision_of

__all__ = [
    "AttentionBlock",
    "FUSED_FP16_HEAD_SIZES",
    "attention_findings",
    "find_attention_blocks",
    "iattention_kernel",
    "mha_fusion_findings",
    "trt_attention_form",
]

log = logging.getLogger(__name__)

_PASS_UP = ("Cast", "Add", "Where", "Mul", "Div", "Sub")
_PASS_DOWN = ("Cast", "Where", "Mul", "QuantizeLinear", "DequantizeLinear")  # P of a quantized attention reaches P @ V through Q/DQ
ATTENTION_IMPORTER = TrtVersion(10, 14)  # TensorRT CHANGELOG, 10.14 GA: "Added support for the `Attention` operator"
_NO_DECOMPOSE = "IAttention is not decomposable as the ONNX importer creates it, so the build most likely fails"


def _fused_fp16_head(head_dim: int) -> bool:
    return 16 <= head_dim <= 256 and head_dim % 8 == 0


FUSED_FP16_HEAD_SIZES = "16-256 in multiples of 8"


def iattention_kernel(
    dtype: str | None,
    head_dim: int | None,
    trt_version: TrtVersion | str,
    strongly_typed: bool,
    quantized: bool = False,
) -> tuple[bool | None, str]:
    """Whether TensorRT has a fused kernel for an ``IAttention`` of this kind, and why.

    dtype: ONNX type name of Q (``FLOAT``, ``FLOAT16``, ``BFLOAT16``); quantized: Q/K/V come
    from DequantizeLinear. Returns (True, why) when a fused kernel exists, (False, why) when
    none does (the build most likely fails), (None, why) when the builder decides (a weakly
    typed build picks the attention's precision itself).
    """
    ver = trt_version if isinstance(trt_version, TrtVersion) else parse_trt_version(str(trt_version))
    if ver < ATTENTION_IMPORTER:
        return False, f"TensorRT {ver} has no ONNX Attention importer (it arrived in {ATTENTION_IMPORTER})"
    strongly = strongly_typed or ver.major >= 11
    if quantized and strongly:
        return False, f"int8 Q/K/V into IAttention under strong typing has no fused kernel; {_NO_DECOMPOSE}"
    if dtype == "FLOAT" and not strongly:
        return None, (
            "a weakly typed build chooses the attention's precision itself; IAttention only builds if it "
            "picks a fp16 fused kernel, since it is not decomposable as imported"
        )
    if dtype not in ("FLOAT16", "BFLOAT16"):
        kind = {"FLOAT": "fp32", None: "unknown-type"}.get(dtype, str(dtype))
        return False, f"{kind} IAttention has no fused kernel (TensorRT's fused attention kernels are fp16/bf16); {_NO_DECOMPOSE}"
    if head_dim is None:
        return None, "head size unknown; fused IAttention kernels need a static head size"
    if not _fused_fp16_head(head_dim):
        return False, f"head size {head_dim} is outside the fused kernels' {FUSED_FP16_HEAD_SIZES}; {_NO_DECOMPOSE}"
    return True, f"fp16 IAttention with head size {head_dim} has a fused kernel ({FUSED_FP16_HEAD_SIZES})"


def trt_attention_form(
    precision: str,
    head_dim: int | None,
    trt_version: TrtVersion | str,
    strongly_typed: bool,
    quantize_attention_bmm: bool = False,
) -> tuple[str, str]:
    """The attention form to export for TensorRT: ``("onnx-attention" | "decomposed", reason)``.

    precision: the engine precision (``fp32``/``fp16``/``int8``/``fp8``); strongly_typed: the build
    runs the graph's own types (the ``tensorrt`` target; always so on TensorRT 11). A fp16
    strongly typed graph carries fp16 Q/K/V; fp32 and int8 graphs carry fp32 Q/K/V (the
    quantizer starts from the fp32 graph and leaves the attention BMMs in float unless
    ``quantize_attention_bmm``). ONNX ``Attention`` is chosen only where IAttention has a
    fused kernel; everywhere else the decomposed form, which always builds.
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"expected precision {', '.join(tuple(PRECISIONS)[:-1])} or {tuple(PRECISIONS)[-1]}, got {precision!r}")
    ver = trt_version if isinstance(trt_version, TrtVersion) else parse_trt_version(str(trt_version))
    # fp32 engines run the graph's fp32 whatever the typing; only fp16/int8 weak builds pick precisions
    strongly = strongly_typed or ver.major >= 11 or precision == "fp32"
    dtype = PRECISIONS[precision].onnx_type if PRECISIONS[precision].export_float and strongly else "FLOAT"  # Q's type in the graph
    eight_bit = PRECISIONS[precision].quantized
    quantized = eight_bit and quantize_attention_bmm
    has_kernel, why = iattention_kernel(dtype, head_dim, trt_version, strongly, quantized)
    if eight_bit and not quantized and ver >= ATTENTION_IMPORTER:
        why = f"the {precision} graph keeps the attention itself in fp32 (Q/DQ on the projections only): {why}"
    if has_kernel:
        return "onnx-attention", why
    return "decomposed", f"{why}; exporting the decomposed form (MatMul -> fp32 Softmax -> MatMul), which TensorRT always builds"


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


def attention_findings(model: ir.Model, version: TrtVersion, strongly_typed: bool = True, precision: str = "fp16") -> list[Finding]:
    """The ONNX ``Attention`` op as TensorRT's importer takes it (4D Q/K/V, mask [B|1,H|1,Lq,Lk]),
    and whether IAttention has a fused kernel for it (none: an error, since it cannot decompose)."""
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
        if version >= ATTENTION_IMPORTER:
            quantized = all(_from_dq(v) for v in node.inputs[:3])
            head = _int(_dim(q.shape, -1)) if q is not None else None
            fixed_types = strongly_typed or precision == "fp32"  # no reduced-precision flag: the graph's types run
            has_kernel, why = iattention_kernel(_dtype(q), head, version, fixed_types, quantized)
            if has_kernel is False:
                out.append(Finding("error", name, op, f"{why}; export with --attention decomposed"))
            elif has_kernel is None:
                out.append(Finding("warning", name, op, f"{why}; export with --attention decomposed to be sure it builds"))
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
        if blk.form == "onnx-attention":
            continue  # IAttention either has a fused kernel or fails: attention_findings decides
        op = "Softmax"
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
            hint = (
                f"export --attention onnx-attention (IAttention, fused for head sizes {FUSED_FP16_HEAD_SIZES})"
                if version >= ATTENTION_IMPORTER
                else "build a fp32 graph with --fp16 instead (--target jetson)"
            )
            out.append(Finding("warning", blk.node, op, f"fp32 softmax island between {float_precision_of([blk.bmm_dtype])} BMMs: a strongly typed build will not fuse this attention into an MHA kernel; {hint}"))
    return out
