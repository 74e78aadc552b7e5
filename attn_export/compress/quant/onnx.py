"""int8 ONNX models: what every route shares, and the dynamic route for ONNX Runtime CPU.

Two ONNX routes exist because the two runtimes want different graphs. TensorRT needs static,
symmetric Q/DQ (``quant_static.quantize_static_onnx``). ONNX Runtime on x86 CPUs runs fastest
with *dynamic* quantization: weights are int8 offline, activations are quantized per batch
to uint8 at run time (``DynamicQuantizeLinear`` -> ``MatMulInteger``, which ORT fuses into
one u8s8 VNNI kernel). TensorRT cannot parse ``DynamicQuantizeLinear``, so the dynamic model
is for ONNX Runtime only; the TensorRT targets' route policy (``Target.route_preference``) leaves it out.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
import onnx_ir as ir

from attn_export.outdir.atomic import atomic_path
from attn_export.host.quiet import quiet_loggers
from attn_export.compress.quant.qdq import QdqSummary, attention_bmms, inspect_qdq
from attn_export.errors import ConfigError, DataError, ExportError

__all__ = [
    "STATIC_ON_CPU",
    "ActivationLike",
    "QuantResult",
    "calibration_feeds",
    "calibration_reader",
    "fuse_for_ort_cpu",
    "preprocess_for_quantization",
    "quantize_dynamic_onnx",
    "save_model_atomic",
]

log = logging.getLogger(__name__)

STATIC_ON_CPU = (
    "the static Q/DQ model is laid out for TensorRT (signed int8, Q/DQ only on GEMM inputs); ONNX Runtime "
    "CPU runs it 5-10% slower than the dynamic route, which needs no calibration"
)


class ActivationLike(Protocol):
    """What the quantizers read from calibration data (``attn_export.compress.ActivationSet``)."""

    x: np.ndarray  # (N, L, D) float32
    key_padding_mask: np.ndarray | None  # (N, L) int32, 1 = keep


@dataclass
class QuantResult:
    """What an int8 ONNX route wrote, for the report and for humans."""

    path: str
    size_bytes: int
    route: str  # "static" | "dynamic" | "per-token"
    n_quantize_linear: int
    n_dequantize_linear: int
    per_channel: bool
    notes: list[str] = field(default_factory=list)
    fp32_size_bytes: int = 0
    n_dynamic_quantize_linear: int = 0
    reduce_range: bool = False
    calib_method: str | None = None
    calib_samples: int = 0
    qdq: QdqSummary | None = None
    calibration: dict[str, Any] = field(default_factory=dict)  # per-tensor range choices (static, --calib-method per-tensor)
    smoothquant: dict[str, Any] = field(default_factory=dict)  # per-activation alpha search (--smoothquant auto)
    embeddings: dict[str, Any] = field(default_factory=dict)  # quantized embedding tables (dynamic)
    fusions: dict[str, int] = field(default_factory=dict)  # ONNX Runtime fused kernels written into the graph (dynamic)
    per_token: dict[str, Any] = field(default_factory=dict)  # the per-token rewrite (per_token.PerTokenSummary), when made

    @property
    def size_ratio(self) -> float:
        """int8 file size over the fp32 file size (0 when unknown)."""
        return self.size_bytes / self.fp32_size_bytes if self.fp32_size_bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("qdq", None)
        d["size_ratio"] = self.size_ratio
        return d

    def describe(self) -> str:
        how = f"{self.calib_method} calibration on {self.calib_samples} sequences, " if self.route == "static" else ""
        return (
            f"int8 {self.route}: {how}{self.n_quantize_linear} Q / {self.n_dequantize_linear} DQ / "
            f"{self.n_dynamic_quantize_linear} DynamicQ, weights {'per channel' if self.per_channel else 'per tensor'}, "
            f"{self.size_bytes} bytes ({100 * self.size_ratio:.1f}% of fp32)"
        )


def _onnx_input_types(model_path: str | os.PathLike[str]) -> list[tuple[str, np.dtype, int | None]]:
    """(name, dtype, static last dimension or None) of every graph input that is not an initializer."""
    proto = onnx.load(os.fspath(model_path), load_external_data=False)
    inits = {i.name for i in proto.graph.initializer}
    out = []
    for i in proto.graph.input:
        if i.name in inits:
            continue
        dims = i.type.tensor_type.shape.dim
        last = dims[-1].dim_value if dims and dims[-1].HasField("dim_value") else None
        out.append((i.name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)), last))
    return out


def _cast_feeds(model_path: str | os.PathLike[str], feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Cast ready-made feeds to the graph's input dtypes; every input must be present."""
    inputs = _onnx_input_types(model_path)
    out = []
    for feed in feeds:
        missing = [name for name, _, _ in inputs if name not in feed]
        if missing:
            raise DataError(f"calibration feed lacks inputs {missing}; the model takes {[i[0] for i in inputs]}")
        out.append({name: np.ascontiguousarray(np.asarray(feed[name]).astype(dt, copy=False)) for name, dt, _ in inputs})
    if not out:
        raise DataError("expected at least one calibration feed, got none")
    return out


def calibration_feeds(
    model_path: str | os.PathLike[str], acts: ActivationLike, max_samples: int = 64, batch_size: int = 8
) -> list[dict[str, np.ndarray]]:
    """Feed dicts for ``model_path`` built from ``acts``: the first input gets x, a second the mask.

    The mask defaults to all-ones when the model takes one and ``acts`` has none; the
    feeds are cast to the dtypes the graph declares.
    """
    if isinstance(acts, list):  # ready-made feed dicts (e.g. token ids for a whole encoder)
        return _cast_feeds(model_path, acts[:max_samples])
    inputs = _onnx_input_types(model_path)
    if not inputs or len(inputs) > 2:
        raise ConfigError(f"expected a model with inputs (x[, key_padding_mask]), got {[i[0] for i in inputs]}")
    x = np.asarray(acts.x)
    if x.ndim != 3 or x.shape[0] == 0:
        raise DataError(f"expected calibration activations (N, L, D) with N >= 1, got shape {x.shape}")
    d_model = inputs[0][2]
    if d_model is not None and x.shape[-1] != d_model:
        raise DataError(f"calibration activations have feature size {x.shape[-1]}, the model takes {d_model}; use a set made for this layer")
    n = min(len(x), max_samples)
    kpm = acts.key_padding_mask
    if kpm is None:
        kpm = np.ones(x.shape[:2], dtype=np.int32)
    feeds = []
    for start in range(0, n, batch_size):
        stop = min(n, start + batch_size)
        arrays = [x[start:stop], kpm[start:stop]]
        feeds.append({name: np.ascontiguousarray(a.astype(dt, copy=False)) for (name, dt, _), a in zip(inputs, arrays)})
    return feeds


class _FeedReader:
    """``onnxruntime.quantization.CalibrationDataReader`` over prepared feed dicts (duck-typed)."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._feeds = feeds
        self._it: Iterator[dict[str, np.ndarray]] = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def __len__(self) -> int:
        return len(self._feeds)


def calibration_reader(feeds: list[dict[str, np.ndarray]]) -> Any:
    """Wrap feed dicts as an ORT ``CalibrationDataReader`` subclass instance."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(_FeedReader, CalibrationDataReader):
        pass

    return Reader(feeds)


def _check_fp32_model(src: Path) -> None:
    """Quantization starts from fp32: refuse float16 float inputs, or (for token-id models) fp16 weights."""
    inputs = _onnx_input_types(src)
    floats = [dt for _, dt, _ in inputs if np.issubdtype(dt, np.floating)]
    if floats:
        if floats[0] != np.float32:
            raise ConfigError(f"int8 quantization starts from an fp32 export, but {src} takes {floats[0]}; export with --precision fp32")
        return
    proto = onnx.load(os.fspath(src), load_external_data=False)
    if any(t.data_type == onnx.TensorProto.FLOAT16 for t in proto.graph.initializer):
        raise ConfigError(f"int8 quantization starts from an fp32 export, but {src} has float16 weights; export with --precision fp32")


def preprocess_for_quantization(fp32_onnx: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> Path:
    """ORT's recommended pre-processing (graph optimization + ONNX shape inference) before quantizing.

    ORT's *symbolic* shape inference is skipped: it raises on the value_info that the
    torch.onnx dynamo exporter writes for Shape/Concat outputs, and ONNX shape inference
    already gives the calibrator every tensor's type.
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process

    src = Path(fp32_onnx)
    if not src.is_file():
        raise ConfigError(f"fp32 ONNX model {src} does not exist; export it first (attn-export export)")
    _check_fp32_model(src)
    try:
        quant_pre_process(str(src), str(out_path), skip_symbolic_shape=True)
    except Exception as err:  # ORT raises plain exceptions with long messages
        raise ExportError(f"quantization pre-processing of {src} failed ({type(err).__name__}: {str(err).splitlines()[0]})") from err
    from attn_export.export.passes.linear_gemm import gemm_to_linear

    # ORT's optimizer fuses a 2-D MatMul + Add (the packed encoder form's rows, the rows of a
    # residual LayerNorm) into Gemm, which the dynamic quantizer and SmoothQuant do not read:
    # write those Linears back as MatMul + Add. A node ORT fused is named "<original>/<Fusion>"
    # and has lost the torch name scope the GEMM labels are read from: give it back.
    scopes = {n.name: dict(n.metadata_props) for n in ir.load(os.fspath(src)).graph if n.metadata_props}
    model = ir.load(os.fspath(out_path))
    rewritten = gemm_to_linear(model)
    restored = 0
    for node in model.graph:
        base = node.name.split("/", 1)[0]
        if not node.metadata_props and base in scopes:
            node.metadata_props.update(scopes[base])
            restored += 1
    if rewritten or restored:
        ir.save(model, os.fspath(out_path))
    return Path(out_path)


def save_model_atomic(model: ir.Model | onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Check, then write ``model`` through a temporary file in the target folder and rename."""
    path = Path(path)
    proto = ir.serde.serialize_model(model) if isinstance(model, ir.Model) else model
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as err:
        raise ExportError(f"quantized graph fails onnx.checker: {str(err).splitlines()[0]}") from err
    with atomic_path(path) as tmp:
        onnx.save(proto, str(tmp))
    return path


def fuse_for_ort_cpu(src: str | os.PathLike[str], out: str | os.PathLike[str]) -> dict[str, int]:
    """ONNX Runtime's transformers optimizer with only the fusions that measured faster on CPU.

    Measured on MiniLM (ORT 1.32, 2 threads, B=8, L=128, int8 dynamic; docs/quantization.md):
    ``BiasGelu`` (bias Add + Gelu in one kernel) saves a pass over the FFN activation, 3-5%;
    ``SkipLayerNormalization`` (residual Add + LayerNorm) made the model 15-20% slower;
    fused ``Attention``/``MultiHeadAttention`` ran at the same speed as the decomposed
    attention (and the optimizer finds no attention pattern in this exporter's graph). So
    BiasGelu on, SkipLayerNorm and attention off. Returns the optimizer's fusion counts.
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    for name in ("enable_attention", "enable_skip_layer_norm", "enable_bias_skip_layer_norm", "enable_embed_layer_norm",
                 "enable_qordered_matmul", "enable_shape_inference", "enable_rotary_embeddings"):  # fmt: skip
        if hasattr(options, name):
            setattr(options, name, False)
    options.enable_gelu = options.enable_bias_gelu = True
    chatter = io.StringIO()  # the optimizer print()s and warns about the model producer
    with contextlib.redirect_stdout(chatter), quiet_loggers(("onnxruntime.transformers",)):
        model = optimize_model(os.fspath(src), model_type="bert", num_heads=0, hidden_size=0, opt_level=0, optimization_options=options)
        stats = {k: int(v) for k, v in model.get_fused_operator_statistics().items() if v}
        model.save_model_to_file(os.fspath(out))
    return stats


def quantize_dynamic_onnx(
    fp32_onnx: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    per_channel: bool = False,
    reduce_range: bool = False,
    smoothquant_alpha: float | str | None = None,
    calib: Any = None,
    quantize_embeddings: bool = False,
    fuse: bool = False,
    unquantized_embeddings_out: str | os.PathLike[str] | None = None,
    keep_float: Callable[[Path, Path], Sequence[str]] | None = None,
    per_token: bool = False,
) -> QuantResult:
    """int8 weights + per-batch uint8 activations for the weight MatMuls; attention BMMs stay float.

    ``per_channel=True`` costs nothing in speed and keeps real checkpoints accurate (MiniLM:
    per-tensor weights lose ~4 points of cosine). ``reduce_range`` stores 7-bit weights so that
    ONNX Runtime's U8S8 kernel cannot saturate on CPUs without VNNI (compress/int8_encoding.py).
    ``smoothquant_alpha`` (a number or ``"auto"``, needs ``calib``) smooths activation outliers
    for the dynamic quantizer first; ``fuse`` applies the ORT CPU fusions that measured faster
    (``fuse_for_ort_cpu``); ``quantize_embeddings`` stores embedding tables as int8 rows
    (``embedding_quant``), and ``unquantized_embeddings_out`` also writes the same model with
    float tables, so the tables' own accuracy cost can be measured. ``keep_float(float_graph,
    all_int8)`` (the sensitivity fallback, ``mixed_precision.dynamic_fallback``) sees the graph
    the quantizer read and its all-int8 result, and names the MatMuls to keep in float: the
    quantizer then runs again with them excluded, so the fallback ships the quantizer's own model.
    ``per_token`` rewrites the quantizer's output to one activation range per row (``per_token.per_token_pass``)
    before the fallback judges it, so what is judged and kept in float is the per-token model's own.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from attn_export.compress.quant.embedding_quant import EmbeddingQuantPass
    from attn_export.compress.quant.per_token import per_token_pass

    notes: list[str] = []
    sq_summary: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="attn_export_q8_") as tmp:
        src = preprocess_for_quantization(fp32_onnx, Path(tmp) / "pre.onnx")
        if smoothquant_alpha is not None:
            from attn_export.compress.quant.smoothquant import smooth_onnx

            if calib is None:
                raise ConfigError("SmoothQuant calibrates on activations; pass the calibration split (calib=...)")
            smoothed, groups, choices = smooth_onnx(src, calibration_feeds(src, calib, 64), smoothquant_alpha, route="dynamic")
            src = Path(tmp) / "smoothed.onnx"
            ir.save(smoothed, src)
            sq_summary = {"searched": bool(choices), "alpha": smoothquant_alpha, "smoothed": len(groups),
                          "activations": {k: c.to_dict() for k, c in choices.items()}}  # fmt: skip
            notes.append(f"SmoothQuant ({smoothquant_alpha}) for the dynamic quantizer: {len(groups)} activations smoothed")
        fused: dict[str, int] = {}
        if fuse:
            fused = fuse_for_ort_cpu(src, Path(tmp) / "fused.onnx")
            src = Path(tmp) / "fused.onnx"
            notes.append("ORT CPU fusions: " + (", ".join(f"{k} x{v}" for k, v in fused.items()) or "none matched"))
        raw = Path(tmp) / "dynamic.onnx"
        bmms = [n.name for n in attention_bmms(ir.load(src).graph) if n.name]  # and DeBERTa's c2p/p2c (qdq.attention_bmms)

        def _quantize(exclude: Sequence[str]) -> None:
            quantize_dynamic(
                str(src),
                str(raw),
                op_types_to_quantize=["MatMul"],
                per_channel=per_channel,
                reduce_range=reduce_range,
                weight_type=QuantType.QInt8,
                extra_options={"MatMulConstBOnly": True},  # activation @ activation (the BMMs) stays float
                nodes_to_exclude=[*bmms, *exclude],
            )

        per_token_summary: dict[str, Any] = {}

        def quantize(exclude: Sequence[str]) -> None:
            _quantize(exclude)
            if per_token:
                model = ir.load(raw)
                per_token_summary.update(per_token_pass(model).to_dict())
                ir.save(model, raw)

        quantize(())
        kept = list(keep_float(src, raw)) if keep_float is not None else []
        if kept:
            quantize(kept)
            notes.append(f"sensitivity fallback: {len(kept)} MatMuls kept in float")
        if per_token:
            notes.append(f"per-token activations: {per_token_summary['gemms']} GEMMs, one int8 range per row "
                         f"({per_token_summary['activations']} activations)")
        proto = onnx.load(str(raw))
        emb_summary: dict[str, Any] = {}
        if quantize_embeddings:
            if unquantized_embeddings_out is not None:
                save_model_atomic(proto, unquantized_embeddings_out)
            model = ir.serde.deserialize_model(proto)
            emb = EmbeddingQuantPass()
            emb(model)
            emb_summary = emb.result.to_dict()
            proto = ir.serde.serialize_model(model)
            if emb.result.tables:
                notes.append("embedding tables int8, one scale per row: " + ", ".join(f"{t.name} {list(t.shape)}" for t in emb.result.tables))
    save_model_atomic(proto, out_path)
    summary = inspect_qdq(proto)
    result = QuantResult(
        path=str(out_path),
        size_bytes=Path(out_path).stat().st_size,
        route="per-token" if per_token else "dynamic",
        n_quantize_linear=summary.n_quantize_linear,
        n_dequantize_linear=summary.n_dequantize_linear,
        per_channel=per_channel,
        reduce_range=reduce_range,
        notes=notes,
        fp32_size_bytes=Path(fp32_onnx).stat().st_size,
        n_dynamic_quantize_linear=summary.n_dynamic_quantize_linear,
        qdq=summary,
        smoothquant=sq_summary,
        embeddings=emb_summary,
        fusions=fused,
        per_token=per_token_summary,
    )
    if result.n_dynamic_quantize_linear == 0 and not per_token_summary.get("gemms"):
        raise ExportError(f"dynamic quantization of {fp32_onnx} quantized no MatMul; is it a float model with weight MatMuls?")
    log.info("%s", result.describe())
    return result
