"""``Int8Dynamic``: ONNX Runtime CPU's dynamic int8 (int8 weights offline, uint8 activations per batch), and
``Int8PerToken``: the same with one activation range per row (token), so a text's numbers never depend on its batch."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from attn_export.compress.methods.int8_static import check_alpha, check_fallback
from attn_export.compress.registry import BuildContext, Method, PlanContext, Skip, Source, compose_key, register_method

if TYPE_CHECKING:
    from attn_export.runtime.artifacts import Artifact
    from attn_export.vocab.run_options import RunOptions

__all__ = ["Int8Dynamic", "Int8PerToken"]

log = logging.getLogger(__name__)

_CANNOT_PARSE = "the dynamic int8 route emits DynamicQuantizeLinear/MatMulInteger, which TensorRT cannot parse"


@dataclass(frozen=True)
class Int8Dynamic(Method):
    """ONNX Runtime CPU's dynamic int8: int8 weights offline, uint8 activations per batch at run time.

    ``smoothquant_alpha``: a number, ``"auto"`` (searched per activation for the dynamic
    quantizer) or None. ``quantize_embeddings``: int8 embedding tables, one scale per row
    (their own accuracy cost is measured on the select split and reported). ``fuse``: the
    ONNX Runtime CPU fusions that measured faster (BiasGelu; not SkipLayerNorm). ``fallback``:
    ``"auto"`` judges the all-int8 model on the select split and, when it misses the subject's
    8-bit goal, keeps the most sensitive GEMM groups in float until it is met; N keeps exactly
    N; ``"none"`` quantizes every weight MatMul (``mixed_precision.dynamic_fallback``).
    """

    role: ClassVar[str] = "route"
    precision: ClassVar[str] = "int8"
    route: ClassVar[str] = "dynamic"
    description: ClassVar[str] = "ONNX Runtime CPU; TensorRT cannot parse it"
    tolerance: ClassVar[str] = "int8"
    produces: ClassVar[str] = "onnx"
    needs: ClassVar[tuple[str, ...]] = ()  # ("train",) with SmoothQuant: from_run says so in the report
    stage: ClassVar[str] = "{prefix}-dynamic"
    filename: ClassVar[str] = "model.{prefix}-dynamic.onnx"
    unlisted_why: ClassVar[str] = _CANNOT_PARSE

    per_channel: bool = True
    reduce_range: bool = False
    session_u8u8: bool = False  # validate (and deploy) with session.x64quantprecision=1
    smoothquant_alpha: float | str | None = None
    quantize_embeddings: bool = False
    fuse: bool = False  # ONNX Runtime CPU fusions that measured faster (quant_onnx.fuse_for_ort_cpu)
    fallback: str | int = "none"
    sensitivity_items: int = 64

    def __post_init__(self) -> None:
        check_alpha(self.smoothquant_alpha)
        check_fallback(self.fallback, self.sensitivity_items)

    @classmethod
    def requested(cls, run: RunOptions, ctx: PlanContext) -> bool:
        # opt-in (--int8-mode dynamic): one activation range per batch moves a text's embedding with its batch
        # mates (MiniLM: min cosine 0.9968 alone vs in a batch), below the batch-invariance bar a shipped route meets
        return ctx.precision == cls.precision and run.int8_mode == cls.route

    def fitted(self) -> str | None:
        if self.smoothquant_alpha is None:
            return None  # ranges are taken per batch at run time: nothing is fitted
        return f"SmoothQuant scales {'searched' if self.smoothquant_alpha == 'auto' else 'measured'} on the train split"

    @classmethod
    def from_run(cls, run: RunOptions, ctx: PlanContext, parent: Method | None = None) -> Int8Dynamic | Skip | None:
        if not cls.requested(run, ctx):
            return None
        if cls.deploy_refusal(ctx.target):  # an explicit --int8-mode dynamic is refused by RunConfig; under auto it is
            # left out, and the note says so without asking for what the run already builds (issue 23)
            return Skip(f"int8 route {cls.route} not built for target {ctx.target.name}: {cls.unlisted_why}; the target's route policy "
                        f"builds {', '.join(ctx.target.routes(cls.precision))} for it instead")  # fmt: skip
        enc, profile = ctx.encoding, ctx.profile
        # int8 embedding rows and ORT's BiasGelu: measured on MiniLM (docs/quantization.md); a graph without
        # embedding tables or GELU has nothing for them to change
        return cls(per_channel=True, reduce_range=bool(enc.reduce_range), session_u8u8=bool(enc.session_u8u8), smoothquant_alpha=run.resolved_smoothquant,
                   quantize_embeddings=profile.has_embeddings, fuse=profile.activation.startswith("gelu"), fallback=run.int8_fallback)  # fmt: skip


@dataclass(frozen=True)
class Int8PerToken(Int8Dynamic):
    """The dynamic route with one int8 activation range per row (``compress.quant.per_token``): batch-invariant.

    A text gets the same numbers alone and in any batch, and an outlier token no longer costs the
    others their precision (MiniLM, held-out texts: mean embedding cosine 0.9973 vs the dynamic
    route's 0.9939, the same alone and in batches of 32). Built by ``--int8-mode auto`` in place of the
    dynamic route, which is opt-in; every setting of the dynamic route applies.
    """

    route: ClassVar[str] = "per-token"
    description: ClassVar[str] = "ONNX Runtime CPU, one activation range per token: the same answer in any batch"
    stage: ClassVar[str] = "{prefix}-per-token"
    filename: ClassVar[str] = "model.{prefix}-per-token.onnx"
    unlisted_why: ClassVar[str] = "the per-token int8 route emits com.microsoft.MatMulIntegerToFloat, which only ONNX Runtime runs"

    @classmethod
    def requested(cls, run: RunOptions, ctx: PlanContext) -> bool:
        return ctx.precision == cls.precision and run.int8_mode in ("auto", cls.route)


@register_method(Int8Dynamic)
def int8_dynamic(source: Source, config: Int8Dynamic) -> Artifact:
    """Quantizes the graph with unfused Q/K/V: ONNX Runtime CPU runs three DynamicQuantizeMatMuls faster than
    one fused QKV GEMM followed by the Split that copies its output (default layer: 20.4 vs 22.0 ms;
    MiniLM: 3-6% less CPU time per batch). The unfused graph is the source's fp32 graph with its QKV
    split by a graph pass (``_unfused_source``), not a second export."""
    return _build(source, config, per_token=False)


@register_method(Int8PerToken)
def int8_per_token(source: Source, config: Int8PerToken) -> Artifact:
    """The dynamic route's model, rewritten to per-row activation ranges before its fallback judges it."""
    return _build(source, config, per_token=True)


def _build(source: Source, config: Int8Dynamic, per_token: bool) -> Artifact:
    from attn_export.compress.quant.mixed_precision import dynamic_fallback
    from attn_export.compress.quant.onnx import quantize_dynamic_onnx
    from attn_export.runtime.artifacts import ort_runner_factory

    ctx, art = source.ctx, source.artifact
    extras = [w for w, on in (("SmoothQuant " + str(config.smoothquant_alpha), config.smoothquant_alpha is not None),
                              ("int8 embedding rows", config.quantize_embeddings), ("ORT CPU fusions", config.fuse)) if on]  # fmt: skip
    ctx.say(f"int8 {config.route}: ONNX Runtime quantize_dynamic ({'per-channel' if config.per_channel else 'per-tensor'}, "
            f"{'7-bit reduce-range' if config.reduce_range else 'full-range'} weights{', ' + ', '.join(extras) if extras else ''})")  # fmt: skip
    key = compose_key(art.tolerance_key, config.tolerance)
    details: dict[str, Any] = {"route": config.route}
    with tempfile.TemporaryDirectory(prefix="attn_export_dyn_") as tmp:
        unfused, float_tables = Path(tmp) / "unfused.onnx", Path(tmp) / "float_tables.onnx"
        if not _unfused_source(art.onnx_fp32, ctx.fp32_spec, unfused):
            # ONNX Runtime's dynamic quantizer quantizes MatMul, not the Gemm the long-seq form writes for Linears
            source.subject.export(art.module, unfused, replace(ctx.fp32_spec, fuse_qkv=False, precision="fp32", linear_gemm=False))
        calib = source.subject.calibration() if config.smoothquant_alpha is not None else None
        fallback: list[Any] = []

        def keep_float(float_graph: Path, all_int8: Path) -> list[str]:
            nodes, mp = dynamic_fallback(float_graph, all_int8, source.subject, key, source.subject.fallback_goal(key), config.fallback,
                                         config.sensitivity_items, ctx.threads, runner_for, ctx.say, per_token)  # fmt: skip
            fallback.append(mp)
            return nodes

        def runner_for(path: Path) -> Any:
            return ort_runner_factory(path, ctx.runtime(u8u8=config.session_u8u8), ctx.threads, f"int8-{config.route}-select")()

        result = quantize_dynamic_onnx(unfused, source.path, per_channel=config.per_channel, reduce_range=config.reduce_range,
                                       smoothquant_alpha=config.smoothquant_alpha, calib=calib, quantize_embeddings=config.quantize_embeddings,
                                       fuse=config.fuse, unquantized_embeddings_out=float_tables,
                                       keep_float=None if config.fallback == "none" else keep_float, per_token=per_token)  # fmt: skip
        if fallback:
            details["mixed_precision"] = fallback[0].to_dict()
        if result.embeddings.get("tables"):
            details["embedding_quantization"] = _table_cost(ctx, source.path, float_tables, config.session_u8u8)
    details["quantization"] = result.to_dict()
    if art.onnx_fp32 is not None:
        details["size_ratio_vs_fp32"] = result.size_bytes / art.onnx_fp32.stat().st_size
    return ctx.onnx_artifact(source.name, source.path, config.precision, key, u8u8=config.session_u8u8, module=art.module, params=art.params,
                             route=config.route, details=details)  # fmt: skip


def _unfused_source(fp32: Path | None, spec: Any, out: Path) -> bool:
    """The source's fp32 graph with its fused QKV split in three (``export.passes.unfuse_qkv``) written to ``out``: what an
    export with ``fuse_qkv=False`` writes, without a second torch export. False (export again) when the source has no fp32
    graph, writes Linears as Gemm (``linear_gemm``), or keeps a fused QKV the pass does not match."""
    import onnx_ir as ir

    from attn_export.export.passes.unfuse_qkv import fused_qkv_left, unfuse_qkv

    if fp32 is None or spec is None or spec.resolved_linear_gemm:
        return False
    model = ir.load(fp32)
    unfuse_qkv(model)
    if fused_qkv_left(model):
        return False
    ir.save(model, out)
    return True


def _table_cost(ctx: BuildContext, with_int8: Path, with_float: Path, u8u8: bool) -> dict[str, Any]:
    """The int8 embedding tables' own accuracy cost: the same model with float tables, both on the whole select split."""
    from attn_export.runtime.artifacts import ort_runner_factory

    choice = ctx.runtime(u8u8=u8u8)
    errors = {}
    for label, p in (("float_tables", with_float), ("int8_tables", with_int8)):
        runner = ort_runner_factory(p, choice, ctx.threads, label)()
        try:
            errors[label] = float(ctx.subject.select_error(runner, 1 << 30))
        finally:
            runner.deactivate()
    cost = errors["int8_tables"] - errors["float_tables"]
    ctx.say(f"int8 embedding tables: select-split error {errors['float_tables']:.2e} -> {errors['int8_tables']:.2e} ({cost:+.2e})")
    return {"select_error_float_tables": errors["float_tables"], "select_error_int8_tables": errors["int8_tables"], "cost": cost,
            "error": ctx.subject.select_error_name}  # fmt: skip
