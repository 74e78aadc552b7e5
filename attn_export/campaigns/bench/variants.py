"""The benchmark's variants: main-command configurations (through the one plan), and the PyTorch peers.

Every ONNX variant is the options of an ``attn-export`` run (``Variant.run``): the bench makes
a ``RunConfig`` of them, plans it with ``make_plan`` and builds it with ``runner.run_plans``,
so it measures exactly what that command ships (same fallback, same calibration, same low-rank
targets, same CPU int8 encoding). The peers that are not pipeline stages are eager PyTorch
(the reference), PyTorch SDPA and ``torch.compile``, timed beside the stages in the same pass.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from attn_export.campaigns.bench.grid import OPT_IN_VARIANTS, VARIANT_NAMES
from attn_export.runtime.base import Runner

__all__ = ["DEFAULT_VARIANTS", "LINEAR_MEMORY_VARIANTS", "VARIANTS", "Variant", "peer_runner"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Variant:
    """One column of the bench: ``run`` (main-command options) and the ``stage`` of that plan it times, or a ``peer``."""

    name: str
    runtime: str  # "eager" | "torch.compile" | "onnxruntime"
    precision: str  # which ceiling applies: fp32 | fp16 | int8
    description: str
    run: Mapping[str, Any] | None = None
    stage: str | None = None
    peer: str | None = None  # "eager" | "sdpa" | "compile"
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def command(self) -> str:
        """The main command whose stage this is (for the table's notes)."""
        if self.run is None:
            return ""
        return "attn-export " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in self.run.items())


_FP16_NOTE = "ONNX Runtime CPU runs few ops in fp16; the rest fall back through Casts (see the ratio to fp32)"
VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("eager-fp32", "eager", "fp32", "PyTorch eager, explicit attention math (the reference)", peer="eager"),
    Variant("eager-sdpa", "eager", "fp32", "PyTorch eager with F.scaled_dot_product_attention and the same mask (the long-sequence peer)", peer="sdpa"),
    Variant("eager-int8-torchao", "eager", "int8", "PyTorch eager, torchao int8 dynamic activations x int8 weights",
            run={"quantize": "int8", "int8_mode": "torchao"}, stage="int8-torchao"),
    Variant("compile-fp32", "torch.compile", "fp32", "torch.compile(dynamic=True), inductor CPU", peer="compile"),
    Variant("ort-fp32-decomposed", "onnxruntime", "fp32", "ONNX Runtime CPU, MatMul/Softmax/MatMul attention", run={"attention": "decomposed"}, stage="onnx-fp32"),
    Variant("ort-fp32-onnx-attention", "onnxruntime", "fp32", "ONNX Runtime CPU, ONNX Attention op (opset 23)", run={"attention": "onnx-attention"}, stage="onnx-fp32"),
    Variant("ort-fp32-ort-contrib", "onnxruntime", "fp32", "ONNX Runtime CPU, com.microsoft.MultiHeadAttention", run={"attention": "ort-contrib"}, stage="onnx-fp32"),
    Variant("ort-fp32-long-seq", "onnxruntime", "fp32", "ONNX Runtime CPU, the long-seq form (flash kernels, O(L) memory)", run={"attention": "long-seq"}, stage="onnx-fp32"),
    Variant("ort-fp16", "onnxruntime", "fp16", "ONNX Runtime CPU, fp16 weights with fp32 softmax/LayerNorm islands", run={"precision": "fp16"}, stage="onnx-fp16",
            notes=(_FP16_NOTE,)),
    Variant("ort-int8-dynamic", "onnxruntime", "int8", "ONNX Runtime CPU, dynamic int8 (attn-export --quantize int8 --int8-mode dynamic)",
            run={"quantize": "int8", "int8_mode": "dynamic"}, stage="int8-dynamic"),
    Variant("ort-int8-static", "onnxruntime", "int8", "ONNX Runtime CPU, static int8 Q/DQ with the auto fallback (--int8-mode static)",
            run={"quantize": "int8", "int8_mode": "static"}, stage="int8-static"),
    Variant("ort-lowrank-fp32", "onnxruntime", "fp32", "ONNX Runtime CPU, low-rank 0.5 on the default targets (--low-rank 0.5)", run={"low_rank": 0.5}, stage="lowrank"),
    Variant("ort-lowrank-int8-dynamic", "onnxruntime", "int8", "ONNX Runtime CPU, low-rank + dynamic int8",
            run={"low_rank": 0.5, "quantize": "int8", "int8_mode": "dynamic"}, stage="lowrank-int8-dynamic"),
)}  # fmt: skip
if tuple(VARIANTS) != VARIANT_NAMES:  # pragma: no cover - the names --help lists and the variants are the same
    raise ImportError(f"bench variants {tuple(VARIANTS)} differ from grid.VARIANT_NAMES {VARIANT_NAMES}")
DEFAULT_VARIANTS: tuple[str, ...] = tuple(v for v in VARIANTS if v not in OPT_IN_VARIANTS)  # the opt-in ones (grid.py) only when named
# Variants whose attention memory grows as O(L): never skipped for the size of a score tensor.
LINEAR_MEMORY_VARIANTS: frozenset[str] = frozenset({"eager-sdpa", "ort-fp32-long-seq"})


def peer_runner(variant: Variant, subject: Any) -> Callable[[], Runner]:
    """A runner factory for a peer that is not a pipeline stage: eager, PyTorch SDPA, ``torch.compile``."""
    if variant.peer == "eager":
        return lambda: subject.eager_runner(name=variant.name)
    if variant.peer == "sdpa":
        from attn_export.layers.projections import set_attention_impl_

        sdpa = copy.deepcopy(subject.module)
        set_attention_impl_(sdpa, "sdpa")
        return lambda: subject.eager_runner(sdpa, name=variant.name)
    if variant.peer == "compile":
        import torch

        compiled = torch.compile(subject.module, dynamic=True)
        return lambda: subject.eager_runner(compiled, name=variant.name)
    raise KeyError(f"{variant.name} is not a peer")
