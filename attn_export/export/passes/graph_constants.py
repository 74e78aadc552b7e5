"""Typed initializers for the ONNX graph passes (export and compress), written once.

Why: a pass that adds a constant must register it with its dtype and shape on the value, not
only on the tensor: later passes (SmoothQuant's float-weight check, ``inspect_qdq``) and shape
inference read the value's own type and shape.

Why the name is only a stem: one initializer may feed several nodes. The exporter deduplicates
equal constants (every zero bias of a freshly initialised encoder becomes one initializer, read
by every layer), so a pass that rewrites "the bias of this node" runs once per consumer, and a
name derived from the shared initializer's would be registered twice. ``typed_initializer``
therefore registers ``name`` when it is free and ``name_1``, ``name_2``, ... otherwise; callers
rewire the one consumer they rewrite to the value it returns and never change a shared
initializer in place (the other consumers keep their own numbers).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

__all__ = ["fresh_name", "typed_initializer"]


def fresh_name(graph: ir.Graph, stem: str) -> str:
    """``stem``, or ``stem_1``, ``stem_2``, ...: the first that no value of ``graph`` (inputs, initializers, node outputs) has."""
    taken = set(graph.initializers)
    taken.update(v.name for v in graph.inputs if v.name)
    taken.update(out.name for node in graph.all_nodes() for out in node.outputs if out.name)
    name, n = stem, 0
    while name in taken:
        n += 1
        name = f"{stem}_{n}"
    return name


def typed_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """Register ``array`` as a new initializer of ``graph`` named after ``name`` (``fresh_name``), with its type and shape on the value."""
    unique = fresh_name(graph, name)
    tensor = ir.tensor(np.asarray(array), name=unique)
    value = ir.Value(name=unique, const_value=tensor, type=ir.TensorType(tensor.dtype), shape=ir.Shape(list(tensor.shape)))
    graph.register_initializer(value)
    return value
