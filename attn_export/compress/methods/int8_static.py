"""``Int8Static``: static Q/DQ calibrated on the train split, TensorRT's int8 (symmetric, zero point 0)."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from attn_export.compress.registry import Method, PlanContext, Source, compose_key, register_method
from attn_export.errors import ConfigError

if TYPE_CHECKING:
    from attn_export.runtime.artifacts import Artifact
    from attn_export.vocab.run_options import RunOptions

__all__ = ["Int8Static", "check_alpha"]

log = logging.getLogger(__name__)


def check_alpha(alpha: object) -> None:
    """``--smoothquant``: a number in [0, 1], ``auto`` (searched per GEMM input) or None (off)."""
    if alpha is None or alpha == "auto":
        return
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= float(alpha) <= 1.0:
        raise ConfigError(f"expected --smoothquant ALPHA in [0, 1] or auto, got {alpha!r}; use auto")


def check_fallback(fallback: object, sensitivity_items: int) -> None:
    """``--int8-fallback``: ``auto``, ``none`` or N >= 0 GEMM groups; each sensitivity measurement reads >= 1 item."""
    if not (fallback in ("auto", "none") or (isinstance(fallback, int) and not isinstance(fallback, bool) and fallback >= 0)):
        raise ConfigError(f"expected --int8-fallback auto|none|N (N >= 0), got {fallback!r}; use auto")
    if sensitivity_items < 1:
        raise ConfigError(f"expected sensitivity_items >= 1, got {sensitivity_items}")


@dataclass(frozen=True)
class Int8Static(Method):
    """Static Q/DQ, calibrated on the train split: TensorRT's int8 (symmetric, zero point 0).

    ``for_tensorrt`` keeps full-range weights and judges the graph by its reference Q/DQ
    arithmetic; otherwise the weights use the CPU encoding (``reduce_range``) and the graph is
    judged on ONNX Runtime's int8 kernels, as a CPU deployment runs it.

    ``method``: a global calibration method or ``per-tensor``; ``smoothquant_alpha``: a number,
    ``"auto"`` (searched per activation, applied where it helps) or None. ``fallback``:
    ``"auto"`` keeps the most sensitive GEMM groups in float until the goal is met on the
    select split, N keeps exactly N, ``"none"`` quantizes every GEMM
    (``compress/mixed_precision.py``); ``sensitivity_items`` caps the select-split items each
    sensitivity measurement uses.
    """

    role: ClassVar[str] = "route"
    precision: ClassVar[str] = "int8"
    route: ClassVar[str] = "static"
    description: ClassVar[str] = "Q/DQ, calibrated: the TensorRT route"
    tolerance: ClassVar[str] = "int8"
    produces: ClassVar[str] = "qdq-onnx"
    needs: ClassVar[tuple[str, ...]] = ("train", "select")
    stage: ClassVar[str] = "{prefix}-static"
    filename: ClassVar[str] = "model.{prefix}-static.onnx"

    method: str = "minmax"
    smoothquant_alpha: float | str | None = None
    per_channel: bool = True
    quantize_attention_bmm: bool = False
    reduce_range: bool = False
    for_tensorrt: bool = False
    session_u8u8: bool = False  # validate (and deploy) with session.x64quantprecision=1
    fallback: str | int = "none"
    sensitivity_items: int = 64

    def __post_init__(self) -> None:
        from attn_export.vocab.choices import CALIB_CHOICES

        if self.method not in CALIB_CHOICES:
            raise ConfigError(f"expected --calib-method in {'|'.join(CALIB_CHOICES)}, got {self.method!r}")
        if self.for_tensorrt and self.reduce_range:
            raise ConfigError("TensorRT's Q/DQ keeps full-range int8 weights; reduce-range is for ONNX Runtime CPU")
        check_alpha(self.smoothquant_alpha)
        check_fallback(self.fallback, self.sensitivity_items)

    def fitted(self) -> str | None:
        sq = {None: "", "auto": " and SmoothQuant scales searched"}.get(self.smoothquant_alpha, " and SmoothQuant scales")  # type: ignore[arg-type]
        return f"the {self.method} calibration ranges{sq} on the train split"

    @property
    def float_precision(self) -> str:
        """What a GEMM without Q/DQ runs in: fp16 on TensorRT (weakly typed INT8+FP16 build), fp32 elsewhere."""
        return "fp16" if self.for_tensorrt else "fp32"

    @classmethod
    def from_run(cls, run: RunOptions, ctx: PlanContext, parent: Method | None = None) -> Int8Static | None:
        if not cls.requested(run, ctx):
            return None
        trt, enc = ctx.target.explicit_quantization, ctx.encoding  # explicit Q/DQ: no CPU int8 encoding applies
        return cls(method=run.resolved_calib_method, smoothquant_alpha=run.resolved_smoothquant, quantize_attention_bmm=ctx.target.quantize_attention_bmm,
                   reduce_range=bool(enc.reduce_range) and not trt, for_tensorrt=trt, session_u8u8=bool(enc.session_u8u8) and not trt,
                   fallback=run.int8_fallback)  # fmt: skip


@register_method(Int8Static)
def int8_static(source: Source, config: Int8Static) -> Artifact:
    from attn_export.compress.quant.mixed_precision import mixed_precision_
    from attn_export.compress.quant.qdq import inspect_qdq
    from attn_export.compress.quant.static import StaticQuantSpec, quantize_static_onnx

    ctx, art = source.ctx, source.artifact
    if art.onnx_fp32 is None:
        raise ConfigError(f"{source.name}: static int8 starts from an fp32 ONNX export, and {art.name} has none")
    spec = StaticQuantSpec(method=config.method, smoothquant_alpha=config.smoothquant_alpha, per_channel=config.per_channel,
                           quantize_attention_bmm=config.quantize_attention_bmm, reduce_range=config.reduce_range,
                           float_precision=config.float_precision)  # fmt: skip
    weights = "full-range (TensorRT)" if config.for_tensorrt else ("7-bit reduce-range" if config.reduce_range else "full-range")
    sq = "" if config.smoothquant_alpha is None else f", SmoothQuant {config.smoothquant_alpha}"
    ctx.say(f"int8 static Q/DQ: {config.method} calibration{sq}, {weights} weights, fallback {config.fallback}")
    path, key = source.path, compose_key(art.tolerance_key, config.tolerance)
    details: dict[str, Any] = {"route": "static"}
    with tempfile.TemporaryDirectory(prefix="attn_export_q8s_") as tmp:
        all_int8 = path if config.fallback == "none" else Path(tmp) / "all_int8.onnx"
        float_graph = Path(tmp) / "float.onnx"
        result = quantize_static_onnx(art.onnx_fp32, all_int8, source.subject.calibration(), spec, float_model_out=float_graph)
        if config.fallback != "none":
            # the cost is a speed figure: int8 kernels (QDQ fusion on) against the float GEMMs, whatever judges accuracy
            timing = {"feed": source.subject.latency_feed(), "qdq_fusion": True, "u8u8": config.session_u8u8}
            mp = mixed_precision_(all_int8, float_graph, path, source.subject, key, source.subject.fallback_goal(key), config.fallback,
                                  config.float_precision, config.sensitivity_items, ctx.threads, timing, ctx.say)  # fmt: skip
            details["mixed_precision"] = mp.to_dict()
    summary = inspect_qdq(path)
    quant = result.to_dict()
    quant.update(size_bytes=path.stat().st_size, n_quantize_linear=summary.n_quantize_linear, n_dequantize_linear=summary.n_dequantize_linear)
    details.update(quantization=quant, size_ratio_vs_fp32=path.stat().st_size / art.onnx_fp32.stat().st_size)
    return ctx.onnx_artifact(source.name, path, config.precision, key, qdq_reference=config.for_tensorrt, u8u8=config.session_u8u8,
                             module=art.module, params=art.params, route=config.route, details=details)  # fmt: skip
