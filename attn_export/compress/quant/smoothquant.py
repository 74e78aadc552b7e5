"""SmoothQuant on an ONNX graph: move activation outliers into the weights before int8 PTQ.

A few input channels of a projection often carry values 10-100x larger than the rest, so
one per-tensor int8 scale wastes most of its levels on them. SmoothQuant (Xiao et al. 2023)
rescales channel j of the activation by 1/s_j and row j of every weight that reads it by
s_j, with s_j = max|X_j|^alpha / max|W_j|^(1-alpha): the product is unchanged, and both
factors become easier to quantize. Here the 1/s_j is a float ``Mul`` in front of the
projection MatMuls (it stays float; the int8 Q/DQ go after it) and the scaled weights are
new initializers. It is hand-rolled because ONNX Runtime's own SmoothQuant option needs
Intel neural-compressor, a large extra dependency for a few lines of graph surgery.

One alpha rarely suits every GEMM: MiniLM's GELU outputs (FFN2 inputs) want most of their
outliers moved into the weights, its attention context hardly any. ``search_alphas`` tries
``SEARCH_ALPHAS`` per smoothable activation and keeps, per activation, the alpha whose
fake-quantized GEMM output (the route's own activation quantizer: symmetric per-tensor for
static Q/DQ, asymmetric per-batch uint8 for dynamic; per-channel int8 weights) is closest
to the float GEMM on calibration tokens. Smoothing is applied only where it cuts that error
by at least ``min_gain`` (its ``Mul`` costs one pass over the activation); elsewhere the
activation is left alone. ``smooth_onnx(path, feeds, "auto")`` runs the search.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as ir_common

from attn_export.compress.quant.qdq import is_constant
from attn_export.compress.quant.smoothquant_alpha import (
    MIN_GAIN,
    MIN_GAIN_MUL,
    SEARCH_ALPHAS,
    AlphaChoice,
    choose_alpha,
    smoothing_scale_from_max,
)
from attn_export.errors import ConfigError
from attn_export.export.passes.graph_constants import typed_initializer

__all__ = ["SmoothGroup", "SmoothQuantPass", "activation_absmax", "search_alphas", "smooth_onnx", "smoothable_groups"]

log = logging.getLogger(__name__)



@dataclass
class SmoothGroup:
    """An activation and the weight MatMuls that read it (they share one smoothing vector)."""

    activation: str
    matmuls: list[str] = field(default_factory=list)


def _weight_of(node: ir.Node) -> ir.Value | None:
    """The (K, N) float initializer of ``act @ W``, or None if ``node`` is not such a MatMul."""
    if node.op_type != "MatMul" or len(node.inputs) != 2:
        return None
    w = node.inputs[1]
    if w is None or w.const_value is None or is_constant(node.inputs[0]):
        return None
    if w.dtype != ir.DataType.FLOAT or len(w.const_value.shape) != 2:
        return None
    return w


def smoothable_groups(graph: ir.Graph) -> list[SmoothGroup]:
    """Every activation that feeds MatMul(s) with a constant 2-D weight, in graph order."""
    groups: dict[str, SmoothGroup] = {}
    for node in graph:
        if _weight_of(node) is None:
            continue
        act = node.inputs[0]
        if act is None:
            continue
        groups.setdefault(act.name or "", SmoothGroup(act.name or "")).matmuls.append(node.name or "")
    return list(groups.values())


def activation_absmax(
    model: ir.Model, tensor_names: list[str], feeds: list[dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """Per-channel max |x| (over every axis but the last) of the named tensors on ``feeds``.

    Runs ONNX Runtime on a copy of the model with those tensors added as graph outputs.
    Every position counts, padded ones included (``probe.collect_stats`` drops them).
    """
    from attn_export.compress.probe import TensorProbe

    probe = TensorProbe(model, tensor_names)
    absmax: dict[str, np.ndarray] = {}
    for feed in feeds:
        for name, arr in probe.run(feed).items():
            m = np.abs(arr.reshape(-1, arr.shape[-1])).max(axis=0)
            absmax[name] = m if name not in absmax else np.maximum(absmax[name], m)
    return absmax


def search_alphas(
    model: ir.Model,
    feeds: list[dict[str, np.ndarray]],
    route: str = "static",
    alphas: tuple[float, ...] = SEARCH_ALPHAS,
    min_gain: float = MIN_GAIN,
    sample_tokens: int = 512,
    seed: int = 0,
    stats: Mapping[str, Any] | None = None,
    calib_method: str = "minmax",
    min_gain_mul: float = MIN_GAIN_MUL,
) -> dict[str, AlphaChoice]:
    """Per smoothable activation, the alpha that minimises its GEMMs' fake-quantized output error.

    The static route's activation range is the one ``calib_method`` would calibrate on the
    (smoothed) sample, so the search scores the quantizer that will really run. An alpha is
    kept where it removes ``min_gain`` of the error when its scale folds into the value
    projection, ``min_gain_mul`` where it needs a Mul.
    ``stats`` (``probe.collect_stats`` with samples) is collected here when not given.
    """
    from attn_export.compress.probe import collect_stats

    if route not in ("static", "dynamic"):
        raise ConfigError(f"expected a SmoothQuant search for the static or dynamic route, got {route!r}")
    groups = smoothable_groups(model.graph)
    nodes = {n.name: n for n in model.graph}
    if stats is None:
        stats = collect_stats(model, [g.activation for g in groups], feeds, sample_tokens=sample_tokens, histogram=False, seed=seed)
    out: dict[str, AlphaChoice] = {}
    for g in groups:
        st = stats[g.activation]
        if st.sample is None or st.channel_absmax is None:
            continue
        w = np.concatenate([_weight_of(nodes[m]).const_value.numpy() for m in g.matmuls], axis=1).astype(np.float32)  # (K, sum M)
        act = nodes[g.matmuls[0]].inputs[0]
        members = [nodes[m] for m in g.matmuls]
        folds = all(user in members for user, _ in act.uses()) and _value_projection(act) is not None
        choice = choose_alpha(g.activation, st.sample, st.channel_absmax, w, route, calib_method, alphas, min_gain if folds else min_gain_mul)
        choice.folded = folds and choice.alpha is not None
        out[g.activation] = choice
    chosen = [c for c in out.values() if c.alpha is not None]
    log.info("SmoothQuant search (%s): %d of %d activations smoothed (%d folded into the value projection; alphas %s)", route, len(chosen), len(out),
             sum(c.folded for c in chosen), ", ".join(f"{c.alpha:g}" for c in chosen))  # fmt: skip
    return out


def _value_projection(act: ir.Value) -> tuple[ir.Node, int, ir.Node | None] | None:
    """(MatMul with the value weight, first column, bias Add) when ``act`` is attention's context.

    The context P @ V is linear in each channel of V (softmax weights mix tokens, not
    channels), and merging heads maps channel (h, d) back to the V projection's column
    h * Dh + d, so dividing the context's channel j by s_j is the same as dividing column j
    of W_v (and b_v). Walks back Reshape/Transpose, the zero-filling Where, the P @ V MatMul,
    a QKV Split, the bias Add, to the constant-weight MatMul; in the packed encoder form also
    its row Gathers and ORT's MultiHeadAttention (whose output channels are V's). None when
    the chain differs.
    """
    value, offset, bias, hops = act, 0, None, 0
    equal_split: tuple[int, int] | None = None  # (output index, outputs) of a Split without sizes
    while hops < 12:
        hops += 1
        node = value.producer()
        if node is None:
            return None
        op = node.op_type
        if op in ("Reshape", "Transpose", "Identity"):
            value = node.inputs[0]
        elif op == "Where":
            zero = node.inputs[2]
            if zero is None or zero.const_value is None or np.any(zero.const_value.numpy() != 0):
                return None
            value = node.inputs[1]
        elif op == "MatMul" and not any(is_constant(v) for v in node.inputs):
            value = node.inputs[1]  # P @ V: follow V
        elif op == "MultiHeadAttention" and node.domain == "com.microsoft" and len(node.inputs) > 2 and (len(node.inputs) < 4 or node.inputs[3] is None):
            value = node.inputs[2]  # ORT's kernel, P @ V inside, no bias input: follow V
        elif op == "Gather" and _gathers_rows(node):
            value = node.inputs[0]  # the packed encoder form's row gathers move tokens, not channels
        elif op == "Split":
            index = list(node.outputs).index(value)
            axis = node.attributes.get("axis")
            shape = node.inputs[0].shape
            last = len(shape) - 1 if shape is not None else None
            if axis is not None and axis.as_int() != -1 and axis.as_int() != last:
                return None  # only a split of the channels (last axis) maps onto W_v's columns
            sizes = node.inputs[1].const_value.numpy() if len(node.inputs) > 1 and node.inputs[1] is not None and node.inputs[1].const_value is not None else None
            if sizes is not None:
                offset += int(np.sum(sizes[:index]))
            elif equal_split is None:
                equal_split = (index, len(node.outputs))  # resolved against the weight's width below
            else:
                return None
            value = node.inputs[0]
        elif op == "Add" and bias is None and len(node.inputs) == 2 and node.inputs[1] is not None and node.inputs[1].const_value is not None:
            bias, value = node, node.inputs[0]
        elif op == "MatMul" and _weight_of(node) is not None:
            if equal_split is not None:
                width = int(_weight_of(node).const_value.shape[-1])  # type: ignore[union-attr]
                offset += equal_split[0] * (width // equal_split[1])
            return node, offset, bias
        else:
            return None
    return None


def _gathers_rows(node: ir.Node) -> bool:
    """A Gather of whole rows (axis 0 of a tensor of rank >= 2): it keeps every channel where it is."""
    axis = node.attributes.get("axis")
    data = node.inputs[0]
    return (axis is None or axis.as_int() == 0) and data is not None and data.shape is not None and len(data.shape) >= 2


def _fold_into_value_projection(graph: ir.Graph, act: ir.Value, inv_s: np.ndarray) -> bool:
    """Divide ``act``'s channels by s inside the V projection instead of a Mul; False when it cannot."""
    found = _value_projection(act)
    if found is None:
        return False
    matmul, offset, bias = found
    w = _weight_of(matmul)
    cols = slice(offset, offset + len(inv_s))
    wv = w.const_value.numpy().copy()
    if wv[:, cols].shape[1] != len(inv_s):
        return False
    wv[:, cols] *= inv_s[None, :]
    b = bias.inputs[1].const_value.numpy().copy() if bias is not None else None
    if b is not None and (b.ndim == 0 or b.shape[-1] < offset + len(inv_s)):
        return False  # checked before anything is rewired: a half-done fold would smooth twice
    # the weight and bias may be shared (equal constants of several layers are one initializer):
    # this projection gets its own copies, the other readers keep the originals
    matmul.replace_input_with(1, typed_initializer(graph, f"{w.name}_smoothed_v", wv))
    if bias is not None and b is not None:
        b[..., cols] *= inv_s
        bias.replace_input_with(1, typed_initializer(graph, f"{bias.inputs[1].name}_smoothed_v", b))
    return True


class SmoothQuantPass(ir.passes.InPlacePass):
    """Scale each group's activation by 1/s and its weight rows by s.

    The 1/s is folded into the value projection when the activation is attention's context
    read only by the output projection (``_value_projection``: no extra op); elsewhere it is
    a ``Mul(x, 1/s)`` in front of the group's MatMuls. ``absmax`` maps activation names to
    per-channel max |x| from calibration; groups without an entry are left alone.
    ``self.smoothed`` lists the groups changed by the last call, ``self.folded`` those
    smoothed without a Mul.
    """

    def __init__(
        self, absmax: dict[str, np.ndarray], alpha: float | Mapping[str, float | None] = 0.5, scales: Mapping[str, np.ndarray] | None = None
    ) -> None:
        super().__init__()
        self.scales = dict(scales or {})  # activation -> s given outright (QAT-lite's), instead of absmax and alpha
        for a in alpha.values() if isinstance(alpha, Mapping) else [alpha]:
            if a is not None and not 0.0 <= a <= 1.0:
                raise ConfigError(f"expected a SmoothQuant alpha in [0, 1], got {a}; 0.5 is the paper's default")
        self.absmax = absmax
        self.alpha = alpha  # one alpha, or activation -> alpha (None or absent: left alone)
        self.smoothed: list[SmoothGroup] = []
        self.folded: list[str] = []

    def _alpha_for(self, activation: str) -> float | None:
        if isinstance(self.alpha, Mapping):
            return self.alpha.get(activation)
        return self.alpha

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        nodes = {n.name: n for n in graph}
        self.smoothed, self.folded = [], []
        for group in smoothable_groups(graph):
            alpha = self._alpha_for(group.activation)
            given = self.scales.get(group.activation)
            if given is None and (group.activation not in self.absmax or alpha is None):
                continue
            matmuls = [nodes[name] for name in group.matmuls]
            weights = [_weight_of(n) for n in matmuls]
            w_max = np.max(np.stack([np.abs(w.const_value.numpy()).max(axis=1) for w in weights]), axis=0)  # (K,)
            if given is not None:
                s = np.asarray(given, dtype=np.float32)
                if s.shape != w_max.shape:
                    raise ConfigError(f"SmoothQuant: {s.shape[0]} scales for activation {group.activation}, its weights have {w_max.shape[0]} rows")
            else:
                x_max = self.absmax[group.activation].astype(np.float64)
                if x_max.shape != w_max.shape:
                    raise ConfigError(f"SmoothQuant: activation {group.activation} has {x_max.shape[0]} channels, weights have {w_max.shape[0]}")
                s = smoothing_scale_from_max(x_max, w_max, alpha)  # type: ignore[arg-type]  # (K,)
            act = matmuls[0].inputs[0]
            only_these = all(user in matmuls for user, _ in act.uses())
            if only_these and _fold_into_value_projection(graph, act, (1.0 / s).astype(np.float32)):
                smoothed_act = act
                self.folded.append(group.activation)
            else:
                inv = typed_initializer(graph, f"{group.activation}_smooth_inv_scale", (1.0 / s).astype(np.float32))
                mul = ir.node("Mul", [act, inv], name=f"{group.activation}_smooth_mul")
                mul.outputs[0].name = f"{group.activation}_smoothed"
                mul.outputs[0].type = act.type
                mul.outputs[0].shape = act.shape
                graph.insert_before(matmuls[0], mul)
                smoothed_act = mul.outputs[0]
            for node, w in zip(matmuls, weights):
                scaled = typed_initializer(graph, f"{w.name}_smoothed", w.const_value.numpy() * s[:, None])
                if smoothed_act is not act:
                    node.replace_input_with(0, smoothed_act)
                node.replace_input_with(1, scaled)
            self.smoothed.append(group)
        modified = bool(self.smoothed)
        if modified:
            ir_common.RemoveUnusedNodesPass()(model)  # drops the now unused float weights
        log.info("SmoothQuant (alpha %s): smoothed %d activations feeding %d MatMuls (%d folded into the value projection)",
                 "given" if self.scales else ("searched" if isinstance(self.alpha, Mapping) else f"{self.alpha:.2f}"), len(self.smoothed),
                 sum(len(g.matmuls) for g in self.smoothed), len(self.folded))  # fmt: skip
        return ir.passes.PassResult(model, modified)


def smooth_onnx(
    path: str | os.PathLike[str], feeds: list[dict[str, np.ndarray]], alpha: float | str, route: str = "static", calib_method: str = "minmax"
) -> tuple[ir.Model, list[SmoothGroup], dict[str, AlphaChoice]]:
    """Load ``path``, calibrate max |x| on ``feeds`` and apply ``SmoothQuantPass``.

    ``alpha="auto"`` searches one alpha per activation for ``route`` (``search_alphas``) and
    smooths only where it helps; a number smooths every activation with it. Returns the
    model, the groups smoothed and the search's choices (empty for a fixed alpha).
    """
    model = ir.load(os.fspath(path))
    groups = smoothable_groups(model.graph)
    choices: dict[str, AlphaChoice] = {}
    if alpha == "auto":  # real tokens only, for the search and the scales alike
        from attn_export.compress.probe import collect_stats

        # channel maxima and a token sample, on the very feeds the ranges are calibrated on: a
        # channel maximum the smoothing never saw becomes an outlier of the smoothed activation
        # (the dynamic quantizer ranges over whole batches at run time, padded positions included)
        stats = collect_stats(model, [g.activation for g in groups], feeds, sample_tokens=512, histogram=False, real_only=route == "static")
        choices = search_alphas(model, feeds, route, stats=stats, calib_method=calib_method)
        chosen: float | dict[str, float | None] = {k: c.alpha for k, c in choices.items()}
        absmax = {k: stats[k].channel_absmax for k, c in choices.items() if c.alpha is not None}
    elif isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
        chosen = float(alpha)
        absmax = activation_absmax(model, [g.activation for g in groups], feeds)
    else:
        raise ConfigError(f"expected a SmoothQuant alpha in [0, 1] or 'auto', got {alpha!r}")
    sq = SmoothQuantPass(absmax, chosen)
    sq(model)
    return model, sq.smoothed, choices
