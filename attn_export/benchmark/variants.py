"""The benchmark's variants: one layer, every way the toolkit can run it, all as ``Runner``s.

A variant is prepared once (export, quantize, factorize, compile) and then gives a fresh
runner per grid point, so the harness never branches on the backend. A variant whose
preparation fails (a missing compiler, an op the runtime lacks, a compression module that is
not installed) is kept in the results as unavailable *with the reason*, never dropped.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attn_export.layers.registry import MaskedLayer
from attn_export.runtime import EagerRunner, OrtRunner, SessionFromOnnx
from attn_export.runtime.base import Runner

__all__ = ["QUICK_VARIANTS", "VARIANTS", "BenchContext", "PreparedVariant", "prepare_variant"]

log = logging.getLogger(__name__)

# Low-rank settings of the low-rank variants: half the parameters of every projection and the FFN.
LOW_RANK_RATIO = 0.5
LOW_RANK_TARGETS = ("q", "k", "v", "o", "ffn")


@dataclass
class BenchContext:
    """What every variant builds from: the eager layer, a work folder, threads, calibration data."""

    layer: MaskedLayer
    d_model: int
    workdir: Path
    threads: int
    seed: int = 0
    _cache: dict[str, Any] = field(default_factory=dict)

    def calibration(self) -> Any:
        """The shipped calibration set for d_model, else a small synthetic one made for this run."""
        if "calib" not in self._cache:
            from attn_export.compress.calib_data import (
                default_calibration_path,
                generate_calibration,
                load_calibration,
            )
            from attn_export.errors import DataError

            try:
                path = default_calibration_path(self.d_model)
            except DataError:
                path = generate_calibration(self.workdir / f"calib_d{self.d_model}.npz", self.d_model, n_calib=16, n_val=4, seed=self.seed)
            self._cache["calib"] = load_calibration(path, d_model=self.d_model)
        return self._cache["calib"]

    def fp32_onnx(self, form: str = "decomposed") -> Path:
        key = f"onnx:{form}"
        if key not in self._cache:
            from attn_export.export import ExportSpec, export_onnx

            path = self.workdir / f"fp32_{form}.onnx"
            export_onnx(self.layer, path, ExportSpec(attention=form))
            self._cache[key] = path
        return self._cache[key]

    def low_rank_layer(self) -> MaskedLayer:
        if "lowrank" not in self._cache:
            from attn_export.compress.lowrank import LowRankConfig, low_rank_

            model = copy.deepcopy(self.layer)
            cal = self.calibration().calib
            x, kpm = cal.to_torch()
            low_rank_(model, LowRankConfig(rank_ratio=LOW_RANK_RATIO, targets=LOW_RANK_TARGETS, method="activation"), x, kpm)
            self._cache["lowrank"] = model.eval()
        return self._cache["lowrank"]

    def low_rank_onnx(self) -> Path:
        if "onnx:lowrank" not in self._cache:
            from attn_export.export import ExportSpec, export_onnx

            path = self.workdir / "lowrank_fp32.onnx"
            export_onnx(self.low_rank_layer(), path, ExportSpec())
            self._cache["onnx:lowrank"] = path
        return self._cache["onnx:lowrank"]

    def ort(self, path: Path, name: str) -> Callable[[], Runner]:
        # The pipeline's CPU session settings (denormals flushed, no spinning, no slow SkipLayerNorm
        # fusion), with the memory arena off so each inference's own peak memory shows and a dozen
        # live sessions at L=2048 do not hold tens of GiB.
        return lambda: OrtRunner(SessionFromOnnx(path, intra_op_threads=self.threads, cpu_mem_arena=False), name=name)

    def eager(self, module: nn.Module, name: str) -> Callable[[], Runner]:
        return lambda: EagerRunner(module, self.layer.input_names, ["y"], name=name)


@dataclass
class PreparedVariant:
    """A variant ready to run, or unavailable with a reason."""

    name: str
    runtime: str  # "eager" | "torch.compile" | "onnxruntime"
    precision: str  # which ceiling applies: fp32 | fp16 | int8
    description: str
    make_runner: Callable[[], Runner] | None = None
    flops_module: nn.Module | None = None  # the module whose Linears/attention it runs
    artifact: str | None = None
    size_bytes: int | None = None
    reason: str | None = None  # why unavailable
    notes: list[str] = field(default_factory=list)
    warm_before_memory: bool = False  # torch.compile compiles on the first call at a shape

    @property
    def available(self) -> bool:
        return self.make_runner is not None and self.reason is None


Builder = Callable[[BenchContext, PreparedVariant], None]


def _size(path: Path) -> int:
    return Path(path).stat().st_size


def _eager_fp32(ctx: BenchContext, v: PreparedVariant) -> None:
    v.make_runner, v.flops_module = ctx.eager(ctx.layer, v.name), ctx.layer


def _eager_int8(ctx: BenchContext, v: PreparedVariant) -> None:
    from attn_export.compress.quant_eager import quantize_eager_

    model = quantize_eager_(ctx.layer, mode="int8-dynamic")  # works on a copy
    v.make_runner, v.flops_module = ctx.eager(model, v.name), ctx.layer


def _compile(ctx: BenchContext, v: PreparedVariant) -> None:
    compiled = torch.compile(ctx.layer, dynamic=True)
    v.make_runner, v.flops_module, v.warm_before_memory = ctx.eager(compiled, v.name), ctx.layer, True


def _ort_form(form: str) -> Builder:
    def build(ctx: BenchContext, v: PreparedVariant) -> None:
        path = ctx.fp32_onnx(form)
        v.make_runner, v.flops_module, v.artifact, v.size_bytes = ctx.ort(path, v.name), ctx.layer, str(path), _size(path)

    return build


def _ort_fp16(ctx: BenchContext, v: PreparedVariant) -> None:
    from attn_export.export import ExportSpec, export_onnx

    path = ctx.workdir / "fp16_decomposed.onnx"
    export_onnx(ctx.layer, path, ExportSpec(precision="fp16"))
    v.make_runner, v.flops_module, v.artifact, v.size_bytes = ctx.ort(path, v.name), ctx.layer, str(path), _size(path)
    v.notes.append("ONNX Runtime CPU runs few ops in fp16; the rest fall back through Casts (see the ratio to fp32)")


def _ort_int8(route: str, low_rank: bool = False) -> Builder:
    def build(ctx: BenchContext, v: PreparedVariant) -> None:
        src = ctx.low_rank_onnx() if low_rank else ctx.fp32_onnx()
        dst = ctx.workdir / f"{'lowrank_' if low_rank else ''}int8_{route}.onnx"
        if route == "dynamic":
            from attn_export.compress.quant_layer import quantize_dynamic_layer

            res = quantize_dynamic_layer(ctx.low_rank_layer() if low_rank else ctx.layer, dst)
        else:
            from attn_export.compress.quant_static import (
                StaticQuantSpec,
                quantize_static_onnx,
            )

            res = quantize_static_onnx(src, dst, ctx.calibration().calib, StaticQuantSpec(method="minmax"))
        v.notes.extend(getattr(res, "notes", []) or [])
        model = ctx.low_rank_layer() if low_rank else ctx.layer
        v.make_runner, v.flops_module, v.artifact, v.size_bytes = ctx.ort(dst, v.name), model, str(dst), _size(dst)

    return build


def _ort_low_rank(ctx: BenchContext, v: PreparedVariant) -> None:
    path = ctx.low_rank_onnx()
    v.make_runner, v.flops_module, v.artifact, v.size_bytes = ctx.ort(path, v.name), ctx.low_rank_layer(), str(path), _size(path)


# name -> (runtime, precision, description, builder); the order is the table's order.
VARIANTS: dict[str, tuple[str, str, str, Builder]] = {
    "eager-fp32": ("eager", "fp32", "PyTorch eager, explicit attention math (the reference)", _eager_fp32),
    "eager-int8-torchao": ("eager", "int8", "PyTorch eager, torchao int8 dynamic activations x int8 weights", _eager_int8),
    "compile-fp32": ("torch.compile", "fp32", "torch.compile(dynamic=True), inductor CPU", _compile),
    "ort-fp32-decomposed": ("onnxruntime", "fp32", "ONNX Runtime CPU, MatMul/Softmax/MatMul attention", _ort_form("decomposed")),
    "ort-fp32-onnx-attention": ("onnxruntime", "fp32", "ONNX Runtime CPU, ONNX Attention op (opset 23)", _ort_form("onnx-attention")),
    "ort-fp32-ort-contrib": ("onnxruntime", "fp32", "ONNX Runtime CPU, com.microsoft.MultiHeadAttention", _ort_form("ort-contrib")),
    "ort-fp16": ("onnxruntime", "fp16", "ONNX Runtime CPU, fp16 weights with fp32 softmax/LayerNorm islands", _ort_fp16),
    "ort-int8-dynamic": ("onnxruntime", "int8", "ONNX Runtime CPU, dynamic int8 (MatMulInteger) on weight MatMuls", _ort_int8("dynamic")),
    "ort-int8-static": ("onnxruntime", "int8", "ONNX Runtime CPU, static int8 Q/DQ, minmax calibration", _ort_int8("static")),
    "ort-lowrank-fp32": ("onnxruntime", "fp32", f"ONNX Runtime CPU, low-rank {LOW_RANK_RATIO} on q,k,v,o,ffn", _ort_low_rank),
    "ort-lowrank-int8-dynamic": ("onnxruntime", "int8", "ONNX Runtime CPU, low-rank + dynamic int8", _ort_int8("dynamic", low_rank=True)),
}
QUICK_VARIANTS: tuple[str, ...] = tuple(VARIANTS)


def prepare_variant(name: str, ctx: BenchContext) -> PreparedVariant:
    """Build one variant; any failure makes it unavailable with a one-line reason."""
    runtime, precision, description, build = VARIANTS[name]
    v = PreparedVariant(name, runtime, precision, description)
    try:
        build(ctx, v)
    except Exception as err:  # noqa: BLE001 - the benchmark reports every variant, runnable or not
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        v.make_runner, v.reason = None, f"{type(err).__name__}: {first[:200]}"
        log.info("variant %s unavailable: %s", name, v.reason)
    return v


def accuracy_feed(ctx: BenchContext, max_items: int = 4) -> dict[str, np.ndarray]:
    """Validation inputs for the variants' accuracy column (the calibration set's val split)."""
    val = ctx.calibration().val
    feed = {"x": np.ascontiguousarray(val.x[:max_items], dtype=np.float32)}
    if "key_padding_mask" in ctx.layer.input_names:
        kpm = val.key_padding_mask
        feed["key_padding_mask"] = np.ones(feed["x"].shape[:2], np.int32) if kpm is None else np.ascontiguousarray(kpm[:max_items], np.int32)
    return feed
