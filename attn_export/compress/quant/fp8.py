"""FP8 (E4M3) Q/DQ of an fp32 ONNX graph, for TensorRT on GPUs with FP8 tensor cores (SM 8.9+).

``quantize_fp8_onnx(fp32, out, calib, Fp8Spec())`` writes the graph TensorRT's explicit
quantization reads as FP8: ``QuantizeLinear`` to ``float8e4m3fn`` (opset >= 19, zero point
the float8 zero, ``saturate=1``) and ``DequantizeLinear`` back to fp32, placed exactly where
the static int8 route places its Q/DQ (``quant_static``): the activation input of every
projection GEMM (MatMul/Gemm with a constant weight), per tensor; the weight, per output
channel; Softmax, LayerNorm and the mask Add read float; the attention BMMs only with
``quantize_attention_bmm`` (ModelOpt's FP8 MHA pattern, the same one as int8's).

How: the int8 route runs first (its calibration, placement fixes, SmoothQuant and range
overrides), then ``Int8ToFp8Pass`` converts each Q/DQ pair, as NVIDIA Model Optimizer's
ONNX FP8 path does (``modelopt/onnx/quantization/fp8.py``: int8 Q/DQ with symmetric max
calibration, scale x 448/127): an activation's symmetric int8 scale is amax/127, so its FP8
scale is amax/448; weights are re-quantized from the float graph (not from the int8 codes,
which would round twice), scale = per-channel amax/448. ONNX Runtime's own float8 path was
not used: ``quantize_static`` accepts ``QFLOAT8E4M3FN`` only with
``CalibrationMethod.Distribution``, whose scale is std(x)/std(E4M3 grid) (a Gaussian fit,
``quant_utils.compute_scale_zp_float8``), not the amax TensorRT and ModelOpt use.

Judged on the CPU like static int8: ONNX Runtime runs the Q/DQ as written (CPU float8
QuantizeLinear/DequantizeLinear kernels, opset 19-23, ``session.disable_quant_qdq=1``).
``SIMULATION`` says where that is TensorRT's arithmetic and where it is not.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as ir_common

from attn_export.compress.quant.qdq import QdqSummary, inspect_qdq, is_constant
from attn_export.compress.quant.onnx import STATIC_ON_CPU, ActivationLike, save_model_atomic
from attn_export.compress.quant.static import StaticQuantSpec, quantize_static_onnx
from attn_export.errors import ConfigError, ExportError
from attn_export.export.passes.graph_constants import typed_initializer
from attn_export.vocab.choices import CALIB_CHOICES

__all__ = ["E4M3_MAX", "FP8_MIN_OPSET", "SIMULATION", "Fp8Result", "Fp8Spec", "Int8ToFp8Pass", "fp8_weight", "quantize_fp8_onnx"]

log = logging.getLogger(__name__)

E4M3_MAX = 448.0  # largest finite float8e4m3fn (ONNX QuantizeLinear saturate=1 clamps here; TensorRT clips to [-448, 448])
FP8_MIN_OPSET = 19  # QuantizeLinear/DequantizeLinear take float8 from opset 19 (onnx docs/Operators.md)
_INT8_MAX = 127.0  # the static route's symmetric int8 range is [-127, 127] (ORT ONNX_INT_TYPE_SYMMETRIC_RANGE)

SIMULATION = (
    "ONNX Runtime CPU runs the FP8 Q/DQ as written: the quantization x/s rounded to nearest-even E4M3 and clipped to "
    "+-448 is TensorRT's castToFp8(clip(x/s, -448, 448)) bit for bit, and each product of two E4M3 values is exact in "
    "fp32. Not simulated: the order and internal precision of TensorRT's FP8 tensor-core accumulation, the float "
    "layers a weakly typed TensorRT 10.x build runs in fp16 (ONNX Runtime runs them in fp32), and a fused FP8 MHA "
    "kernel's own softmax"
)


@dataclass(frozen=True)
class Fp8Spec:
    """How to calibrate and where to put the FP8 Q/DQ.

    method: the activation amax from the calibration split's ``minmax`` (the default: FP8's
    exponent leaves room for the largest value, and TensorRT/ModelOpt calibrate FP8 by max),
    or the int8 route's ``percentile``/``entropy``/``per-tensor`` clip thresholds.
    per_channel: one weight scale per output channel (the parser accepts a 1-D scale for any
    quantized type; ModelOpt's FP8 ONNX path quantizes weights per channel).
    quantize_attention_bmm: Q/DQ on both BMMs of decomposed attention too (FP8 MHA).
    smoothquant_alpha: as the static int8 route (None = off, a number, or "auto").
    """

    method: str = "minmax"
    per_channel: bool = True
    quantize_attention_bmm: bool = False
    smoothquant_alpha: float | str | None = None
    max_calib_samples: int = 64

    def __post_init__(self) -> None:
        if self.method not in CALIB_CHOICES:
            raise ConfigError(f"expected an FP8 calibration method in {', '.join(CALIB_CHOICES)}, got {self.method!r}; use minmax")
        self.static_spec()  # the int8 spec validates alpha and samples

    def static_spec(self) -> StaticQuantSpec:
        """The static int8 spec whose placement and calibration the FP8 graph inherits."""
        # bmm_max_seq=None: int8 MHA's 512-token limit is not FP8's (ModelOpt gates FP8 MHA on head size only, trt_fp8.py)
        return StaticQuantSpec(method=self.method, per_channel=self.per_channel, quantize_attention_bmm=self.quantize_attention_bmm,
                               smoothquant_alpha=self.smoothquant_alpha, max_calib_samples=self.max_calib_samples, bmm_max_seq=None)  # fmt: skip


@dataclass
class Fp8Result:
    """What the FP8 quantizer wrote, for the report."""

    path: str
    size_bytes: int
    fp32_size_bytes: int
    n_quantize_linear: int
    n_dequantize_linear: int
    per_channel: bool
    calib_method: str
    calib_samples: int
    opset: int
    converted_activations: int
    converted_weights: int
    notes: list[str] = field(default_factory=list)
    qdq: QdqSummary | None = None
    int8_stage: dict[str, Any] = field(default_factory=dict)  # the int8 route it was converted from (calibration, SmoothQuant)

    @property
    def size_ratio(self) -> float:
        return self.size_bytes / self.fp32_size_bytes if self.fp32_size_bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("qdq", None)
        d.update(route="fp8", size_ratio=self.size_ratio, simulation=SIMULATION)
        return d

    def describe(self) -> str:
        return (
            f"fp8 e4m3: {self.calib_method} amax on {self.calib_samples} sequences, {self.n_quantize_linear} Q / "
            f"{self.n_dequantize_linear} DQ, weights {'per channel' if self.per_channel else 'per tensor'}, opset {self.opset}, "
            f"{self.size_bytes} bytes ({100 * self.size_ratio:.1f}% of fp32)"
        )


def fp8_weight(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(float8e4m3fn codes, fp32 scale) of ``w``: symmetric, scale = amax/448 per ``axis`` slice (None: per tensor).

    Rounding is numpy/ml_dtypes' float32 -> E4M3 cast (round to nearest even), after the
    clip that QuantizeLinear's saturate=1 applies; an all-zero channel gets scale 1.
    """
    w = np.asarray(w, dtype=np.float32)
    if axis is None:
        amax = np.asarray(np.abs(w).max(), dtype=np.float32)
        scale = np.float32(amax / E4M3_MAX) if amax > 0 else np.float32(1.0)
        codes = np.clip(w / scale, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
        return codes, np.asarray(scale, dtype=np.float32)
    axis = axis % w.ndim
    other = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.abs(w).max(axis=other).astype(np.float32)
    scale = np.where(amax > 0, amax / np.float32(E4M3_MAX), np.float32(1.0)).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    codes = np.clip(w / scale.reshape(shape), -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
    return codes, scale


def _f8_zero(graph: ir.Graph, shape: tuple[int, ...], name: str) -> ir.Value:
    return typed_initializer(graph, name, np.zeros(shape, dtype=ml_dtypes.float8_e4m3fn))


class Int8ToFp8Pass(ir.passes.InPlacePass):
    """Turn the static route's symmetric int8 Q/DQ into FP8 E4M3 Q/DQ.

    ``float_model`` is the float graph the int8 Q/DQ were placed on
    (``quantize_static_onnx(float_model_out=...)``): each quantized weight is re-quantized
    from its float initializer there, found through the GEMM node that reads it.
    """

    def __init__(self, float_model: ir.Model) -> None:
        super().__init__()
        self.float_weights = {n.name: [v for v in n.inputs] for n in float_model.graph if n.op_type in ("MatMul", "Gemm")}
        self.activations = 0
        self.weights = 0

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        self.activations = self.weights = 0
        for q in [n for n in graph if n.op_type == "QuantizeLinear"]:
            self._activation(graph, q)
        for dq in [n for n in graph if n.op_type == "DequantizeLinear" and is_constant(n.inputs[0])]:
            self._weight(graph, dq)
        left = [n.name for n in graph if n.op_type in ("QuantizeLinear", "DequantizeLinear") and _is_int8(n)]
        if left:
            raise ExportError(f"FP8 conversion left int8 Q/DQ in {left[:3]}; they read no calibrated activation or float weight")
        ir_common.RemoveUnusedNodesPass()(model)  # the int8 weights, scales and zero points nobody reads any more
        return ir.passes.PassResult(model, bool(self.activations or self.weights))

    def _activation(self, graph: ir.Graph, q: ir.Node) -> None:
        scale = q.inputs[1].const_value if q.inputs[1] is not None else None
        if scale is None or scale.numpy().size != 1:
            raise ExportError(f"{q.name}: expected a constant per-tensor int8 activation scale, got {q.inputs[1]}")
        amax = float(scale.numpy().ravel()[0]) * _INT8_MAX
        base = q.outputs[0].name or q.name
        s = typed_initializer(graph, f"{base}_fp8_scale", np.asarray(amax / E4M3_MAX, dtype=np.float32))
        z = _f8_zero(graph, (), f"{base}_fp8_zero_point")
        q.replace_input_with(1, s)
        q.replace_input_with(2, z)
        q.attributes["saturate"] = ir.AttrInt64("saturate", 1)
        q.outputs[0].dtype = ir.DataType.FLOAT8E4M3FN
        for dq, _ in list(q.outputs[0].uses()):
            if dq.op_type == "DequantizeLinear":
                dq.replace_input_with(1, s)
                dq.replace_input_with(2, z)
        self.activations += 1

    def _weight(self, graph: ir.Graph, dq: ir.Node) -> None:
        users = [(u, i) for u, i in dq.outputs[0].uses() if u.op_type in ("MatMul", "Gemm")]
        if not users:
            raise ExportError(f"{dq.name}: a quantized weight read by {[u.op_type for u, _ in dq.outputs[0].uses()]}, not by a GEMM")
        user, index = users[0]
        floats = self.float_weights.get(user.name or "")
        w = floats[index] if floats is not None and index < len(floats) else None
        if w is None or w.const_value is None:
            raise ExportError(f"the float graph lacks the weight of GEMM {user.name!r}; pass the graph quantize_static_onnx quantized")
        per_channel = dq.inputs[1] is not None and dq.inputs[1].const_value is not None and dq.inputs[1].const_value.numpy().size > 1
        attr = dq.attributes.get("axis")
        axis = (attr.as_int() if attr is not None else 1) if per_channel else None
        codes, scale = fp8_weight(w.const_value.numpy(), axis)
        base = w.name or user.name
        wq = typed_initializer(graph, f"{base}_fp8", codes)
        s = typed_initializer(graph, f"{base}_fp8_scale", scale)
        z = _f8_zero(graph, scale.shape, f"{base}_fp8_zero_point")
        for i, v in enumerate((wq, s, z)):
            dq.replace_input_with(i, v)
        self.weights += 1


def _is_int8(node: ir.Node) -> bool:
    zp = node.inputs[2] if len(node.inputs) > 2 else None
    return zp is not None and zp.dtype in (ir.DataType.INT8, ir.DataType.UINT8)


def _opset(model: ir.Model) -> int:
    return int(model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0)))


def quantize_fp8_onnx(
    fp32_onnx: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    calib: ActivationLike | list[dict[str, np.ndarray]],
    spec: Fp8Spec | None = None,
    float_model_out: str | os.PathLike[str] | None = None,
) -> Fp8Result:
    """Calibrate on ``calib`` (the train split) and write the FP8 Q/DQ model to ``out_path``.

    ``float_model_out`` also saves the float graph the Q/DQ were placed on: what
    ``mixed_precision``'s fallback restores float weights from (as for static int8).
    """
    spec = spec or Fp8Spec()
    src_opset = _opset(ir.load(os.fspath(fp32_onnx))) if Path(fp32_onnx).is_file() else FP8_MIN_OPSET
    if src_opset < FP8_MIN_OPSET:
        raise ConfigError(
            f"FP8 QuantizeLinear needs opset >= {FP8_MIN_OPSET}, and {fp32_onnx} is opset {src_opset}; "
            f"export with --opset {FP8_MIN_OPSET} or higher (the tensorrt target exports opset 23)"
        )
    with tempfile.TemporaryDirectory(prefix="attn_export_fp8_") as tmp_name:
        tmp = Path(tmp_name)
        flt = Path(float_model_out) if float_model_out is not None else tmp / "float.onnx"
        int8 = quantize_static_onnx(fp32_onnx, tmp / "int8.onnx", calib, spec.static_spec(), float_model_out=flt)
        model = ir.load(tmp / "int8.onnx")
        convert = Int8ToFp8Pass(ir.load(flt))
        convert(model)
        summary = inspect_qdq(model)
        bad = [q.name for q in summary.quantize_linear + summary.dequantize_linear if q.dtype != "FLOAT8E4M3FN" or not q.zero_point_is_zero]
        if bad:
            raise ExportError(f"FP8 graph has Q/DQ that are not float8e4m3fn with zero point 0: {bad[:3]}")
        save_model_atomic(model, out_path)
    int8_only = (STATIC_ON_CPU, "attention BMMs quantized for TensorRT's int8 MHA")  # the int8 route's notes that are not FP8's
    notes = [n for n in int8.notes if not n.startswith(int8_only)]
    if spec.quantize_attention_bmm:
        notes.append("attention BMMs in FP8 (FP8 MHA: Q/DQ on both BMMs' inputs and after P @ V)")
    notes.append(SIMULATION)
    result = Fp8Result(
        path=str(out_path), size_bytes=Path(out_path).stat().st_size, fp32_size_bytes=Path(fp32_onnx).stat().st_size,
        n_quantize_linear=summary.n_quantize_linear, n_dequantize_linear=summary.n_dequantize_linear, per_channel=spec.per_channel,
        calib_method=spec.method, calib_samples=int8.calib_samples, opset=_opset(model), converted_activations=convert.activations,
        converted_weights=convert.weights, notes=notes, qdq=summary,
        int8_stage={"calibration": int8.calibration, "smoothquant": int8.smoothquant},
    )  # fmt: skip
    log.info("%s", result.describe())
    return result
