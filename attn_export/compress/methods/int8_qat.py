"""``Int8Qat``: QAT-lite, fake-quant fine-tuning of a static int8 stage, then Q/DQ with the trained ranges."""

from __future__ import annotations

import copy
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from attn_export.compress.methods.int8_static import Int8Static
from attn_export.compress.registry import Method, PlanContext, Source, register_method
from attn_export.errors import ConfigError

if TYPE_CHECKING:
    from attn_export.runtime.artifacts import Artifact
    from attn_export.vocab.run_options import RunOptions

__all__ = ["Int8Qat"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Int8Qat(Method):
    """int8 recovery by distillation (QAT-lite) of a static int8 stage: fake-quant fine-tuning, then Q/DQ.

    Starts from the static stage it refines (its float module and the GEMM groups it keeps in
    float), trains for up to ``steps`` steps against the fp32 teacher on the train split
    (early stopping on the select split), and writes a Q/DQ graph with the trained weights
    and ranges (``learn_scales``) or the calibrated ones (frozen). ``static`` is the config
    of that stage (calibration method, target, CPU encoding).
    """

    role: ClassVar[str] = "refine"
    precision: ClassVar[str] = "int8"
    route: ClassVar[str] = "static"
    tolerance: ClassVar[str] = "int8"
    produces: ClassVar[str] = "qdq-onnx"
    needs: ClassVar[tuple[str, ...]] = ("train", "select")
    stage: ClassVar[str] = "{prefix}-static+qat"
    filename: ClassVar[str] = "model.{prefix}-static-qat.onnx"
    refines: ClassVar[type[Method] | None] = Int8Static

    steps: int = 200
    learn_scales: bool = True
    static: Int8Static = field(default_factory=Int8Static)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"expected --int8-qat STEPS >= 1, got {self.steps}")

    def fitted(self) -> str | None:
        return "the fake-quant fine-tuned weights and ranges, trained on the train split"

    @classmethod
    def from_run(cls, run: RunOptions, ctx: PlanContext, parent: Method | None = None) -> Int8Qat | None:
        if run.int8_qat is None or not isinstance(parent, Int8Static):
            return None
        return cls(steps=int(run.int8_qat), learn_scales=run.int8_qat_scales == "learned", static=parent)


@register_method(Int8Qat)
def int8_qat(source: Source, config: Int8Qat) -> Artifact:
    import onnx_ir as ir

    from attn_export.compress.quant.gemm_groups import apply_fallback
    from attn_export.compress.qat import QatConfig, qat_
    from attn_export.compress.quant.qdq import inspect_qdq
    from attn_export.compress.quant.static import StaticQuantSpec, quantize_static_onnx

    ctx, art = source.ctx, source.artifact
    if art.route != "static" or art.module is None:
        raise ConfigError(f"{source.name}: QAT-lite refines a static int8 stage, and {art.name} is not one")
    static = config.static
    float_groups = list((art.details.get("mixed_precision") or {}).get("float_groups") or [])
    ctx.say(f"int8 QAT-lite: up to {config.steps} steps through fake int8 ({'learned' if config.learn_scales else 'frozen'} ranges), "
            f"{len(float_groups)} GEMM group(s) kept float as in {art.name}")  # fmt: skip
    student = copy.deepcopy(art.module)
    qat_config = QatConfig(steps=config.steps, learn_scales=config.learn_scales, method=static.method, smoothquant=static.smoothquant_alpha is not None)
    summary = qat_(student, art.module, source.subject, set(float_groups), qat_config)
    ctx.say(summary.describe())
    by_label, smoothing = dict(summary.thresholds), dict(summary.scales)
    for path in list(summary.thresholds):  # the export fuses plain Q/K/V into one w_qkv GEMM reading the same input
        if path.endswith(".w_q"):
            fused = path[: -len("w_q")] + "w_qkv"
            by_label[fused] = summary.thresholds[path]
            if path in summary.scales:
                smoothing[fused] = summary.scales[path]
    spec = StaticQuantSpec(method=static.method, smoothquant_alpha=None, per_channel=static.per_channel,
                           quantize_attention_bmm=static.quantize_attention_bmm, reduce_range=static.reduce_range)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="attn_export_qat_") as tmp:
        fp32 = Path(tmp) / "student.onnx"
        source.subject.export(student, fp32, ctx.fp32_spec)
        all_int8, float_graph = Path(tmp) / "all_int8.onnx", Path(tmp) / "float.onnx"
        result = quantize_static_onnx(fp32, all_int8, source.subject.calibration(), spec, float_model_out=float_graph,
                                      range_overrides=by_label, smoothing=smoothing or None)  # fmt: skip
        moved = apply_fallback(all_int8, ir.load(str(float_graph)), float_groups, source.path)
    qdq = inspect_qdq(source.path)
    quant = result.to_dict()
    quant.update(size_bytes=source.path.stat().st_size, n_quantize_linear=qdq.n_quantize_linear, n_dequantize_linear=qdq.n_dequantize_linear)
    details: dict[str, Any] = {"route": "static", "qat": {k: v for k, v in summary.to_dict().items() if k != "thresholds"},
                               "quantization": quant, "refines": art.name, "gemms_in_float": moved}  # fmt: skip
    return ctx.onnx_artifact(source.name, source.path, config.precision, art.tolerance_key, qdq_reference=static.for_tensorrt,
                             u8u8=static.session_u8u8, module=student, params=art.params, route=config.route, details=details)  # fmt: skip
