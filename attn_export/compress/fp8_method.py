"""``Fp8Static``: the FP8 route as a compression-registry method (config + one function + the registry line).

Importing this module registers the method (``registry.register_method``), the way a method
in its own module registers itself. The stage mirrors static int8 (``registry._int8_static``):
calibrate on the train split, FP8 Q/DQ on every projection GEMM (``compress/fp8.py``), then
optionally the accuracy-driven fallback (``mixed_precision``: sensitivity per GEMM group,
float groups until the goal is met on the select split), judged with TensorRT's Q/DQ
arithmetic on ONNX Runtime CPU. No latency cost of the fallback is measured: ONNX Runtime
CPU has no FP8 GEMM, so a CPU timing of FP8 against float GEMMs says nothing about a GPU.

Where FP8 may run is not this module's decision: ``export/gpu_arch.require_precision`` refuses
it for a GPU without FP8 before any work.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from attn_export.artifacts import Artifact
from attn_export.compress.mixed_precision import FallbackGoal
from attn_export.compress.quant_static import STATIC_CALIB_CHOICES
from attn_export.compress.registry import BuildContext, register_method
from attn_export.errors import ConfigError

__all__ = ["FP8_EMBEDDING_GOAL", "Fp8Static", "fp8_static"]

log = logging.getLogger(__name__)

# Issue 22's bar for an encoder's FP8 route on unseen text (mean >= 0.995, min >= 0.985), with issue 11's top-1.
FP8_EMBEDDING_GOAL = FallbackGoal(min_mean_cosine=0.995, min_min_cosine=0.985, min_top1=0.95)


@dataclass(frozen=True)
class Fp8Static:
    """FP8 E4M3 Q/DQ for TensorRT on SM 8.9+, calibrated (amax) on the train split.

    ``fallback``: ``"none"``, ``"auto"`` (float GEMM groups, most sensitive first, until the
    goal is met on the select split) or N groups. ``float_precision``: what a GEMM without
    Q/DQ runs in on the target (fp16: a TensorRT 10.x ``--fp16 --fp8`` build or an fp16-cast
    graph on 11.x; fp32 for an fp32 graph built strongly typed).
    """

    precision: ClassVar[str] = "fp8"
    produces: ClassVar[str] = "qdq-onnx"
    needs: ClassVar[tuple[str, ...]] = ("calibration",)

    method: str = "minmax"
    per_channel: bool = True
    quantize_attention_bmm: bool = False
    smoothquant_alpha: float | str | None = None
    fallback: str | int = "none"
    sensitivity_items: int = 64
    float_precision: str = "fp16"

    def __post_init__(self) -> None:
        if self.method not in STATIC_CALIB_CHOICES:
            raise ConfigError(f"expected an FP8 calibration method in {'|'.join(STATIC_CALIB_CHOICES)}, got {self.method!r}; use minmax")
        fb = self.fallback
        if not (fb in ("auto", "none") or (isinstance(fb, int) and not isinstance(fb, bool) and fb >= 0)):
            raise ConfigError(f"expected an FP8 fallback auto|none|N (N >= 0), got {fb!r}; use auto")
        if self.sensitivity_items < 1:
            raise ConfigError(f"expected sensitivity_items >= 1, got {self.sensitivity_items}")
        if self.float_precision not in ("fp16", "fp32"):
            raise ConfigError(f"expected float_precision fp16 or fp32, got {self.float_precision!r}")

    def spec(self) -> Any:
        from attn_export.compress.fp8 import Fp8Spec

        return Fp8Spec(method=self.method, per_channel=self.per_channel, quantize_attention_bmm=self.quantize_attention_bmm,
                       smoothquant_alpha=self.smoothquant_alpha)  # fmt: skip


def _tolerance_key(source: Artifact) -> str:
    # until validate/tolerances.py has an "fp8" key, FP8 is held to the int8 bar (cosine >= 0.999 for a layer)
    return "lowrank-int8" if source.tolerance_key in ("lowrank", "lowrank-int8") else "int8"


@register_method(Fp8Static)
def fp8_static(config: Fp8Static, ctx: BuildContext, source: Artifact, name: str, filename: str) -> Artifact:
    """Build the FP8 stage ``name`` from ``source``'s fp32 ONNX export."""
    from attn_export.compress.fp8 import quantize_fp8_onnx
    from attn_export.compress.mixed_precision import mixed_precision_
    from attn_export.compress.qdq import inspect_qdq

    if source.onnx_fp32 is None:
        raise ConfigError(f"{name}: FP8 starts from an fp32 ONNX export, and {source.name} has none")
    ctx.say(f"fp8 e4m3 Q/DQ: {config.method} amax, {'per-channel' if config.per_channel else 'per-tensor'} weights, "
            f"attention BMMs {'fp8' if config.quantize_attention_bmm else 'float'}, fallback {config.fallback}")  # fmt: skip
    path = ctx.out / filename
    key = _tolerance_key(source)
    details: dict[str, Any] = {"route": "fp8"}
    with tempfile.TemporaryDirectory(prefix="attn_export_fp8s_") as tmp:
        all_fp8 = path if config.fallback == "none" else Path(tmp) / "all_fp8.onnx"
        float_graph = Path(tmp) / "float.onnx"
        result = quantize_fp8_onnx(source.onnx_fp32, all_fp8, ctx.subject.calibration(), config.spec(), float_model_out=float_graph)
        if config.fallback != "none":
            goal = FP8_EMBEDDING_GOAL if ctx.subject.kind == "encoder" and key == "int8" else FallbackGoal()
            mp = mixed_precision_(all_fp8, float_graph, path, ctx.subject, key, goal, config.fallback, config.float_precision,
                                  config.sensitivity_items, ctx.threads, None, ctx.say, quant_precision="fp8")  # fmt: skip
            details["mixed_precision"] = mp.to_dict()
    summary = inspect_qdq(path)
    quant = result.to_dict()
    quant.update(size_bytes=path.stat().st_size, n_quantize_linear=summary.n_quantize_linear, n_dequantize_linear=summary.n_dequantize_linear)
    details.update(quantization=quant, size_ratio_vs_fp32=path.stat().st_size / source.onnx_fp32.stat().st_size)
    return ctx.onnx_artifact(name, path, "fp8", key, qdq_reference=True, module=source.module, params=source.params, route="fp8", details=details)
