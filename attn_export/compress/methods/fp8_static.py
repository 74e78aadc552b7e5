"""``Fp8Static``: FP8 E4M3 Q/DQ for TensorRT on GPUs with FP8 tensor cores (SM 8.9+), calibrated on the train split.

The route mirrors static int8 (``int8_static``): amax calibration on the train split, FP8 Q/DQ
on every projection GEMM (``compress/fp8.py``: per-tensor activations, per-channel weights,
softmax/LayerNorm/residual in float), then optionally the accuracy-driven fallback
(``mixed_precision``), judged with TensorRT's Q/DQ arithmetic on ONNX Runtime CPU (float8
Q/DQ is exact there: rounding and each FP8 product; the accumulation order is not). No latency
cost of the fallback is measured: ONNX Runtime CPU has no FP8 GEMM, so a CPU timing says
nothing about a GPU. Which GPUs may run it is data (``targets/gpu_arch.py``): ``RunConfig``
refuses ``--quantize fp8`` for an architecture without FP8 before any work.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from attn_export.compress.methods.int8_static import check_alpha
from attn_export.compress.registry import Method, PlanContext, Skip, Source, compose_key, register_method
from attn_export.errors import ConfigError

if TYPE_CHECKING:
    from attn_export.runtime.artifacts import Artifact
    from attn_export.vocab.run_options import RunOptions

__all__ = ["Fp8Static"]

log = logging.getLogger(__name__)

_NO_FP8_KERNELS = "FP8 Q/DQ runs on TensorRT (SM 8.9+); ONNX Runtime has no FP8 GEMM kernels"


@dataclass(frozen=True)
class Fp8Static(Method):
    """FP8 E4M3 Q/DQ, amax-calibrated on the train split; ``fallback`` as the static int8 route's.

    ``float_precision``: what a GEMM without Q/DQ runs in on the target (fp16: a TensorRT 10.x
    ``--fp8 --fp16`` build; fp32 for an fp32 graph built strongly typed on 11.x).
    """

    role: ClassVar[str] = "route"
    precision: ClassVar[str] = "fp8"
    route: ClassVar[str] = "static"
    description: ClassVar[str] = "Q/DQ, calibrated: TensorRT on sm89+"
    tolerance: ClassVar[str] = "fp8"
    produces: ClassVar[str] = "qdq-onnx"
    needs: ClassVar[tuple[str, ...]] = ("train", "select")
    stage: ClassVar[str] = "{prefix}-static"
    filename: ClassVar[str] = "model.{prefix}-static.onnx"
    unlisted_why: ClassVar[str] = _NO_FP8_KERNELS

    method: str = "minmax"
    per_channel: bool = True
    quantize_attention_bmm: bool = False
    smoothquant_alpha: float | str | None = None
    fallback: str | int = "none"
    sensitivity_items: int = 64
    float_precision: str = "fp16"

    def __post_init__(self) -> None:
        from attn_export.vocab.choices import CALIB_CHOICES

        if self.method not in CALIB_CHOICES:
            raise ConfigError(f"expected an FP8 calibration method in {'|'.join(CALIB_CHOICES)}, got {self.method!r}; use minmax")
        check_alpha(self.smoothquant_alpha)
        fb = self.fallback
        if not (fb in ("auto", "none") or (isinstance(fb, int) and not isinstance(fb, bool) and fb >= 0)):
            raise ConfigError(f"expected an FP8 fallback auto|none|N (N >= 0), got {fb!r}; use auto")
        if self.sensitivity_items < 1:
            raise ConfigError(f"expected sensitivity_items >= 1, got {self.sensitivity_items}")
        if self.float_precision not in ("fp16", "fp32"):
            raise ConfigError(f"expected float_precision fp16 or fp32, got {self.float_precision!r}")

    def fitted(self) -> str | None:
        return f"the FP8 {self.method} ranges on the train split"

    @classmethod
    def from_run(cls, run: RunOptions, ctx: PlanContext, parent: Method | None = None) -> Fp8Static | Skip | None:
        if not cls.requested(run, ctx):
            return None
        refusal = cls.deploy_refusal(ctx.target)
        if refusal:
            return Skip(f"fp8 route static skipped for target {ctx.target.name}: {refusal}")
        # amax (minmax) unless asked: FP8's 3-bit mantissa clips nothing worth clipping (docs/quantization.md);
        # SmoothQuant only when given (the FP8 bars are met without it on MiniLM and the default layer)
        method = run.calib_method or "minmax"
        trt11 = str(run.resolved_trt_version or "").split(".")[0] == "11"
        return cls(method=method, smoothquant_alpha=run.smoothquant if run.smoothquant not in (None, "none") else None,
                   quantize_attention_bmm=ctx.target.quantize_attention_bmm, fallback=run.int8_fallback,
                   float_precision="fp32" if trt11 else "fp16")  # fmt: skip

    def spec(self) -> Any:
        from attn_export.compress.quant.fp8 import Fp8Spec

        return Fp8Spec(method=self.method, per_channel=self.per_channel, quantize_attention_bmm=self.quantize_attention_bmm,
                       smoothquant_alpha=self.smoothquant_alpha)  # fmt: skip


@register_method(Fp8Static)
def fp8_static(source: Source, config: Fp8Static) -> Artifact:
    """The FP8 stage from the source's fp32 ONNX export."""
    from attn_export.compress.quant.fp8 import quantize_fp8_onnx
    from attn_export.compress.quant.mixed_precision import mixed_precision_
    from attn_export.compress.quant.qdq import inspect_qdq

    ctx, art = source.ctx, source.artifact
    if art.onnx_fp32 is None:
        raise ConfigError(f"{source.name}: FP8 starts from an fp32 ONNX export, and {art.name} has none")
    ctx.say(f"fp8 e4m3 Q/DQ: {config.method} amax, {'per-channel' if config.per_channel else 'per-tensor'} weights, "
            f"attention BMMs {'fp8' if config.quantize_attention_bmm else 'float'}, fallback {config.fallback}")  # fmt: skip
    path, key = source.path, compose_key(art.tolerance_key, config.tolerance)
    details: dict[str, Any] = {"route": "fp8-static"}
    with tempfile.TemporaryDirectory(prefix="attn_export_fp8s_") as tmp:
        all_fp8 = path if config.fallback == "none" else Path(tmp) / "all_fp8.onnx"
        float_graph = Path(tmp) / "float.onnx"
        result = quantize_fp8_onnx(art.onnx_fp32, all_fp8, source.subject.calibration(), config.spec(), float_model_out=float_graph)
        if config.fallback != "none":
            mp = mixed_precision_(all_fp8, float_graph, path, source.subject, key, source.subject.fallback_goal(key), config.fallback,
                                  config.float_precision, config.sensitivity_items, ctx.threads, None, ctx.say, quant_precision="fp8")  # fmt: skip
            details["mixed_precision"] = mp.to_dict()
    summary = inspect_qdq(path)
    quant = result.to_dict()
    quant.update(size_bytes=path.stat().st_size, n_quantize_linear=summary.n_quantize_linear, n_dequantize_linear=summary.n_dequantize_linear)
    details.update(quantization=quant, size_ratio_vs_fp32=path.stat().st_size / art.onnx_fp32.stat().st_size)
    return ctx.onnx_artifact(source.name, path, config.precision, key, qdq_reference=True, module=art.module, params=art.params, route="static",
                             details=details)  # fmt: skip
