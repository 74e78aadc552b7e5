"""Typed initializers for the ONNX graph passes (export and compress), written once.

Why: a pass that adds a constant must register it with its dtype and shape on the value, not
only on the tensor: later passes (SmoothQuant's float-weight check, ``inspect_qdq``) and shape
inference read the value's own type and shape.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

__all__ = ["typed_initializer"]


def typed_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """Register ``array`` as initializer ``name`` of ``graph``, with its type and shape on the value."""
    tensor = ir.tensor(np.asarray(array), name=name)
    value = ir.Value(name=name, const_value=tensor, type=ir.TensorType(tensor.dtype), shape=ir.Shape(list(tensor.shape)))
    graph.register_initializer(value)
    return value
