"""``Int8WeightOnly``: int8 weights, float activations, for ONNX Runtime (``MatMulNBits``, 8 bits).

Weight-only int8 shrinks what the model stores and loads (every projection's weight to one
byte a value plus one fp32 scale per block of 128, about a quarter of the fp32 file) and
keeps the activations in float, so nothing is calibrated and nothing outside the weights is
rounded. ONNX Runtime's own quantizer writes it (``MatMulNBitsQuantizer(bits=8)``, symmetric
blocks along the reduction axis); its ``MatMulNBits`` kernel dequantizes the block and runs
the product in fp32 (``accuracy_level`` unset), so the arithmetic is the float model's with
rounded weights. It runs on ONNX Runtime's CPU and CUDA providers; TensorRT cannot parse the
contrib op. Whether it is *faster* depends on the machine (it saves memory traffic, not
arithmetic): the run times it beside eager and the other routes, like every stage.

Opt-in (``--int8-mode weight-only``): on the default CPU workloads the dynamic route is both
smaller than fp32 and faster, so ``auto`` keeps to the routes that usually win.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from attn_export.compress.registry import Method, PlanContext, Skip, Source, compose_key, register_method
from attn_export.errors import ConfigError

if TYPE_CHECKING:
    from attn_export.runtime.artifacts import Artifact
    from attn_export.vocab.run_options import RunOptions

__all__ = ["Int8WeightOnly"]

log = logging.getLogger(__name__)

_CANNOT_PARSE = "the weight-only int8 route writes ONNX Runtime's MatMulNBits contrib op, which TensorRT cannot parse"


@dataclass(frozen=True)
class Int8WeightOnly(Method):
    """int8 weights in blocks of ``block_size`` along K (one fp32 scale each), float activations."""

    role: ClassVar[str] = "route"
    precision: ClassVar[str] = "int8"
    route: ClassVar[str] = "weight-only"
    description: ClassVar[str] = "int8 weights in blocks of 128, float activations: ONNX Runtime's MatMulNBits, opt-in"
    tolerance: ClassVar[str] = "int8"
    produces: ClassVar[str] = "onnx"
    needs: ClassVar[tuple[str, ...]] = ()  # nothing is calibrated
    stage: ClassVar[str] = "{prefix}-weight-only"
    filename: ClassVar[str] = "model.{prefix}-weight-only.onnx"
    unlisted_why: ClassVar[str] = _CANNOT_PARSE

    block_size: int = 128

    def __post_init__(self) -> None:
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ConfigError(f"expected a weight-only block size that is a power of two >= 16 (MatMulNBits), got {self.block_size}")

    @classmethod
    def requested(cls, run: RunOptions, ctx: PlanContext) -> bool:
        return ctx.precision == cls.precision and run.int8_mode == cls.route  # opt-in: see the module docstring

    @classmethod
    def from_run(cls, run: RunOptions, ctx: PlanContext, parent: Method | None = None) -> Int8WeightOnly | Skip | None:
        if not cls.requested(run, ctx):
            return None
        refusal = cls.deploy_refusal(ctx.target)
        return Skip(f"int8 route weight-only skipped for target {ctx.target.name}: {refusal}") if refusal else cls()


@register_method(Int8WeightOnly)
def int8_weight_only(source: Source, config: Int8WeightOnly) -> Artifact:
    """The stage from the source's fp32 ONNX export, through ONNX Runtime's weight-only quantizer."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from attn_export.host.quiet import quiet_loggers
    from attn_export.compress.quant.onnx import save_model_atomic

    ctx, art = source.ctx, source.artifact
    if art.onnx_fp32 is None:
        raise ConfigError(f"{source.name}: weight-only int8 starts from an fp32 ONNX export, and {art.name} has none")
    ctx.say(f"int8 weight-only: ONNX Runtime MatMulNBits, 8 bits, symmetric blocks of {config.block_size}")
    with quiet_loggers(["onnxruntime.quantization.matmul_nbits_quantizer"], logging.WARNING):  # one INFO line per node
        quantizer = MatMulNBitsQuantizer(onnx.load(str(art.onnx_fp32)), bits=8, block_size=config.block_size, is_symmetric=True)
        quantizer.process()
    proto = quantizer.model.model
    save_model_atomic(proto, source.path)
    quantized = sum(n.op_type == "MatMulNBits" for n in proto.graph.node)
    if quantized == 0:
        raise ConfigError(f"{source.name}: the graph has no MatMul with a constant weight to quantize; use --int8-mode dynamic")
    size = source.path.stat().st_size
    details: dict[str, Any] = {"route": config.route, "quantization": {"op": "MatMulNBits", "bits": 8, "block_size": config.block_size,
                               "symmetric": True, "matmuls": quantized, "size_bytes": size},
                               "size_ratio_vs_fp32": size / art.onnx_fp32.stat().st_size}  # fmt: skip
    return ctx.onnx_artifact(source.name, source.path, config.precision, compose_key(art.tolerance_key, config.tolerance), module=art.module,
                             params=art.params, route=config.route, details=details)  # fmt: skip
