"""int8 ONNX models: what every route shares, and the dynamic route for ONNX Runtime CPU.

Two ONNX routes exist because the two runtimes want different graphs. TensorRT needs static,
symmetric Q/DQ (``quant_static.quantize_static_onnx``). ONNX Runtime on x86 CPUs runs fastest
with *dynamic* quantization: weights are int8 offline, activations are quantized per batch
to uint8 at run time (``DynamicQuantizeLinear`` -> ``MatMulInteger``, which ORT fuses into
one u8s8 VNNI kernel). TensorRT cannot parse ``DynamicQuantizeLinear``, so the dynamic model
is for ONNX Runtime only; ``check_route_for_target`` says so before anyone builds an engine.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
import onnx_ir as ir

from attn_export._atomic import atomic_path
from attn_export.compress.qdq import QdqSummary, inspect_qdq
from attn_export.errors import ConfigError, DataError, ExportError

__all__ = [
    "DYNAMIC_NOT_FOR_TENSORRT",
    "INT8_ROUTES",
    "STATIC_ON_CPU",
    "TORCHAO_IS_EAGER_ONLY",
    "ActivationLike",
    "QuantResult",
    "calibration_feeds",
    "calibration_reader",
    "check_route_for_target",
    "preprocess_for_quantization",
    "quantize_dynamic_onnx",
    "save_model_atomic",
]

log = logging.getLogger(__name__)

INT8_ROUTES: tuple[str, ...] = ("static", "dynamic", "torchao")
DYNAMIC_NOT_FOR_TENSORRT = (
    "the dynamic int8 route emits DynamicQuantizeLinear/MatMulInteger, which TensorRT cannot parse; "
    "use --int8-mode static (symmetric Q/DQ) for TensorRT targets"
)
TORCHAO_IS_EAGER_ONLY = (
    "the torchao int8 route quantizes the eager PyTorch module and does not export to ONNX; "
    "use --int8-mode static or dynamic for a deployable model"
)
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
    route: str  # "static" | "dynamic"
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


def check_route_for_target(route: str, target: str) -> list[str]:
    """Warnings for running an int8 ``route`` on a deployment ``target`` (an ``--target`` name)."""
    from attn_export.export.targets import get_target

    if route not in INT8_ROUTES:
        raise ConfigError(f"expected --int8-mode in {', '.join(INT8_ROUTES)}, got {route!r}")
    tgt = get_target(target)
    if route == "torchao":
        return [TORCHAO_IS_EAGER_ONLY]
    if route == "dynamic" and tgt.is_tensorrt:
        return [DYNAMIC_NOT_FOR_TENSORRT]
    if route == "static" and tgt.name == "ort-cpu":
        return [STATIC_ON_CPU]
    return []


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


def quantize_dynamic_onnx(
    fp32_onnx: str | os.PathLike[str], out_path: str | os.PathLike[str], per_channel: bool = False, reduce_range: bool = False
) -> QuantResult:
    """int8 weights + per-batch uint8 activations for the weight MatMuls; attention BMMs stay float.

    ``per_channel=True`` costs nothing in speed and keeps real checkpoints accurate (MiniLM:
    per-tensor weights lose ~4 points of cosine). ``reduce_range`` stores 7-bit weights so that
    ONNX Runtime's U8S8 kernel cannot saturate on CPUs without VNNI (compress/int8_encoding.py).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="attn_export_q8_") as tmp:
        pre = preprocess_for_quantization(fp32_onnx, Path(tmp) / "pre.onnx")
        raw = Path(tmp) / "dynamic.onnx"
        quantize_dynamic(
            str(pre),
            str(raw),
            op_types_to_quantize=["MatMul"],
            per_channel=per_channel,
            reduce_range=reduce_range,
            weight_type=QuantType.QInt8,
            extra_options={"MatMulConstBOnly": True},  # activation @ activation (the BMMs) stays float
        )
        proto = onnx.load(str(raw))
    save_model_atomic(proto, out_path)
    summary = inspect_qdq(proto)
    result = QuantResult(
        path=str(out_path),
        size_bytes=Path(out_path).stat().st_size,
        route="dynamic",
        n_quantize_linear=summary.n_quantize_linear,
        n_dequantize_linear=summary.n_dequantize_linear,
        per_channel=per_channel,
        reduce_range=reduce_range,
        notes=[DYNAMIC_NOT_FOR_TENSORRT],
        fp32_size_bytes=Path(fp32_onnx).stat().st_size,
        n_dynamic_quantize_linear=summary.n_dynamic_quantize_linear,
        qdq=summary,
    )
    if result.n_dynamic_quantize_linear == 0:
        raise ExportError(f"dynamic quantization of {fp32_onnx} quantized no MatMul; is it a float model with weight MatMuls?")
    log.info("%s", result.describe())
    return result
