"""Static int8 PTQ to a Q/DQ ONNX graph that TensorRT's explicit quantization accepts.

``quantize_static_onnx(fp32, out, calib, StaticQuantSpec(...))`` runs ONNX Runtime's
``quantize_static`` with symmetric int8 activations and per-channel symmetric int8 weights,
so every zero point is 0, then fixes the placement (docs/quantization.md):

* the projection MatMuls (QKV, O, FFN; both factors of a low-rank Linear) always get Q/DQ
  on their activation input and a per-output-channel DQ on their weight;
* nothing else reads a dequantized tensor: ORT rewires *every* consumer of a quantized
  tensor to its DQ, which would quantize the residual stream and put DQ in front of the
  LayerNorm and the mask Add. ``FloatConsumersPass`` points those consumers back at the
  float tensor, so Softmax, LayerNorm and the mask Add see float inputs;
* the two attention BMMs stay float unless ``quantize_attention_bmm``: then Q/DQ go in front
  of both operands of Q@K^T and P@V (P being the Softmax output) and after P@V, the
  pattern TensorRT fuses into its int8 MHA kernel (sequence length <= 512 only).

Ranges come from one global method (ORT's calibrators) or, with ``method="per-tensor"``,
from ``calib_choice.choose_ranges``: every activation gets the method that quantizes it
with the smallest error, on real (unpadded) tokens. ``smoothquant_alpha="auto"`` searches
one SmoothQuant alpha per activation and smooths only where it helps (``smoothquant``).
Which GEMMs stay int8 is decided afterwards, on the subject's own accuracy
(``mixed_precision``); ``float_model_out`` keeps the float graph the Q/DQ were placed on,
which that step restores fallback weights from.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as ir_common

from attn_export.compress.calib.choice import choose_ranges
from attn_export.compress.quant.qdq import attention_bmms, inspect_qdq, is_constant
from attn_export.compress.quant.onnx import (
    STATIC_ON_CPU,
    ActivationLike,
    QuantResult,
    calibration_feeds,
    calibration_reader,
    preprocess_for_quantization,
    save_model_atomic,
)
from attn_export.compress.quant.smoothquant import smooth_onnx
from attn_export.errors import ConfigError, ExportError
from attn_export.vocab.choices import CALIB_CHOICES, PER_TENSOR

__all__ = ["TRT_INT8_MHA_MAX_SEQ", "FloatConsumersPass", "StaticQuantSpec", "quantize_static_onnx"]

log = logging.getLogger(__name__)

TRT_INT8_MHA_MAX_SEQ = 512  # TensorRT fuses int8 MHA only up to this sequence length


@dataclass(frozen=True)
class StaticQuantSpec:
    """How to calibrate and where to put Q/DQ.

    method: activation range from the calibration data's ``minmax``, a ``percentile`` of
    |x|, the ``entropy`` (KL) optimal threshold, or ``per-tensor`` (each activation the one of
    those with the smallest error). per_channel: one weight scale per output
    channel (TensorRT's recommendation). smoothquant_alpha: migrate activation outliers into
    the weights first (None = off; 0.5 is the paper's default; "auto" = searched per
    activation, applied where it helps). max_calib_samples: sequences
    of the calibration split used.

    Every method reads one real-token |x| histogram per activation (``calib_choice``: padded
    positions never count), so ``entropy`` is always TensorRT's KL calibrator (128 levels)
    and a method name means one calibrator, with or without SmoothQuant.
    """

    method: str = "minmax"
    per_channel: bool = True
    quantize_attention_bmm: bool = False
    smoothquant_alpha: float | str | None = None
    percentile: float = 99.999
    max_calib_samples: int = 64
    reduce_range: bool = False  # 7-bit weights for ONNX Runtime on CPUs whose U8S8 GEMM saturates (compress/int8_encoding.py)
    bmm_max_seq: int | None = TRT_INT8_MHA_MAX_SEQ  # longest calibration sequence with quantized BMMs (int8 MHA's limit; None: no limit, FP8)
    float_precision: str = "fp32"  # what the float parts run in (fp16: TensorRT's INT8+FP16 build); bounds the ranges

    def __post_init__(self) -> None:
        if self.method not in CALIB_CHOICES:
            raise ConfigError(f"expected --calib-method in {', '.join(CALIB_CHOICES)}, got {self.method!r}")
        if not 50.0 < self.percentile <= 100.0:
            raise ConfigError(f"expected a percentile in (50, 100], got {self.percentile}; use e.g. 99.999")
        a = self.smoothquant_alpha
        if a is not None and a != "auto" and not (isinstance(a, (int, float)) and 0.0 <= a <= 1.0):
            raise ConfigError(f"expected a SmoothQuant alpha in [0, 1] or 'auto', got {a!r}; use 0.5")
        if self.max_calib_samples < 1:
            raise ConfigError(f"expected max_calib_samples >= 1, got {self.max_calib_samples}")


class FloatConsumersPass(ir.passes.InPlacePass):
    """Only ``quantized`` nodes may read a dequantized activation; others get the float tensor back."""

    def __init__(self, quantized: set[str]) -> None:
        super().__init__()
        self.quantized = quantized
        self.rewired = 0

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.rewired = 0
        for dq in list(model.graph):
            if dq.op_type != "DequantizeLinear" or is_constant(dq.inputs[0]):
                continue
            q = dq.inputs[0].producer()
            if q is None or q.op_type != "QuantizeLinear":
                continue
            float_value = q.inputs[0]
            for user, index in list(dq.outputs[0].uses()):
                if user.name not in self.quantized and user.op_type != "QuantizeLinear":
                    user.replace_input_with(index, float_value)
                    self.rewired += 1
        if self.rewired:
            ir_common.RemoveUnusedNodesPass()(model)  # Q/DQ pairs nobody reads any more
        return ir.passes.PassResult(model, bool(self.rewired))


def _reaches_softmax_input(value: ir.Value | None) -> bool:
    """True when ``value`` comes from a Softmax through DQ/Q/Cast (P of P @ V)."""
    hops = 0
    node = value.producer() if value is not None else None
    while node is not None and hops < 4:
        if node.op_type == "Softmax":
            return True
        if node.op_type not in ("DequantizeLinear", "QuantizeLinear", "Cast"):
            return False
        node = node.inputs[0].producer() if node.inputs[0] is not None else None
        hops += 1
    return False


def histogram_ranges(
    model_path: Path, feeds: list[dict[str, np.ndarray]], names: list[str], method: str = PER_TENSOR, percentile: float = 99.999,
    float_precision: str = "fp32",
) -> tuple[dict[str, tuple[float, float]], dict[str, Any]]:
    """Symmetric ranges of ``names`` from real-token |x| histograms (``calib_choice``), and a summary for the report."""
    from attn_export.compress.probe import collect_stats

    choices = choose_ranges(collect_stats(model_path, names, feeds), method, percentile, float_precision)
    counts: dict[str, int] = {}
    for c in choices.values():
        counts[c.method] = counts.get(c.method, 0) + 1
    summary = {"source": "real-token histograms", "methods": counts,
               "tensors": {k: {"method": c.method, "threshold": c.threshold} for k, c in choices.items()}}  # fmt: skip
    return {k: c.range for k, c in choices.items()}, summary


def _insert_output_qdq(graph: ir.Graph, node: ir.Node, absmax: float) -> None:
    """Q/DQ (int8, zero point 0) on ``node``'s first output, read by all its consumers."""
    out = node.outputs[0]
    uses = list(out.uses())
    scale = ir.Value(name=f"{out.name}_scale", const_value=ir.tensor(np.float32(max(absmax, 1e-12) / 127.0)))
    zero = ir.Value(name=f"{out.name}_zero_point", const_value=ir.tensor(np.int8(0)))
    graph.register_initializer(scale)
    graph.register_initializer(zero)
    q = ir.node("QuantizeLinear", [out, scale, zero], name=f"{out.name}_QuantizeLinear")
    dq = ir.node("DequantizeLinear", [q.outputs[0], scale, zero], name=f"{out.name}_DequantizeLinear")
    q.outputs[0].name, dq.outputs[0].name = f"{out.name}_QuantizeLinear_Output", f"{out.name}_DequantizeLinear_Output"
    graph.insert_after(node, [q, dq])
    for user, index in uses:
        user.replace_input_with(index, dq.outputs[0])


def quantize_static_onnx(
    fp32_onnx: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    calib: ActivationLike | list[dict[str, np.ndarray]],
    spec: StaticQuantSpec | None = None,
    float_model_out: str | os.PathLike[str] | None = None,
    range_overrides: dict[str, float] | None = None,
    smoothing: dict[str, np.ndarray] | None = None,
) -> QuantResult:
    """Calibrate on ``calib`` (the calibration split, never the validation one) and write a Q/DQ model.

    ``float_model_out``: also save the float graph the Q/DQ were placed on (pre-processed,
    smoothed), whose MatMul names and weights a later fallback to float restores from.
    ``range_overrides``: GEMM label (the module path, e.g. ``layers.0.ffn_out``) -> the clip
    threshold of its input, used instead of calibration (QAT-lite's trained ranges).
    ``smoothing``: GEMM label -> SmoothQuant scale s of its input, applied as given (instead
    of ``spec.smoothquant_alpha``); GEMMs that read one tensor must share one s.
    """
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    spec = spec or StaticQuantSpec()
    if isinstance(calib, list):  # feed dicts: the sequence length is the feeds' second axis
        seq = max((int(np.asarray(v).shape[1]) for f in calib for v in f.values() if np.asarray(v).ndim >= 2), default=0)
    else:
        seq = int(np.asarray(calib.x).shape[1]) if np.asarray(calib.x).ndim == 3 else 0
    if spec.quantize_attention_bmm and spec.bmm_max_seq is not None and seq > spec.bmm_max_seq:
        raise ConfigError(
            f"quantize_attention_bmm follows TensorRT's int8 MHA, which fuses only up to sequence length "
            f"{TRT_INT8_MHA_MAX_SEQ}, got calibration sequences of {seq}; leave the BMMs float"
        )
    notes: list[str] = [STATIC_ON_CPU]
    with tempfile.TemporaryDirectory(prefix="attn_export_q8_") as tmp_name:
        tmp = Path(tmp_name)
        src = preprocess_for_quantization(fp32_onnx, tmp / "pre.onnx")
        feeds = calibration_feeds(src, calib, spec.max_calib_samples)
        n_samples = sum(len(next(iter(f.values()))) for f in feeds)
        sq_summary: dict[str, Any] = {}
        if smoothing:
            from attn_export.compress.quant.gemm_groups import gemm_label
            from attn_export.compress.quant.smoothquant import SmoothQuantPass

            model = ir.load(src)
            scales = {n.inputs[0].name: smoothing[gemm_label(n)] for n in model.graph
                      if n.op_type == "MatMul" and gemm_label(n) in smoothing and n.inputs[0] is not None}  # fmt: skip
            sq = SmoothQuantPass({}, None, scales=scales)  # type: ignore[arg-type]
            sq(model)
            src = tmp / "smoothed.onnx"
            ir.save(model, src)
            sq_summary = {"searched": False, "given": True, "smoothed": len(sq.smoothed)}
            notes.append(f"SmoothQuant scales given for {len(sq.smoothed)} activations")
        elif spec.smoothquant_alpha is not None:
            smoothed, groups, choices = smooth_onnx(src, feeds, spec.smoothquant_alpha, route="static", calib_method=spec.method)
            src = tmp / "smoothed.onnx"
            ir.save(smoothed, src)
            if choices:
                sq_summary = {"searched": True, "activations": {k: c.to_dict() for k, c in choices.items()}}
                notes.append(f"SmoothQuant alpha searched per activation: {len(groups)} of {len(choices)} smoothed (where it cut the GEMM's int8 error by >= 10%)")
            else:
                sq_summary = {"searched": False, "alpha": spec.smoothquant_alpha, "smoothed": len(groups)}
                notes.append(f"SmoothQuant alpha {spec.smoothquant_alpha}: {len(groups)} activations smoothed by a float Mul")
        bmms = attention_bmms(ir.load(src).graph)
        bmm_names = [n.name for n in bmms]
        if spec.quantize_attention_bmm:
            notes.append(f"attention BMMs quantized for TensorRT's int8 MHA (sequence length <= {TRT_INT8_MHA_MAX_SEQ})")
            if not bmms:
                notes.append("no attention BMMs found (fused attention op?): only the projections are quantized")
        calib_summary: dict[str, Any] = {}
        graph = ir.load(src).graph  # the SmoothQuant search scored these very ranges
        wanted = bmm_names if spec.quantize_attention_bmm else []
        names = [n.inputs[0].name for n in graph if n.op_type in ("MatMul", "Gemm") and n.name not in bmm_names]
        for n in graph:
            if n.name in wanted:
                names += [v.name for v in n.inputs] + [n.outputs[0].name]
        ranges, calib_summary = histogram_ranges(src, feeds, [x for x in dict.fromkeys(names) if x], spec.method, spec.percentile, spec.float_precision)
        if spec.method == PER_TENSOR:
            notes.append("per-tensor calibration: " + ", ".join(f"{m} x{c}" for m, c in sorted(calib_summary["methods"].items())))
        if range_overrides:
            from attn_export.compress.quant.gemm_groups import gemm_label

            applied = 0
            for n in ir.load(src).graph:
                if n.op_type in ("MatMul", "Gemm") and n.name not in bmm_names and gemm_label(n) in range_overrides:
                    t = float(range_overrides[gemm_label(n)])
                    ranges[n.inputs[0].name] = (-t, t)
                    applied += 1
            notes.append(f"{applied} GEMM input ranges given (trained), not calibrated")
        overrides = {name: [{"rmin": np.float32(lo), "rmax": np.float32(hi)}] for name, (lo, hi) in ranges.items()}
        quantize_static(
            str(src), str(tmp / "raw.onnx"), calibration_reader(feeds[:1]),  # ranges come from the overrides
            quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul", "Gemm"], per_channel=spec.per_channel,
            reduce_range=spec.reduce_range,
            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
            nodes_to_exclude=[] if spec.quantize_attention_bmm else bmm_names,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={
                "ActivationSymmetric": True, "WeightSymmetric": True, "TensorQuantOverrides": overrides,
                "OpTypesToExcludeOutputQuantization": ["MatMul", "Gemm"],
            },
        )  # fmt: skip
        model = ir.load(tmp / "raw.onnx")
        quantized = {n.name for n in model.graph if n.op_type in ("MatMul", "Gemm")}
        if not spec.quantize_attention_bmm:
            quantized -= set(bmm_names)
        FloatConsumersPass(quantized)(model)
        if spec.quantize_attention_bmm:
            nodes = {n.name: n for n in model.graph}
            pv = [nodes[n] for n in bmm_names if n in nodes and _reaches_softmax_input(nodes[n].inputs[0])]
            for node in pv:
                lo, hi = ranges[node.outputs[0].name]
                _insert_output_qdq(model.graph, node, max(abs(lo), abs(hi)))
        summary = inspect_qdq(model)
        if not summary.zero_points_all_zero:
            raise ExportError(f"static quantization left nonzero zero points in {summary.nonzero_zero_points[:3]}; TensorRT rejects them")
        save_model_atomic(model, out_path)
        if float_model_out is not None:
            shutil.copyfile(src, float_model_out)
    result = QuantResult(
        path=str(out_path),
        size_bytes=Path(out_path).stat().st_size,
        route="static",
        n_quantize_linear=summary.n_quantize_linear,
        n_dequantize_linear=summary.n_dequantize_linear,
        per_channel=spec.per_channel,
        reduce_range=spec.reduce_range,
        notes=notes,
        fp32_size_bytes=Path(fp32_onnx).stat().st_size,
        calib_method=spec.method,
        calib_samples=n_samples,
        qdq=summary,
        calibration=calib_summary,
        smoothquant=sq_summary,
    )
    log.info("%s", result.describe())
    return result
