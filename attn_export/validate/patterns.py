"""Attention maps per head, eager against an exported model: ``check_attention_patterns``.

Output metrics can hide a head that attends to the wrong tokens when the FFN and the
residual dilute it; comparing the softmax probabilities themselves cannot. Eager maps come
from the layer's own ``need_weights=True`` path (the explicit math, ground truth). ONNX maps
come from a *copy* of the exported graph in which every attention Softmax output is added as
an extra graph output (an onnx_ir edit), run in ONNX Runtime. Fused forms (ONNX Attention,
com.microsoft.MultiHeadAttention) have no Softmax to expose, so the layer is re-exported in
the decomposed form for this check, and the result says so.

Maps are compared in one layout, (B, H, Lq, Lk), whatever the layer returns: block-sparse
attention computes per-block probabilities ((B, nb, H, bs, bs) eager, (B*nb, H, bs, bs) in
the graph, blocks folded into the batch), which become the block-diagonal (B, H, L, L) matrix
they stand for. Linear attention never forms softmax probabilities (its kernelised form has
no L x L matrix and no Softmax in the graph), so asking for its maps raises ``NoAttentionMaps``
and the report renders a note instead.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
from torch import nn

from attn_export.errors import ConfigError, ExportError
from attn_export.layers.block_sparse import BlockSparseAttention
from attn_export.layers.linear_attention import LinearAttention
from attn_export.layers.registry import MaskedLayer
from attn_export.runtime.ort import OrtRunner, SessionFromOnnx

__all__ = [
    "AttentionPatternResult",
    "NoAttentionMaps",
    "attention_maps",
    "check_attention_patterns",
    "eager_attention_maps",
    "expose_softmax",
    "expose_softmax_outputs",
    "has_attention_maps",
]


class NoAttentionMaps(ConfigError):
    """The layer computes no softmax attention probabilities, so there are no maps to compare."""


# Layers whose forward has no softmax over keys: their "weights" are diagnostics, not what runs.
_NO_SOFTMAX: tuple[type[nn.Module], ...] = (LinearAttention,)

log = logging.getLogger(__name__)


def _attention_module(model: nn.Module) -> nn.Module:
    for mod in model.modules():
        if hasattr(mod, "attention_form") and hasattr(mod, "heads"):
            return mod
    raise ConfigError(f"expected a model containing an attention layer from attn_export.layers, got {type(model).__name__}")


def has_attention_maps(model: nn.Module) -> bool:
    """Whether the model's attention block computes softmax probabilities (False: linear attention)."""
    return not isinstance(_attention_module(model), _NO_SOFTMAX)


def _no_maps(attn: nn.Module) -> NoAttentionMaps:
    return NoAttentionMaps(
        f"{type(attn).__name__} computes no softmax attention probabilities (no L x L matrix, no Softmax in the graph); "
        "there are no attention maps to compare, the output metrics are the check"
    )


def _as_bhll(maps: np.ndarray, attn: nn.Module, batch: int, length: int) -> np.ndarray:
    """A layer's own map layout as (B, H, L, L).

    Block-sparse: per-block maps, eager (B, nb, H, bs, bs) or graph (B*nb, H, bs, bs), placed
    on the diagonal of the padded (B, H, nb*bs, nb*bs) matrix, then cropped to the real L.
    """
    if isinstance(attn, BlockSparseAttention):
        bs, heads = attn.block_size, attn.heads
        nb = -(-length // bs)  # ceil: the sequence is padded to whole blocks
        if maps.size != batch * nb * heads * bs * bs:
            raise ConfigError(
                f"expected block-sparse attention maps of {batch}x{nb} blocks x {heads} heads x {bs}x{bs}, got shape {maps.shape}; is it the same layer?"
            )
        blocks = maps.reshape(batch, nb, heads, bs, bs)  # (B, nb, H, bs, bs)
        full = np.zeros((batch, heads, nb * bs, nb * bs), dtype=np.float32)  # (B, H, Lp, Lp)
        for i in range(nb):
            full[:, :, i * bs : (i + 1) * bs, i * bs : (i + 1) * bs] = blocks[:, i]
        return full[:, :, :length, :length]  # (B, H, L, L)
    return maps


@torch.no_grad()
def eager_attention_maps(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> np.ndarray:
    """(B, H, Lq, Lk) probabilities of the first attention block, via ``need_weights=True``.

    Raises ``NoAttentionMaps`` for a layer without softmax probabilities (linear attention).
    """
    attn = _attention_module(model)
    if isinstance(attn, _NO_SOFTMAX):
        raise _no_maps(attn)
    captured: dict[str, Any] = {}

    def grab(_mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured.setdefault("call", (args, kwargs))

    handle = attn.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        model.eval()(*inputs)
    finally:
        handle.remove()
    if "call" not in captured:
        raise ConfigError(f"the attention block of {type(model).__name__} was not called in forward")
    args, kwargs = captured["call"]
    _, weights = attn(*args, **{**kwargs, "need_weights": True})
    if weights is None:
        raise _no_maps(attn)
    batch, length = args[0].shape[:2]  # the block's query input, (B, L, D)
    return _as_bhll(weights.float().numpy(), attn, int(batch), int(length))


def expose_softmax(model: ir.Model) -> list[str]:
    """Add every Softmax output of ``model``'s main graph as a graph output, in place; returns their names in graph order.

    A Softmax inside a subgraph (the ``long-seq`` form's Loop over query blocks) is not
    exposed: its output is one block of one iteration, a name the main graph does not
    have (ONNX Runtime refuses such a model: "Graph output ... does not exist").
    """
    outputs = {v.name for v in model.graph.outputs}
    names: list[str] = []
    for node in model.graph:  # the main graph only, not Loop/If bodies
        if node.op_type != "Softmax":
            continue
        value = node.outputs[0]
        if value.name not in outputs:
            if value.type is None:
                value.type = ir.TensorType(ir.DataType.FLOAT)
            model.graph.outputs.append(value)
        names.append(value.name)
    return names


def expose_softmax_outputs(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> list[str]:
    """Copy ``src`` to ``dst`` with every Softmax output of the main graph added as a graph output (``expose_softmax``)."""
    model = ir.load(src)
    names = expose_softmax(model)
    ir.save(model, dst)
    return names


@dataclass
class AttentionPatternResult:
    """Per-head agreement of eager and ONNX attention probabilities (valid query rows only)."""

    max_abs_per_head: list[float]
    cosine_per_head: list[float]
    atol: float
    source: str  # which graph the ONNX maps came from
    eager_maps: np.ndarray = field(repr=False)
    onnx_maps: np.ndarray = field(repr=False)

    def __bool__(self) -> bool:
        return max(self.max_abs_per_head, default=0.0) <= self.atol

    def __str__(self) -> str:
        worst = int(np.argmax(self.max_abs_per_head)) if self.max_abs_per_head else 0
        verdict = "PASS" if self else "FAIL"
        heads = ", ".join(f"h{i}={m:.2g}" for i, m in enumerate(self.max_abs_per_head))
        return (
            f"attention maps ({self.source}): {verdict} worst head {worst} "
            f"max_abs={self.max_abs_per_head[worst]:.3g} (atol {self.atol:.3g}); per head: {heads}"
        )


def _onnx_maps(onnx_path: str | os.PathLike[str] | None, layer: MaskedLayer, feed: dict[str, np.ndarray]) -> tuple[np.ndarray, str]:
    from attn_export.export import ExportSpec, export_onnx

    with tempfile.TemporaryDirectory(prefix="attn-maps-") as tmp:
        source = "artifact"
        names = expose_softmax_outputs(onnx_path, Path(tmp) / "maps.onnx") if onnx_path else []
        if not names:
            # fused attention (one op) or a Softmax inside a Loop (long-seq): the maps come from the decomposed form
            source = "decomposed re-export" + (" (the artifact's attention has no Softmax in its main graph: fused, or in a Loop)" if onnx_path else "")
            export_onnx(layer, Path(tmp) / "decomposed.onnx", ExportSpec(attention="decomposed"))
            names = expose_softmax_outputs(Path(tmp) / "decomposed.onnx", Path(tmp) / "maps.onnx")
        if not names:
            raise _no_maps(_attention_module(layer))
        try:
            with OrtRunner(SessionFromOnnx(Path(tmp) / "maps.onnx")) as runner:
                out = runner.infer({n: feed[n] for n in runner.input_names})
        except Exception as err:  # ONNX Runtime's own errors are plain Exceptions: the report says why, never crashes
            raise ExportError(f"ONNX Runtime could not run the attention-map graph ({source}): {' '.join(str(err).split())[:200]}") from err
    return np.asarray(out[names[0]], dtype=np.float32), source


def attention_maps(
    layer: nn.Module,
    x: np.ndarray | torch.Tensor,
    onnx_path: str | os.PathLike[str] | None = None,
    key_padding_mask: np.ndarray | torch.Tensor | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(eager_maps, onnx_maps), each (B, H, Lq, Lk), for input ``x`` (B, L, D)."""
    result = check_attention_patterns(layer, x, onnx_path, key_padding_mask)
    return result.eager_maps, result.onnx_maps


def check_attention_patterns(
    layer: nn.Module,
    x: np.ndarray | torch.Tensor,
    onnx_path: str | os.PathLike[str] | None = None,
    key_padding_mask: np.ndarray | torch.Tensor | None = None,
    atol: float = 1e-4,
) -> AttentionPatternResult:
    """Compare eager and exported attention probabilities head by head.

    Rows of fully padded queries (all-zero in eager) are excluded: eager defines them as 0
    while a graph's raw Softmax output there is unspecified until the row is masked after it.
    """
    masked = layer if isinstance(layer, MaskedLayer) else MaskedLayer(layer, "padding" if key_padding_mask is not None else "none")
    feed = {"x": np.asarray(x, dtype=np.float32)}
    if key_padding_mask is not None:
        feed["key_padding_mask"] = np.asarray(key_padding_mask, dtype=np.int32)
    inputs = tuple(torch.from_numpy(feed[n]) for n in masked.input_names if n in feed)
    eager = eager_attention_maps(masked, inputs)
    onnx, source = _onnx_maps(onnx_path, masked, feed)
    onnx = _as_bhll(onnx, _attention_module(masked), *feed["x"].shape[:2])
    if onnx.shape != eager.shape:
        raise ConfigError(f"expected ONNX attention maps of shape {eager.shape}, got {onnx.shape}; is it the same layer?")
    valid = eager.sum(axis=-1, keepdims=True) > 0  # (B, H, Lq, 1)
    onnx = np.where(valid, onnx, 0.0).astype(np.float32)
    diff = np.abs(eager.astype(np.float64) - onnx)
    heads = eager.shape[1]
    max_abs = [float(diff[:, h].max(initial=0.0)) for h in range(heads)]
    cos = []
    for h in range(heads):
        a, b = eager[:, h].ravel().astype(np.float64), onnx[:, h].ravel().astype(np.float64)
        denom = float(np.linalg.norm(a) * np.linalg.norm(b))
        cos.append(float(a @ b / denom) if denom > 0 else 1.0)
    result = AttentionPatternResult(max_abs, cos, atol, source, eager, onnx)
    log.info("%s", result)
    return result
