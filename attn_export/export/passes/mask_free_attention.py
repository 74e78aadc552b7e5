"""The packed form's ``MultiHeadAttention`` without its key-length mask, so ONNX Runtime's CPU flash kernel runs it.

Why: ``com.microsoft.MultiHeadAttention`` on CPU runs MLAS flash attention only when it has no
``key_padding_mask`` and no ``attention_bias`` (contrib_ops/cpu/bert/multihead_attention.cc);
the packed encoder form (``layers.packed``) passes each sequence's key count as that mask, so it
ran the unfused path. On all-MiniLM-L6-v2 int8 (ORT 1.32, 2 threads, the test split's real
batches of 8) ``bench/real_text.py`` measured the shipped model against the best peer at 1.18x
wall / 1.24x CPU before this pass and 1.20x / 1.27x after it (docs/benchmark.md); at 512 tokens
the packed model's peak memory about halves (``bench/packed_memory.py``: no (W, W) scores).

How: the mask moves into one extra channel per head of Q and K. Q's is 1 and K's is 0 for
every real key, so every real score is unchanged; a padded key slot reads a row whose K channels
are -10000, so its score is -10000 * scale below the others and its softmax weight is exactly 0
in float32, the same weight the mask gave. The channels come from the projections' weights,
not from an extra op per layer:

    Q = x W_q + b_q  ->  per head, one more column of W_q (zeros) with bias 1      -> (T+1, H(Dh+1))
    K = x W_k + b_k  ->  per head, one more column of W_k (zeros) with bias 0      -> (T+1, H(Dh+1))
    K rows + one appended row: 0 everywhere, -10000 in each head's extra channel  -> (T+2, H(Dh+1))
    key slots beyond a sequence's count read that row (Gather index -1) instead of the spare row

V and the output keep Dh channels per head (the kernel takes a different V head size), and
``scale`` is set to the original 1/sqrt(Dh). The widened weights quantize exactly: a zero column
gets scale 1 and zero point 0 from ONNX Runtime's quantizer. A padded *query* slot attends to
something harmless (its output is never read), and a real query always has itself as a key, so
no row that is read is fully masked; every score stays finite.

Applies to MHA nodes whose Q and K are row Gathers (with one slot index) of constant-weight
projections, separate (``MatMul`` + ``Add``) or fused (one ``MatMul`` + ``Add`` + ``Split``);
any other MHA is left as it is. ONNX Runtime CPU targets turn it on
(``ExportSpec.mask_free_attention``); on CUDA the fused kernels take the mask themselves.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from attn_export.export.passes.graph_constants import typed_initializer

__all__ = ["MASKED_KEY", "mask_free_attention"]

log = logging.getLogger(__name__)

MASKED_KEY = -10000.0  # ORT's own mask_filter_value default: exp(-10000 * scale - max) is 0 in float32


@dataclass
class _Projection:
    """Where one attention input's rows come from: ``MatMul(x, W) + b``, possibly one part of a Split."""

    matmul: ir.Node
    add: ir.Node
    split: ir.Node | None = None
    part: int = 0  # the Split output this input is


def _const(value: ir.Value | None) -> np.ndarray | None:
    return None if value is None or value.const_value is None else value.const_value.numpy()


def _single_use(value: ir.Value) -> bool:
    return len(value.uses()) == 1


def _projection(rows: ir.Value, graph: ir.Graph) -> _Projection | None:
    node = rows.producer()
    split = None
    part = 0
    if node is not None and node.op_type == "Split" and node.domain in ("", "ai.onnx"):
        split, part = node, list(node.outputs).index(rows)
        node = node.inputs[0].producer() if node.inputs[0] is not None else None
    if node is None or node.op_type != "Add" or len(node.inputs) != 2:
        return None
    add, (product, bias) = node, node.inputs
    if product is None or _const(bias) is None or product.producer() is None or not _single_use(product):
        return None
    matmul = product.producer()
    if matmul.op_type != "MatMul" or _const(matmul.inputs[1]) is None or _const(matmul.inputs[1]).ndim != 2:
        return None
    if add.outputs[0] in graph.outputs or not _single_use(add.outputs[0]) or not _single_use(rows):
        return None
    return _Projection(matmul, add, split, part)


def _chunks(proj: _Projection, width: int) -> list[int] | None:
    """The column widths of the projection's outputs: [width] alone, or the Split's sizes along the last axis."""
    if proj.split is None:
        return [width]
    axis = proj.split.attributes.get("axis")
    shape = proj.split.inputs[0].shape
    last = len(shape) - 1 if shape is not None else None
    if axis is not None and axis.as_int() not in (-1, last):
        return None
    sizes = _const(proj.split.inputs[1]) if len(proj.split.inputs) > 1 else None
    if sizes is not None:
        chunks = [int(s) for s in sizes]
    else:
        n = len(proj.split.outputs)
        if width % n:
            return None
        chunks = [width // n] * n
    return chunks if sum(chunks) == width else None


def _widen(block: np.ndarray, heads: int, fill: float) -> np.ndarray:
    """(..., H * Dh) -> (..., H * (Dh + 1)): one ``fill`` column after each head's Dh columns."""
    lead = block.shape[:-1]
    per_head = block.reshape(*lead, heads, block.shape[-1] // heads)
    extra = np.full((*lead, heads, 1), fill, dtype=block.dtype)
    return np.concatenate([per_head, extra], axis=-1).reshape(*lead, -1)


def _replace_constant(graph: ir.Graph, node: ir.Node, index: int, array: np.ndarray, tag: str) -> None:
    """Input ``index`` of ``node`` becomes ``array``, under the old initializer's name when nothing else reads it."""
    old = node.inputs[index]
    assert old is not None
    new = typed_initializer(graph, f"{tag}_{index}_{old.name}", array)
    node.replace_input_with(index, new)
    if not old.uses() and old.name in graph.initializers:
        graph.initializers.pop(old.name)
        graph.initializers.pop(new.name)
        new.name = old.name
        graph.register_initializer(new)


def _rewrite_projection(graph: ir.Graph, proj: _Projection, chunks: list[int], fills: dict[int, float], heads: int, tag: str) -> None:
    """Widen the parts (``chunks``: their column widths) in ``fills`` (part -> the extra channel's bias) of one projection."""
    weight = _const(proj.matmul.inputs[1])
    bias = _const(proj.add.inputs[1])
    assert weight is not None and bias is not None
    starts = np.cumsum([0, *chunks])
    new_w, new_b, sizes = [], [], []
    for part, (lo, hi) in enumerate(zip(starts[:-1], starts[1:])):
        w, b = weight[:, lo:hi], np.broadcast_to(bias, (weight.shape[1],))[lo:hi]
        if part in fills:
            w, b = _widen(w, heads, 0.0), _widen(b, heads, fills[part])
        new_w.append(w)
        new_b.append(b)
        sizes.append(w.shape[1])
    _replace_constant(graph, proj.matmul, 1, np.ascontiguousarray(np.concatenate(new_w, axis=1)), tag)
    _replace_constant(graph, proj.add, 1, np.concatenate(new_b).astype(bias.dtype), tag)
    for value in (proj.matmul.outputs[0], proj.add.outputs[0], *(proj.split.outputs if proj.split is not None else ())):
        value.shape = None  # widened: the exporter's annotation no longer holds (shape inference redoes it)
    if proj.split is not None:
        split = proj.split
        sizes_value = typed_initializer(graph, f"{tag}_split_sizes", np.array(sizes, np.int64))
        if len(split.inputs) > 1:
            split.replace_input_with(1, sizes_value)
        else:
            split.resize_inputs(2)
            split.replace_input_with(1, sizes_value)
        split.attributes.pop("num_outputs", None)


def _key_slots(graph: ir.Graph, slot: ir.Value, counts: ir.Value, anchor: ir.Node, cache: dict[tuple[int, int], ir.Value]) -> ir.Value:
    """(B, W) key slots: ``slot`` where j < count[b], else -1 (the appended masked row)."""
    key = (id(slot), id(counts))
    if key in cache:
        return cache[key]
    tape = ir.tape.Tape()
    zero = tape.op("Constant", [], {"value": ir.tensor(np.array(0, np.int64))})
    one = tape.op("Constant", [], {"value": ir.tensor(np.array(1, np.int64))})
    width = tape.op("Squeeze", [tape.op("Shape", [slot], {"start": 1, "end": 2})])
    j = tape.op("Unsqueeze", [tape.op("Range", [zero, width, one]), tape.op("Constant", [], {"value": ir.tensor(np.array([0], np.int64))})])
    count = tape.op("Unsqueeze", [tape.op("Cast", [counts], {"to": ir.DataType.INT64}), tape.op("Constant", [], {"value": ir.tensor(np.array([1], np.int64))})])
    real = tape.op("Less", [j, count])  # (B, W)
    masked = tape.op("Constant", [], {"value": ir.tensor(np.array(-1, np.int64))})
    out = tape.op("Where", [real, slot, masked])
    for i, node in enumerate(tape.nodes):
        node.name = f"mask_free_key_slots_{len(cache)}_{i}"
        for k, value in enumerate(node.outputs):
            value.name = f"{node.name}_{k}"
    graph.insert_before(anchor, tape.nodes)
    cache[key] = out
    return out


def mask_free_attention(model: ir.Model) -> int:
    """Rewrite every packed-form ``MultiHeadAttention`` that matches (see the module docstring); returns how many."""
    graph = model.graph
    done = 0
    slots: dict[tuple[int, int], ir.Value] = {}
    rewritten: set[int] = set()  # projection MatMuls already widened (a fused QKV is shared by q and k)
    for mha in [n for n in graph if n.op_type == "MultiHeadAttention" and n.domain == "com.microsoft"]:
        ins = list(mha.inputs)
        heads_attr = mha.attributes.get("num_heads")
        if len(ins) != 5 or ins[3] is not None or ins[4] is None or heads_attr is None:
            continue  # not the packed form's (q, k, v, no bias, key counts)
        if mha.attributes.get("unidirectional") is not None and mha.attributes["unidirectional"].as_int() != 0:
            continue
        q, k, counts = ins[0], ins[1], ins[4]
        gathers = [x.producer() for x in (q, k)]
        if any(g is None or g.op_type != "Gather" or (g.attributes.get("axis") is not None and g.attributes["axis"].as_int() != 0) for g in gathers):
            continue
        gq, gk = gathers
        if gq.inputs[1] is not gk.inputs[1] or not _single_use(gk.outputs[0]):
            continue
        heads = heads_attr.as_int()
        pq, pk = _projection(gq.inputs[0], graph), _projection(gk.inputs[0], graph)
        if pq is None or pk is None:
            continue
        width = _const(pq.matmul.inputs[1]).shape[1]  # type: ignore[union-attr]
        chunks_q = _chunks(pq, width)
        chunks_k = _chunks(pk, _const(pk.matmul.inputs[1]).shape[1])  # type: ignore[union-attr]
        if chunks_q is None or chunks_k is None:
            continue
        d = chunks_q[pq.part]
        if chunks_k[pk.part] != d or d % heads:
            continue
        scale_attr = mha.attributes.get("scale")
        scale = scale_attr.as_float() if scale_attr is not None else 0.0
        scale = scale or 1.0 / math.sqrt(d // heads)
        # the projections: Q's extra channel 1, K's 0 (q and k may share one fused MatMul)
        plan: dict[int, tuple[_Projection, list[int], dict[int, float]]] = {}
        for proj, chunks, fill in ((pq, chunks_q, 1.0), (pk, chunks_k, 0.0)):
            plan.setdefault(id(proj.matmul), (proj, chunks, {}))[2][proj.part] = fill
        if rewritten & plan.keys():
            continue  # a projection already widened for another attention: leave this one masked
        for key, (proj, chunks, fills) in plan.items():
            _rewrite_projection(graph, proj, chunks, fills, heads, f"mask_free_{done}_{len(rewritten)}")
            rewritten.add(key)
        # K rows + the masked row; padded key slots read it
        row = np.zeros((1, heads * (d // heads + 1)), dtype=_const(pk.add.inputs[1]).dtype)  # type: ignore[union-attr]
        row[0, d // heads :: d // heads + 1] = MASKED_KEY
        masked_row = typed_initializer(graph, f"mask_free_{done}_masked_key", row)
        concat = ir.node("Concat", [gk.inputs[0], masked_row], attributes={"axis": 0}, name=f"mask_free_{done}_key_rows")
        concat.outputs[0].name = f"mask_free_{done}_key_rows_out"
        graph.insert_before(gk, concat)
        gk.replace_input_with(0, concat.outputs[0])
        gk.replace_input_with(1, _key_slots(graph, gq.inputs[1], counts, gk, slots))
        for value in (gq.outputs[0], gk.outputs[0]):
            value.shape = None
        mha.resize_inputs(3)
        mha.attributes["scale"] = ir.AttrFloat32("scale", float(scale))
        done += 1
    if done:
        graph.sort()  # the key slots read the counts, which the exporter may compute after the first Gather
    log.debug("mask_free_attention: %d MultiHeadAttention nodes without a key mask", done)
    return done
