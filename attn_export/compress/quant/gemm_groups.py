"""The quantized GEMMs of a Q/DQ graph, grouped into tuning units, and the surgery that moves groups to float.

``mixed_precision`` decides *which* groups fall back; this module knows the graph:

* **Inventory** (``find_gemms``): every quantized GEMM, labelled by the module it came from
  (``layers.0.ffn_out``) and grouped (Q/K/V, attention output, FFN1, FFN2 of layer N).
* **Switchable graph** (``SwitchableGraph``): each group's activation and weight pass through
  ``Where(switch, DQ(Q(x)), x)``, the switches a graph input, so one ONNX Runtime session runs
  every sensitivity variant without rebuilding a model.
* **Fallback** (``FloatFallbackPass``, ``apply_fallback``): the chosen groups lose their Q/DQ
  (activation read in float, weight back to its float initializer).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as ir_common

from attn_export.compress.quant.qdq import is_constant
from attn_export.errors import ConfigError, ExportError
from attn_export.export.passes.graph_constants import typed_initializer
from attn_export.runtime.base import Feed, Runner

__all__ = ["FloatFallbackPass", "Gemm", "SwitchableGraph", "apply_fallback", "find_gemms", "gemm_label", "group_of", "groups_in_order"]

log = logging.getLogger(__name__)


SWITCH_INPUT = "int8_group_switches"  # bool [groups]: True = the group runs int8


# -- inventory ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Gemm:
    """One quantized GEMM (MatMul with Q/DQ activation and per-channel DQ weight)."""

    node: str
    label: str  # the module it came from, e.g. layers.0.ffn_out
    group: str  # the tuning unit, e.g. layers.0.ffn2
    macs_per_token: int  # K x N of its weight


_ROLE = {"w_q": "qkv", "w_k": "qkv", "w_v": "qkv", "w_qkv": "qkv", "in_proj": "qkv", "w_o": "attn_out", "out_proj": "attn_out",
         "ffn_in": "ffn1", "ffn_out": "ffn2"}  # fmt: skip


def gemm_label(node: ir.Node) -> str:
    """The module a GEMM node was exported from (its innermost torch name scope), e.g. ``layers.0.ffn_out``."""
    return _module_path(node)


def _module_path(node: ir.Node) -> str:
    scopes = node.metadata_props.get("pkg.torch.onnx.name_scopes")
    if scopes:
        parts = re.findall(r"'([^']*)'", scopes)
        mods = [p for p in parts if p and not re.fullmatch(r"(linear|matmul|mm|addmm)(_\d+)?", p)]
        if mods:
            return mods[-1]
    return node.name or "?"


def group_of(label: str) -> str:
    parts = label.split(".")
    if parts and parts[-1] in ("down", "up"):  # both factors of a low-rank Linear
        parts = parts[:-1]
    role = _ROLE.get(parts[-1]) if parts else None
    if role is None:
        return label
    prefix = [p for p in parts[:-1] if p not in ("self_attn", "attn", "attention")]
    return ".".join(prefix + [role])


def _dq_source(value: ir.Value | None) -> tuple[ir.Node, ir.Node] | None:
    """(DQ, Q) when ``value`` is an activation read through QuantizeLinear (static ranges) or DynamicQuantizeLinear
    (ranges per batch: the dynamic route's view, ``dynamic_groups``) -> DequantizeLinear."""
    dq = value.producer() if value is not None else None
    if dq is None or dq.op_type != "DequantizeLinear" or is_constant(dq.inputs[0]):
        return None
    q = dq.inputs[0].producer()
    if q is None or q.op_type not in ("QuantizeLinear", "DynamicQuantizeLinear"):
        return None
    return dq, q


def find_gemms(model: ir.Model) -> list[Gemm]:
    """Every MatMul/Gemm whose activation comes through Q/DQ and whose weight through a constant DQ."""
    out = []
    for node in model.graph:
        if node.op_type not in ("MatMul", "Gemm") or len(node.inputs) < 2:
            continue
        w = node.inputs[1]
        wdq = w.producer() if w is not None else None
        if _dq_source(node.inputs[0]) is None or wdq is None or wdq.op_type != "DequantizeLinear" or not is_constant(wdq.inputs[0]):
            continue
        shape = wdq.inputs[0].shape
        dims = [int(d) for d in shape.numpy()] if shape is not None else [0, 0]
        label = _module_path(node)
        out.append(Gemm(node.name or "", label, group_of(label), int(np.prod(dims[-2:])) if len(dims) >= 2 else 0))
    return out


def groups_in_order(gemms: Sequence[Gemm]) -> list[str]:
    return list(dict.fromkeys(g.group for g in gemms))


def _float_weights(float_model: ir.Model, names: set[str]) -> dict[str, ir.Value]:
    """MatMul node name -> its float weight value in the float graph the Q/DQ were placed on."""
    out = {}
    for node in float_model.graph:
        if node.name in names and node.inputs[1] is not None and node.inputs[1].const_value is not None:
            out[node.name] = node.inputs[1]
    missing = names - set(out)
    if missing:
        raise ExportError(f"the float model lacks the weights of GEMMs {sorted(missing)[:3]}; pass the graph quantize_static_onnx quantized")
    return out


def _float_copies(graph: ir.Graph, weights: dict[str, ir.Value]) -> dict[str, ir.Value]:
    """MatMul node name -> the float weight registered in ``graph``: one initializer per distinct float weight.

    GEMMs may share a weight (equal weights of several layers are one initializer in the
    export): they share its float copy, under a name no value of ``graph`` has.
    """
    copies: dict[int, ir.Value] = {}
    for w in weights.values():
        if id(w) not in copies:
            copies[id(w)] = typed_initializer(graph, f"{w.name}_float", w.const_value.numpy())
    return {node: copies[id(w)] for node, w in weights.items()}


# -- the result graph --------------------------------------------------------------------
class FloatFallbackPass(ir.passes.InPlacePass):
    """Remove the Q/DQ of the GEMMs in ``groups``: activation read in float, float weight restored."""

    def __init__(self, groups: set[str], float_model: ir.Model) -> None:
        super().__init__()
        self.groups = groups
        self.float_model = float_model
        self.moved: list[str] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        gemms = [g for g in find_gemms(model) if g.group in self.groups]
        floats = _float_copies(model.graph, _float_weights(self.float_model, {g.node for g in gemms}))
        nodes = {n.name: n for n in model.graph}
        self.moved = []
        for g in gemms:
            node = nodes[g.node]
            _, q = _dq_source(node.inputs[0])  # type: ignore[misc]
            node.replace_input_with(0, q.inputs[0])
            node.replace_input_with(1, floats[g.node])
            self.moved.append(g.node)
        if self.moved:
            ir_common.RemoveUnusedNodesPass()(model)  # the Q/DQ pairs and int8 weights nobody reads
        return ir.passes.PassResult(model, bool(self.moved))


# -- one session for every variant -------------------------------------------------------
class SwitchableGraph:
    """The Q/DQ graph with a per-group int8/float switch as a graph input (``SWITCH_INPUT``).

    ``runner(int8_groups)`` returns a ``Runner`` with the subject's inputs that runs the
    chosen groups in int8 and the rest in float; every runner shares one session.
    """

    def __init__(self, qdq_model: ir.Model, float_model: ir.Model, threads: int | None, workdir: Path) -> None:
        from attn_export.runtime import OrtRunner, SessionFromOnnx

        model = ir.serde.deserialize_model(ir.serde.serialize_model(qdq_model))  # a copy we may rewire
        gemms = find_gemms(model)
        if not gemms:
            raise ExportError("the static Q/DQ graph has no quantized GEMM to switch; is it a Q/DQ model?")
        self.gemms = gemms
        self.groups = groups_in_order(gemms)
        graph = model.graph
        floats = _float_copies(graph, _float_weights(float_model, {g.node for g in gemms}))
        switches = ir.Value(name=SWITCH_INPUT, type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([len(self.groups)]))
        graph.inputs.append(switches)
        flags: dict[str, ir.Value] = {}
        nodes = {n.name: n for n in graph}
        for i, group in enumerate(self.groups):
            idx = ir.Value(name=f"{SWITCH_INPUT}_{i}_index", const_value=ir.tensor(np.int64(i)))
            graph.register_initializer(idx)
            gather = ir.node("Gather", [switches, idx], attributes={"axis": 0}, name=f"{SWITCH_INPUT}_{i}")
            gather.outputs[0].name = f"{SWITCH_INPUT}_{i}_on"
            graph.insert_before(graph.node(0), gather)
            flags[group] = gather.outputs[0]
        for g in gemms:
            node = nodes[g.node]
            dq, q = _dq_source(node.inputs[0])  # type: ignore[misc]
            for index, (quant, flt) in enumerate(((dq.outputs[0], q.inputs[0]), (node.inputs[1], floats[g.node]))):
                where = ir.node("Where", [flags[g.group], quant, flt], name=f"{g.node}_switch_{index}")
                where.outputs[0].name = f"{g.node}_switch_{index}_out"
                where.outputs[0].type, where.outputs[0].shape = quant.type, quant.shape
                graph.insert_before(node, where)
                node.replace_input_with(index, where.outputs[0])
        self.path = Path(workdir) / "switchable.onnx"
        ir.save(model, self.path)
        self._runner = OrtRunner(SessionFromOnnx(self.path, providers=["cpu"], intra_op_threads=threads, qdq_fusion=False), name="int8-switches")

    def runner(self, int8_groups: set[str] | Sequence[str]) -> Runner:
        on = set(int8_groups)
        unknown = on - set(self.groups)
        if unknown:
            raise ConfigError(f"unknown GEMM groups {sorted(unknown)}; known: {', '.join(self.groups)}")
        return _SwitchedRunner(self._runner, np.array([g in on for g in self.groups], dtype=np.bool_))

    def close(self) -> None:
        self._runner.deactivate()


class _SwitchedRunner(Runner):
    """The shared session with one setting of the switches; takes the subject's own inputs."""

    name = "int8-switches"

    def __init__(self, inner: Runner, switches: np.ndarray) -> None:
        super().__init__()
        self.inner, self.switches = inner, switches

    @property
    def input_names(self) -> list[str]:
        return [n for n in self.inner.input_names if n != SWITCH_INPUT]

    @property
    def output_names(self) -> list[str]:
        return self.inner.output_names

    def _activate(self) -> None:
        self.inner.activate()

    def _infer(self, feed: Feed) -> dict[str, np.ndarray]:
        return self.inner.infer({**feed, SWITCH_INPUT: self.switches})


def apply_fallback(qdq_path: Path, float_model: ir.Model, float_groups: Sequence[str], out_path: Path) -> int:
    """Write ``qdq_path`` with ``float_groups`` in float to ``out_path``; returns the GEMMs moved."""
    from attn_export.compress.quant.onnx import save_model_atomic

    model = ir.load(os.fspath(qdq_path))
    fb = FloatFallbackPass(set(float_groups), float_model)
    fb(model)
    save_model_atomic(model, out_path)
    return len(fb.moved)
