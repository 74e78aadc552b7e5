"""The benchmark's variants: the pipeline's own stages, plus the PyTorch peers, all as ``Runner``s.

Every ONNX variant is a plan step built by the runner's build phase (``runner.build_artifacts``)
through the compression registry, exactly as ``attn-export --quantize int8`` builds it, so
the bench measures what the pipeline ships. The peers that are not pipeline stages are eager
PyTorch (the reference) and ``torch.compile``. A variant whose build fails (a missing
compiler, an op the runtime lacks) is kept as unavailable *with the reason*, never dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attn_export.runtime.base import Runner

__all__ = ["DEFAULT_VARIANTS", "QUICK_VARIANTS", "VARIANTS", "BenchContext", "PreparedVariant", "accuracy_feed", "prepare_variants"]

log = logging.getLogger(__name__)

# Low-rank settings of the low-rank variants: half the parameters of every projection and the FFN.
LOW_RANK_RATIO = 0.5
LOW_RANK_TARGETS = ("q", "k", "v", "o", "ffn")

# name -> (runtime, precision, description); the order is the table's order.
VARIANTS: dict[str, tuple[str, str, str]] = {
    "eager-fp32": ("eager", "fp32", "PyTorch eager, explicit attention math (the reference)"),
    "eager-sdpa": ("eager", "fp32", "PyTorch eager with F.scaled_dot_product_attention and the same mask (the long-sequence peer)"),
    "eager-int8-torchao": ("eager", "int8", "PyTorch eager, torchao int8 dynamic activations x int8 weights"),
    "compile-fp32": ("torch.compile", "fp32", "torch.compile(dynamic=True), inductor CPU"),
    "ort-fp32-decomposed": ("onnxruntime", "fp32", "ONNX Runtime CPU, MatMul/Softmax/MatMul attention"),
    "ort-fp32-onnx-attention": ("onnxruntime", "fp32", "ONNX Runtime CPU, ONNX Attention op (opset 23)"),
    "ort-fp32-ort-contrib": ("onnxruntime", "fp32", "ONNX Runtime CPU, com.microsoft.MultiHeadAttention"),
    "ort-fp32-long-seq": ("onnxruntime", "fp32", "ONNX Runtime CPU, the long-seq form (flash kernels, O(L) memory)"),
    "ort-fp16": ("onnxruntime", "fp16", "ONNX Runtime CPU, fp16 weights with fp32 softmax/LayerNorm islands"),
    "ort-int8-dynamic": ("onnxruntime", "int8", "ONNX Runtime CPU, dynamic int8 (the pipeline's int8-dynamic stage)"),
    "ort-int8-static": ("onnxruntime", "int8", "ONNX Runtime CPU, static int8 Q/DQ, minmax calibration (int8-static)"),
    "ort-lowrank-fp32": ("onnxruntime", "fp32", f"ONNX Runtime CPU, low-rank {LOW_RANK_RATIO} on q,k,v,o,ffn"),
    "ort-lowrank-int8-dynamic": ("onnxruntime", "int8", "ONNX Runtime CPU, low-rank + dynamic int8"),
}
# torchao's CPU int8 runs slower than fp32 on x86 without VNNI-aware kernels (0.04-0.8x measured):
# it is benchmarked only when named in --variants.
DEFAULT_VARIANTS: tuple[str, ...] = tuple(v for v in VARIANTS if v != "eager-int8-torchao")
# Variants whose attention memory grows as O(L): never skipped for the size of a score tensor.
LINEAR_MEMORY_VARIANTS: frozenset[str] = frozenset({"eager-sdpa", "ort-fp32-long-seq"})
QUICK_VARIANTS: tuple[str, ...] = DEFAULT_VARIANTS


@dataclass
class BenchContext:
    """What every variant builds from: the subject (a reference layer), a work folder, threads."""

    subject: Any
    workdir: Path
    threads: int
    d_model: int
    seed: int = 0

    @property
    def layer(self) -> Any:
        return self.subject.module

    def ort(self, path: Path, name: str, u8u8: bool = False) -> Callable[[], Runner]:
        # The pipeline's CPU session settings (denormals flushed, no spinning, no slow SkipLayerNorm
        # fusion), with the memory arena off so each inference's own peak memory shows and a dozen
        # live sessions at L=2048 do not hold tens of GiB.
        from attn_export.runtime import OrtRunner, SessionFromOnnx

        return lambda: OrtRunner(SessionFromOnnx(path, intra_op_threads=self.threads, cpu_mem_arena=False, u8u8=u8u8), name=name)

    def eager(self, module: Any, name: str) -> Callable[[], Runner]:
        return lambda: self.subject.eager_runner(module, name=name)


@dataclass
class PreparedVariant:
    """A variant ready to run, or unavailable with a reason."""

    name: str
    runtime: str  # "eager" | "torch.compile" | "onnxruntime"
    precision: str  # which ceiling applies: fp32 | fp16 | int8
    description: str
    make_runner: Callable[[], Runner] | None = None
    flops_module: Any = None  # the module whose Linears/attention it runs
    artifact: str | None = None
    size_bytes: int | None = None
    reason: str | None = None  # why unavailable
    notes: list[str] = field(default_factory=list)
    warm_before_memory: bool = False  # torch.compile compiles on the first call at a shape

    @property
    def available(self) -> bool:
        return self.make_runner is not None and self.reason is None


def _steps_for(names: tuple[str, ...]) -> dict[str, list[Any]]:
    """The plan steps each ONNX variant needs (a step shared by two variants is built once)."""
    from dataclasses import replace

    from attn_export.compress.registry import Int8Dynamic, Int8Static, LowRank, TorchaoInt8
    from attn_export.export import ExportSpec
    from attn_export.plan import ExportStep, Step

    base = Step("fp32", ExportStep("fp32", ExportSpec()), "subject", "fp32_decomposed.onnx")
    low = Step("lowrank", LowRank(LOW_RANK_RATIO, "activation", LOW_RANK_TARGETS), "fp32", "lowrank_fp32.onnx")
    forms = {f"ort-fp32-{form}": Step(f"fp32-{form}", ExportStep("fp32", replace(ExportSpec(attention=form), opset=None)), "subject", f"fp32_{form}.onnx")
             for form in ("onnx-attention", "ort-contrib", "long-seq")}  # fmt: skip
    table: dict[str, list[Any]] = {
        "ort-fp32-decomposed": [base],
        **{k: [v] for k, v in forms.items()},
        "ort-fp16": [Step("fp16", ExportStep("fp16", ExportSpec(precision="fp16")), "subject", "fp16_decomposed.onnx")],
        "ort-int8-dynamic": [base, Step("int8-dynamic", Int8Dynamic(per_channel=True), "fp32", "int8_dynamic.onnx")],
        "ort-int8-static": [base, Step("int8-static", Int8Static(method="minmax"), "fp32", "int8_static.onnx")],
        "ort-lowrank-fp32": [base, low],
        "ort-lowrank-int8-dynamic": [base, low, Step("lowrank-int8-dynamic", Int8Dynamic(per_channel=True), "lowrank", "lowrank_int8_dynamic.onnx")],
        "eager-int8-torchao": [base, Step("torchao", TorchaoInt8(), "fp32", "")],
    }
    return {n: table[n] for n in names if n in table}


def prepare_variants(names: tuple[str, ...], ctx: BenchContext, encoding: Any) -> list[PreparedVariant]:
    """Build every named variant; a failure makes that variant unavailable with a one-line reason."""
    import dataclasses

    from attn_export.compress.registry import BuildContext, Int8Dynamic, Int8Static
    from attn_export.export import ExportSpec
    from attn_export.export.targets import get_target
    from attn_export.plan import Plan
    from attn_export.runner import build_artifacts

    build = BuildContext(ctx.subject, ctx.workdir, get_target("ort-cpu"), ExportSpec(), ctx.threads)
    built: dict[str, Any] = {}
    prepared: list[PreparedVariant] = []
    for name in names:
        runtime, precision, description = VARIANTS[name]
        v = PreparedVariant(name, runtime, precision, description)
        try:
            if name == "eager-fp32":
                v.make_runner, v.flops_module = ctx.eager(ctx.layer, name), ctx.layer
            elif name == "eager-sdpa":
                import copy

                from attn_export.layers.projections import set_attention_impl_

                sdpa = copy.deepcopy(ctx.layer)
                set_attention_impl_(sdpa, "sdpa")
                v.make_runner, v.flops_module = ctx.eager(sdpa, name), ctx.layer
            elif name == "compile-fp32":
                import torch

                compiled = torch.compile(ctx.layer, dynamic=True)
                v.make_runner, v.flops_module, v.warm_before_memory = ctx.eager(compiled, name), ctx.layer, True
            else:
                steps = _steps_for((name,))[name]
                # the CPU int8 encoding the pipeline would pick on this machine (reduce-range without VNNI)
                steps = [dataclasses.replace(s, config=dataclasses.replace(s.config, reduce_range=encoding.reduce_range, session_u8u8=encoding.session_u8u8))
                         if isinstance(s.config, (Int8Dynamic, Int8Static)) else s for s in steps]  # fmt: skip
                todo = [s for s in steps if s.name not in built]
                built.update(build_artifacts(Plan(todo), build, built))
                art = built[steps[-1].name]
                v.flops_module = art.module
                if art.path is not None and art.deployable:
                    u8u8 = bool((art.details.get("runtime") or {}).get("session_options"))
                    v.make_runner, v.artifact, v.size_bytes = ctx.ort(art.path, name, u8u8), str(art.path), art.size_bytes
                else:
                    v.make_runner, v.size_bytes = art.make_runner, art.size_bytes
                if precision == "fp16":
                    v.notes.append("ONNX Runtime CPU runs few ops in fp16; the rest fall back through Casts (see the ratio to fp32)")
        except Exception as err:  # noqa: BLE001 - the benchmark reports every variant, runnable or not
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            v.make_runner, v.reason = None, f"{type(err).__name__}: {first[:200]}"
            log.info("variant %s unavailable: %s", name, v.reason)
        prepared.append(v)
    return prepared


def accuracy_feed(ctx: BenchContext, max_items: int = 4) -> dict[str, np.ndarray]:
    """Validation inputs for the variants' accuracy column (the report split: never used to fit or decide)."""
    feeds = ctx.subject.feeds("report")
    return {k: np.ascontiguousarray(v[:max_items]) for k, v in feeds[0].items()}
