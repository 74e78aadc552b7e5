"""The ``long-seq`` attention form: memory that grows as O(L), not O(L^2), on ONNX Runtime CPU.

Why: every other exported form materialises the (B, H, L, L) scores once a mask is present;
at L=4096 that is 0.5 GiB per batch item, and PyTorch's own SDPA beats the export. ONNX
Runtime 1.32's CPU kernels have a flash path (MLAS, L2-tiled online softmax) only under
conditions, read from its sources:

* ``com.microsoft.MultiHeadAttention`` (contrib_ops/cpu/bert/multihead_attention.cc): flash
  only for float with no ``key_padding_mask``, no ``attention_bias``, no past/present and
  ``unidirectional=0``. Key and query lengths may differ.
* ``com.microsoft.GroupQueryAttention`` (contrib_ops/cpu/bert/gqa_attention_base.h,
  ``ApplyAttentionFlash``): flash for float when ``present_key``/``present_value`` are
  requested; it is always causal (``local_window_size`` is a causal window only).
* The ONNX ``Attention`` op (core/providers/cpu/llm/attention.cc) has no flash path in 1.32:
  it computes the full probabilities whatever the mask.

So the exporter writes a placeholder ``attn_export.long_seq.LongSeqAttention(q, k, v[, key_keep])``
(``layers.attention._long_seq``) and ``lower_long_seq`` replaces each one, by its mask parts:

=================  ==========================================================================
mask               lowered to
=================  ==========================================================================
none               ``MultiHeadAttention`` (flash)
key padding        ``Loop`` over the batch: gather the kept keys/values of one sequence
                   (``NonZero`` + ``Gather``), then ``MultiHeadAttention`` with no mask (flash).
                   Works for any padding pattern, not only right padding.
causal             ``GroupQueryAttention`` with ``kv_num_heads = num_heads`` (flash, causal)
anything else      ``Loop`` over query blocks of ``query_block`` rows (window, causal+padding):
                   each block's keys are sliced to the range its mask can reach
                   ([lo - w, hi + w) for a window, [0, hi) when causal), the mask is built
                   per block from positions and the key-padding slice, then explicit fp32
                   attention. Memory O(query_block * L), compute O(L * (query_block + 2w))
                   for a window.
=================  ==========================================================================

Every branch returns zeros for query rows with no key left (never NaN), as eager does.
Half-precision graphs Cast q/k/v to float32 around the kernel (both flash kernels are
float-only), which is the fp32 softmax island of the other forms.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from attn_export.errors import ExportError
from attn_export.export.spec import LONG_SEQ_STRATEGIES
from attn_export.layers.attention import LONG_SEQ_DOMAIN, LONG_SEQ_OP

__all__ = ["LONG_SEQ_STRATEGIES", "LongSeqLowering", "lower_long_seq"]

log = logging.getLogger(__name__)

MS_DOMAIN = "com.microsoft"
_NEG = float(np.finfo(np.float32).min) / 2  # masks.mask_value(float32): finite after adding a score


@dataclass
class LongSeqLowering:
    """What ``lower_long_seq`` did: how many placeholders became which kernel."""

    replaced: int = 0
    fused: int = 0  # blocks lowered to a single-node flash kernel (not the chunked Loop)
    kernels: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        if not self.replaced:
            return "no long-seq attention blocks"
        return ", ".join(f"{n} x {k}" for k, n in sorted(self.kernels.items()))


def lower_long_seq(model: ir.Model, *, query_block: int = 256, strategy: str = "auto") -> LongSeqLowering:
    """Replace every ``LongSeqAttention`` placeholder in ``model`` (in place) by ORT CPU kernels."""
    if strategy not in LONG_SEQ_STRATEGIES:
        raise ExportError(f"expected long-seq strategy in {', '.join(LONG_SEQ_STRATEGIES)}, got {strategy!r}")
    if query_block < 1:
        raise ExportError(f"expected a positive long-seq query block, got {query_block}")
    report = LongSeqLowering()
    placeholders = [n for n in model.graph.all_nodes() if n.domain == LONG_SEQ_DOMAIN and n.op_type == LONG_SEQ_OP]
    for index, node in enumerate(placeholders):
        kernel = _lower_one(node, query_block, strategy, f"long_seq{index}")
        report.replaced += 1
        report.fused += not kernel.startswith("chunked")
        report.kernels[kernel] = report.kernels.get(kernel, 0) + 1
    if placeholders:
        model.opset_imports.pop(LONG_SEQ_DOMAIN, None)
        model.opset_imports.setdefault(MS_DOMAIN, 1)
    log.debug("long-seq lowering: %s", report.describe())
    return report


def _lower_one(node: ir.Node, query_block: int, strategy: str, prefix: str) -> str:
    heads = node.attributes["num_heads"].as_int()
    scale = node.attributes["scale"].as_float()
    causal = bool(node.attributes["causal"].as_int())
    window = node.attributes["window"].as_int()
    q, k, v = node.inputs[0], node.inputs[1], node.inputs[2]
    key_keep = node.inputs[3] if len(node.inputs) > 3 else None
    if q is None or k is None or v is None:
        raise ExportError(f"expected q, k, v on {LONG_SEQ_OP} node {node.name!r}, got a missing input")
    b = _Builder(prefix)
    half = q.dtype == ir.DataType.FLOAT16
    if half:  # the flash kernels are float-only: an fp32 island around attention
        q, k, v = (b.op("Cast", [t], to=int(ir.DataType.FLOAT)) for t in (q, k, v))
    if strategy == "chunked" or window >= 0 or (causal and key_keep is not None):
        kernel = f"chunked Loop (query block {query_block})"
        out = _chunked(b, q, k, v, key_keep, heads, scale, causal, window, query_block)
    elif causal:
        kernel = "GroupQueryAttention (causal flash)"
        out = _gqa_causal(b, q, k, v, heads, scale)
    elif key_keep is not None:
        kernel = "unpadded MultiHeadAttention (flash; Loop over the batch when B > 1)"
        out = _unpadded_mha(b, q, k, v, key_keep, heads, scale)
    else:
        kernel = "MultiHeadAttention (flash)"
        out = b.op("MultiHeadAttention", [q, k, v], domain=MS_DOMAIN, num_heads=heads, scale=scale)
    if half:
        out = b.op("Cast", [out], to=int(ir.DataType.FLOAT16))
    graph = node.graph
    if graph is None:
        raise ExportError(f"{LONG_SEQ_OP} node {node.name!r} is not in a graph")
    ir.convenience.replace_nodes_and_values(graph, node, [node], b.nodes, [node.outputs[0]], [out])
    return kernel


class _Builder:
    """A tape with the few helpers the lowering needs (constants, 1-D shape slices).

    Every value gets a name under ``prefix``: ONNX forbids a Loop body from reusing a name of
    the outer graph, which automatic renaming of the body alone does not guarantee.
    """

    def __init__(self, prefix: str) -> None:
        self.tape = ir.tape.Tape()
        self.prefix = prefix
        self._count = 0

    def name(self) -> str:
        self._count += 1
        return f"{self.prefix}_{self._count}"

    def value(self, dtype: ir.DataType) -> ir.Value:
        """A named scalar graph input (a Loop body's iteration number or condition)."""
        return ir.Value(name=self.name(), type=ir.TensorType(dtype), shape=ir.Shape([]))

    @property
    def nodes(self) -> list[ir.Node]:
        return list(self.tape.nodes)

    def op(self, op_type: str, inputs: list[ir.Value | None], domain: str = "", **attrs: object) -> ir.Value:
        return self.ops(op_type, inputs, 1, domain, **attrs)[0]

    def ops(self, op_type: str, inputs: list[ir.Value | None], n: int, domain: str = "", **attrs: object) -> list[ir.Value]:
        outs = list(self.tape.op_multi_out(op_type, inputs, attrs or None, num_outputs=n, domain=domain))
        for out in outs:
            out.name = self.name()
        return outs

    def loop_body(self, cond: ir.Value, i: ir.Value, scan_out: ir.Value, name: str) -> ir.Graph:
        """The recorded nodes as a Loop body (i, cond) -> (cond, scan_out), outputs typed for onnx.checker."""
        cond_out = self.op("Identity", [cond])
        cond_out.type, cond_out.shape = ir.TensorType(ir.DataType.BOOL), ir.Shape([])
        scan_out.type = ir.TensorType(ir.DataType.FLOAT)  # contrib kernels have no schema to infer it from
        return ir.Graph([i, cond], [cond_out, scan_out], nodes=self.nodes, name=name)

    def graph(self, inputs: list[ir.Value], output: ir.Value, name: str) -> ir.Graph:
        """The recorded nodes as an If branch with one float output."""
        output.type = ir.TensorType(ir.DataType.FLOAT)
        return ir.Graph(inputs, [output], nodes=self.nodes, name=name)

    def const(self, value: object, dtype: np.dtype | type = np.int64) -> ir.Value:
        return self.op("Constant", [], value=ir.tensor(np.asarray(value, dtype=dtype)))

    def dim(self, x: ir.Value, axis: int) -> ir.Value:
        """Shape(x)[axis] as a 1-D int64 tensor of one element."""
        return self.op("Shape", [x], start=axis, end=axis + 1)


def _gqa_causal(b: _Builder, q: ir.Value, k: ir.Value, v: ir.Value, heads: int, scale: float) -> ir.Value:
    """Causal self-attention through GroupQueryAttention's flash path (needs the present outputs)."""
    length = b.op("Cast", [b.dim(q, 1)], to=int(ir.DataType.INT32))  # (1,)
    total = b.op("Squeeze", [length, b.const([0])])  # () total_sequence_length
    seqlens_k = b.op("Expand", [b.op("Sub", [length, b.const([1], np.int32)]), b.dim(q, 0)])  # (B,) = L - 1
    out, _, _ = b.ops(
        "GroupQueryAttention", [q, k, v, None, None, seqlens_k, total], 3,
        domain=MS_DOMAIN, num_heads=heads, kv_num_heads=heads, scale=scale,
    )  # (B, L, D); present K/V (B, H, L, Dh) are what the flash path writes its cache into
    return out


def _unpadded_mha(
    b: _Builder, q: ir.Value, k: ir.Value, v: ir.Value, key_keep: ir.Value, heads: int, scale: float
) -> ir.Value:
    """Key padding without a mask: each sequence attends over its kept keys only (MHA flash).

    The kept key/value rows of the whole batch are gathered once, packed (N, D), before the
    branch, so the full k and v die before attention runs. B == 1 calls MHA directly on the
    packed rows; B > 1 loops over the sequences, slicing each one's rows out of the packing.
    """
    zero1, one1 = b.const([0]), b.const([1])
    out_shape = b.op("Shape", [q])  # (3,) taken first, so q is not kept alive for its shape
    batch, k_len = b.dim(q, 0), b.dim(k, 1)  # (1,)
    kept = b.op("NonZero", [key_keep])  # (2, N): (sequence, position) of every kept key
    rows = b.op("Add", [b.op("Mul", [b.op("Gather", [kept, b.const(0)], axis=0), k_len]),
                        b.op("Gather", [kept, b.const(1)], axis=0)])  # (N,) rows of (B*Lk, D)
    # No kept key at all still gathers one row (MHA needs Lk >= 1); those outputs are zeroed.
    n_rows = b.op("Max", [b.op("Shape", [rows]), one1])  # (1,) N' = max(N, 1)
    rows = b.op("Slice", [b.op("Concat", [rows, zero1], axis=0), zero1, n_rows])
    k_packed = b.op("Gather", [b.op("Flatten", [k], axis=2), rows], axis=0)  # (N', D)
    v_packed = b.op("Gather", [b.op("Flatten", [v], axis=2), rows], axis=0)
    counts = b.op("ReduceSum", [b.op("Cast", [key_keep], to=int(ir.DataType.INT64)), one1], keepdims=0)  # (B,)
    has_keys = b.op("Cast", [b.op("Greater", [counts, b.const(0)])], to=int(ir.DataType.FLOAT))  # (B,) 1.0 / 0.0

    one = _Builder(f"{b.prefix}_b1")  # B == 1: the packed rows are this sequence's keys
    out_1 = one.op(
        "MultiHeadAttention", [q, one.op("Unsqueeze", [k_packed, zero1]), one.op("Unsqueeze", [v_packed, zero1])],
        domain=MS_DOMAIN, num_heads=heads, scale=scale,
    )  # (1, Lq, D)
    out_1 = one.op("Mul", [out_1, has_keys])  # in place; zeros for an all-padding sequence
    then_branch = one.graph([], out_1, "long_seq_unpadded_single")

    many = _Builder(f"{b.prefix}_bn")  # B > 1: a Loop over the sequences
    starts = many.op("Sub", [many.op("CumSum", [counts, b.const(0)]), counts])  # (B,) offsets into the packing
    body = _Builder(f"{b.prefix}_body")
    i, cond = body.value(ir.DataType.INT64), body.value(ir.DataType.BOOL)
    i1 = body.op("Unsqueeze", [i, zero1])  # (1,)
    start = body.op("Min", [body.op("Gather", [starts, i1], axis=0), body.op("Sub", [n_rows, one1])])
    end = body.op("Add", [start, body.op("Max", [body.op("Gather", [counts, i1], axis=0), one1])])
    k_b = body.op("Unsqueeze", [body.op("Slice", [k_packed, start, end, zero1]), zero1])  # (1, n, D)
    v_b = body.op("Unsqueeze", [body.op("Slice", [v_packed, start, end, zero1]), zero1])
    q_b = body.op("Slice", [q, i1, body.op("Add", [i1, one1]), zero1])  # (1, Lq, D)
    out_b = body.op("MultiHeadAttention", [q_b, k_b, v_b], domain=MS_DOMAIN, num_heads=heads, scale=scale)
    out_b = body.op("Mul", [out_b, body.op("Gather", [has_keys, i1], axis=0)])  # (1, Lq, D)
    loop_body = body.loop_body(cond, i, out_b, "long_seq_unpadded_batch")
    outs = many.op("Loop", [many.op("Squeeze", [batch, zero1]), many.const(True, np.bool_)], body=loop_body)  # (B, 1, Lq, D)
    out_n = many.op("Reshape", [outs, out_shape])  # (B, Lq, D)
    else_branch = many.graph([], out_n, "long_seq_unpadded_batch_loop")

    is_single = b.op("Squeeze", [b.op("Equal", [batch, one1]), zero1])  # () bool
    return b.op("If", [is_single], then_branch=then_branch, else_branch=else_branch)  # (B, Lq, D)


def _chunked(
    b: _Builder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    key_keep: ir.Value | None,
    heads: int,
    scale: float,
    causal: bool,
    window: int,
    block: int,
) -> ir.Value:
    """Any mask: a Loop over query blocks, each attending to the key range its mask can reach."""
    zero1, one1 = b.const([0]), b.const([1])
    split = b.const([0, 0, heads, -1])
    q_h = b.op("Mul", [b.op("Transpose", [b.op("Reshape", [q, split])], perm=[0, 2, 1, 3]), b.const(scale, np.float32)])
    k_t = b.op("Transpose", [b.op("Reshape", [k, split])], perm=[0, 2, 3, 1])  # (B, H, Dh, Lk)
    v_h = b.op("Transpose", [b.op("Reshape", [v, split])], perm=[0, 2, 1, 3])  # (B, H, Lk, Dh)
    lq, lk = b.dim(q, 1), b.dim(k, 1)  # (1,)
    blk = b.const([block])
    n_blocks = b.op("Div", [b.op("Add", [lq, b.const([block - 1])]), blk])  # (1,) ceil(Lq / block)
    pad = b.op("Sub", [b.op("Mul", [n_blocks, blk]), lq])
    pads = b.op("Concat", [b.const([0, 0, 0, 0, 0, 0]), pad, zero1], axis=0)
    q_h = b.op("Pad", [q_h, pads])  # (B, H, nb*block, Dh): every block has `block` rows
    keep4 = None if key_keep is None else b.op("Unsqueeze", [key_keep, b.const([1, 2])])  # (B, 1, 1, Lk)
    rows = b.op("Unsqueeze", [b.op("Range", [b.const(0), b.const(block), b.const(1)]), one1])  # (block, 1)

    body = _Builder(f"{b.prefix}_body")
    i, cond = body.value(ir.DataType.INT64), body.value(ir.DataType.BOOL)
    lo = body.op("Mul", [body.op("Unsqueeze", [i, zero1]), blk])  # (1,)
    hi = body.op("Add", [lo, blk])
    k_lo = zero1 if window < 0 else body.op("Max", [body.op("Sub", [lo, body.const([window])]), zero1])
    k_hi = lk
    if causal:
        k_hi = body.op("Min", [hi, lk])
    elif window >= 0:
        k_hi = body.op("Min", [body.op("Add", [hi, body.const([window])]), lk])
    axis2, axis3 = body.const([2]), body.const([3])
    q_b = body.op("Slice", [q_h, lo, hi, axis2])  # (B, H, block, Dh)
    k_b = body.op("Slice", [k_t, k_lo, k_hi, axis3])  # (B, H, Dh, Kb)
    v_b = body.op("Slice", [v_h, k_lo, k_hi, axis2])  # (B, H, Kb, Dh)
    q_pos = body.op("Add", [rows, lo])  # (block, 1)
    k_pos = body.op("Range", [body.op("Squeeze", [k_lo, zero1]), body.op("Squeeze", [k_hi, zero1]), body.const(1)])  # (Kb,)
    keep = None
    if causal:
        keep = body.op("LessOrEqual", [k_pos, q_pos])  # (block, Kb)
    if window >= 0:
        near = body.op("LessOrEqual", [body.op("Abs", [body.op("Sub", [q_pos, k_pos])]), body.const(window)])
        keep = near if keep is None else body.op("And", [keep, near])
    if keep4 is not None:
        pad_b = body.op("Slice", [keep4, k_lo, k_hi, axis3])  # (B, 1, 1, Kb)
        keep = pad_b if keep is None else body.op("And", [pad_b, keep])  # (B, 1, block, Kb)
    scores = body.op("MatMul", [q_b, k_b])  # (B, H, block, Kb)
    if keep is not None:
        bias = body.op("Where", [keep, body.const(0.0, np.float32), body.const(_NEG, np.float32)])
        scores = body.op("Add", [scores, bias])
    out_b = body.op("MatMul", [body.op("Softmax", [scores], axis=-1), v_b])  # (B, H, block, Dh)
    if keep is not None:  # rows with no kept key: zeros, as eager
        any_key = body.op("ReduceMax", [body.op("Cast", [keep], to=int(ir.DataType.FLOAT)), body.const([-1])], keepdims=1)
        out_b = body.op("Where", [body.op("Greater", [any_key, body.const(0.0, np.float32)]), out_b, body.const(0.0, np.float32)])
    loop_body = body.loop_body(cond, i, out_b, "long_seq_query_block")

    outs = b.op("Loop", [b.op("Squeeze", [n_blocks, zero1]), b.const(True, np.bool_)], body=loop_body)  # (nb, B, H, block, Dh)
    outs = b.op("Transpose", [outs], perm=[1, 0, 3, 2, 4])  # (B, nb, block, H, Dh)
    merged = b.op("Reshape", [outs, b.op("Concat", [b.dim(q, 0), b.const([-1]), b.dim(q, 2)], axis=0)])  # (B, nb*block, D)
    return b.op("Slice", [merged, zero1, lq, one1])  # (B, Lq, D)
