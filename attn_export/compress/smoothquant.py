"""SmoothQuant on an ONNX graph: move activation outliers into the weights before int8 PTQ.

A few input channels of a projection often carry values 10-100x larger than the rest, so
one per-tensor int8 scale wastes most of its levels on them. SmoothQuant (Xiao et al. 2023)
rescales channel j of the activation by 1/s_j and row j of every weight that reads it by
s_j, with s_j = max|X_j|^alpha / max|W_j|^(1-alpha): the product is unchanged, and both
factors become easier to quantize. Here the 1/s_j is a float ``Mul`` in front of the
projection MatMuls (it stays float; the int8 Q/DQ go after it) and the scaled weights are
new initializers. It is hand-rolled because ONNX Runtime's own SmoothQuant option needs
Intel neural-compressor, a large extra dependency for a few lines of graph surgery.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as ir_common

from attn_export.compress.qdq import is_constant
from attn_export.errors import ConfigError

__all__ = ["SmoothGroup", "SmoothQuantPass", "activation_absmax", "smooth_onnx", "smoothable_groups"]

log = logging.getLogger(__name__)

_SCALE_RANGE = (1e-4, 1e4)  # keep s finite when a channel is (almost) silent


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
    """
    import onnxruntime as ort

    proto = ir.serde.serialize_model(model)
    probe = ir.serde.deserialize_model(proto)  # an independent copy we may add outputs to
    values = {v.name: v for n in probe.graph for v in n.outputs}
    values.update({v.name: v for v in probe.graph.inputs})
    outputs = []  # graph inputs are read from the feeds, everything else is fetched
    for name in tensor_names:
        if name not in values:
            raise ConfigError(f"tensor {name!r} is not in the graph; cannot calibrate SmoothQuant on it")
        v = values[name]
        if v.is_graph_input():
            continue
        if v.type is None:
            v.type = ir.TensorType(ir.DataType.FLOAT)
        if not v.is_graph_output():
            probe.graph.outputs.append(v)
        outputs.append(name)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(ir.serde.serialize_model(probe).SerializeToString(), so, providers=["CPUExecutionProvider"])
    absmax: dict[str, np.ndarray] = {}
    for feed in feeds:
        fetched = dict(zip(outputs, sess.run(outputs, feed))) if outputs else {}
        fetched.update({name: feed[name] for name in tensor_names if name in feed})
        for name, arr in fetched.items():
            m = np.abs(arr.reshape(-1, arr.shape[-1])).max(axis=0)
            absmax[name] = m if name not in absmax else np.maximum(absmax[name], m)
    return absmax


class SmoothQuantPass(ir.passes.InPlacePass):
    """Insert ``Mul(x, 1/s)`` before each group's MatMuls and scale their weight rows by s.

    ``absmax`` maps activation names to per-channel max |x| from calibration; groups without
    an entry are left alone. ``self.smoothed`` lists the groups changed by the last call.
    """

    def __init__(self, absmax: dict[str, np.ndarray], alpha: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"expected a SmoothQuant alpha in [0, 1], got {alpha}; 0.5 is the paper's default")
        self.absmax = absmax
        self.alpha = alpha
        self.smoothed: list[SmoothGroup] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        nodes = {n.name: n for n in graph}
        self.smoothed = []
        for group in smoothable_groups(graph):
            if group.activation not in self.absmax:
                continue
            matmuls = [nodes[name] for name in group.matmuls]
            weights = [_weight_of(n) for n in matmuls]
            w_max = np.max(np.stack([np.abs(w.const_value.numpy()).max(axis=1) for w in weights]), axis=0)  # (K,)
            x_max = self.absmax[group.activation].astype(np.float64)
            if x_max.shape != w_max.shape:
                raise ConfigError(f"SmoothQuant: activation {group.activation} has {x_max.shape[0]} channels, weights have {w_max.shape[0]}")
            s = np.power(np.maximum(x_max, 1e-8), self.alpha) / np.power(np.maximum(w_max, 1e-8), 1.0 - self.alpha)
            s = np.clip(s, *_SCALE_RANGE).astype(np.float32)  # (K,)
            act = matmuls[0].inputs[0]
            inv = ir.Value(name=f"{group.activation}_smooth_inv_scale", const_value=ir.tensor(1.0 / s))
            graph.register_initializer(inv)
            mul = ir.node("Mul", [act, inv], name=f"{group.activation}_smooth_mul")
            mul.outputs[0].name = f"{group.activation}_smoothed"
            mul.outputs[0].type = act.type
            mul.outputs[0].shape = act.shape
            graph.insert_before(matmuls[0], mul)
            for node, w in zip(matmuls, weights):
                scaled = ir.Value(name=f"{w.name}_smoothed", const_value=ir.tensor(w.const_value.numpy() * s[:, None]))
                graph.register_initializer(scaled)
                node.replace_input_with(0, mul.outputs[0])
                node.replace_input_with(1, scaled)
            self.smoothed.append(group)
        modified = bool(self.smoothed)
        if modified:
            ir_common.RemoveUnusedNodesPass()(model)  # drops the now unused float weights
        log.info("SmoothQuant (alpha %.2f): smoothed %d activations feeding %d MatMuls", self.alpha,
                 len(self.smoothed), sum(len(g.matmuls) for g in self.smoothed))
        return ir.passes.PassResult(model, modified)


def smooth_onnx(path: str | os.PathLike[str], feeds: list[dict[str, np.ndarray]], alpha: float) -> tuple[ir.Model, list[SmoothGroup]]:
    """Load ``path``, calibrate max |x| on ``feeds`` and apply ``SmoothQuantPass``."""
    model = ir.load(os.fspath(path))
    groups = smoothable_groups(model.graph)
    absmax = activation_absmax(model, [g.activation for g in groups], feeds)
    sq = SmoothQuantPass(absmax, alpha)
    sq(model)
    return model, sq.smoothed
