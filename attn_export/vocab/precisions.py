"""Precisions as objects: every fact other modules need about a number format, in one row.

A precision (fp32, fp16, bf16, int8, fp8) is a ``Precision``: its bits, number kind, tolerance
key, the gate's slack, the TensorRT builder flags that run it, its torch and ONNX element types
and the runtimes that execute it. The CLI's choices, the plan's engine precision, the gate's
rows and the GPU table's columns all read ``PRECISIONS``; a new precision is one row here, its
tolerance row (``validate/tolerances.py``) and its GPU-table column (``targets/gpu_arch.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from attn_export.errors import ConfigError

__all__ = [
    "ARCH_PRECISIONS",
    "EIGHT_BIT",
    "PRECISIONS",
    "Precision",
    "check_export_precision",
    "engine_precision",
    "float_precision_of",
    "get_precision",
    "precision_names",
]

Slack = Mapping[str, Mapping[str, float]]  # metric -> {"abs": a, "rel": r}: slack = a + r * |baseline value|


@dataclass(frozen=True)
class Precision:
    """One number format the toolkit builds, and every fact other modules need about it.

    tolerance_key: the row of ``validate.tolerances.TOLERANCES`` its artifacts are judged by.
    gate_slack: the gate's default per-metric slack around a baseline value (``validate.gate_baselines``).
    cross_class_slack: added to that slack when the report's CPU class has no baseline entry of its own.
    export_float: an ONNX graph can be exported in it (``--precision``); otherwise it is an 8-bit
      Q/DQ format that ``--quantize`` makes from an fp32 graph.
    arch_column: the GPU table (``targets.gpu_arch``) records whether each architecture runs it
      (fp32 runs on every GPU, so it has no column).
    trt_weak_flags: the TensorRT ``BuilderFlag`` members a weakly typed build (TensorRT 10.x) sets
      to run it (``runtime/tensorrt/build_plan.py``): 8-bit Q/DQ regions with fp16 for the rest.
      trtexec's flag is the member's name in lower case (``FP16`` -> ``--fp16``).
    torch_dtype / onnx_type: an export float's element type, by torch's and ONNX's ``TensorProto``
      names: what ``export`` casts the weights and inputs to (the layers keep softmax and
      LayerNorm in float32 islands whatever it is) and how a graph's float type is read back.
    runtimes: the runtimes that execute a graph in it (``"onnxruntime"``, ``"tensorrt"``); a
      target on another runtime refuses it before any work.
    """

    name: str
    bits: int
    number_kind: Literal["float", "int"]
    tolerance_key: str
    gate_slack: Slack
    cross_class_slack: Slack
    export_float: bool
    arch_column: bool
    trt_weak_flags: tuple[str, ...] = ()
    torch_dtype: str = "float32"
    onnx_type: str = "FLOAT"
    runtimes: tuple[str, ...] = ("onnxruntime", "tensorrt")
    min_opset: int = 0  # the lowest ONNX opset that expresses it (float8 QuantizeLinear/DequantizeLinear: 19)

    @property
    def quantized(self) -> bool:
        """An 8-bit Q/DQ format (int8, fp8): made by ``--quantize``, never exported directly."""
        return not self.export_float


def _slack(cosine: float, sqnr_db: float, rel_l2: tuple[float, float], max_abs: tuple[float, float]) -> Slack:
    return MappingProxyType({
        "cosine": MappingProxyType({"abs": cosine}),
        "sqnr_db": MappingProxyType({"abs": sqnr_db}),
        "rel_l2": MappingProxyType({"abs": rel_l2[0], "rel": rel_l2[1]}),
        "max_abs": MappingProxyType({"abs": max_abs[0], "rel": max_abs[1]}),
    })  # fmt: skip


# Gate slack (abs + rel * |baseline value|): fp32 figures are summation-order noise (they move a
# little between CPUs), 8-bit figures move with the quantizer's kernel choice, so their slack is
# wide in relative terms but tight on cosine, the figure users read. Cross-class slack is sized
# from issue 9's measurement: static int8 on the default layer gave cosine 0.999932 with VNNI and
# 0.999141 on AVX2 (U8S8 saturation), i.e. rel_l2 0.0117 -> 0.0415 (3.6x) and SQNR 38.7 -> 27.6 dB;
# fp32/fp16 move only by summation order between classes. bf16 keeps 8 mantissa bits to fp16's 11
# (unit roundoff 2^-9 vs 2^-12): its slack is fp16's scaled by 8; ONNX Runtime has no bf16 kernels
# (runtime/emulate.py judges it), so it runs on TensorRT only, on the GPUs the table says yes for.
# fp8 takes int8's rows: validate/tolerances.py holds fp8 to the same tensor bar as int8
# (rel_l2 5e-2, cosine_min 0.999) and the same embedding and logit bars (its 8-bit goal differs
# only in min_min_cosine, 0.985 vs 0.98), so a baseline may move as far as an int8 one before the
# gate calls it a regression; fp32's slack (1e-6 on cosine) would fail every fp8 rebuild.
_EIGHT_BIT_SLACK = _slack(2e-4, 1.5, (1e-3, 0.25), (1e-2, 0.5))
_EIGHT_BIT_CROSS = _slack(1e-3, 12.0, (1e-2, 3.0), (5e-2, 3.0))
PRECISIONS: Mapping[str, Precision] = MappingProxyType({
    p.name: p
    for p in (
        Precision("fp32", 32, "float", "fp32", _slack(1e-6, 10.0, (1e-6, 1.0), (1e-5, 1.0)), _slack(1e-6, 10.0, (1e-6, 1.0), (1e-5, 1.0)),
                  export_float=True, arch_column=False),
        Precision("fp16", 16, "float", "fp16", _slack(2e-5, 3.0, (1e-4, 0.5), (1e-3, 1.0)), _slack(5e-5, 3.0, (1e-4, 0.5), (1e-3, 1.0)),
                  export_float=True, arch_column=True, trt_weak_flags=("FP16",), torch_dtype="float16", onnx_type="FLOAT16"),
        Precision("bf16", 16, "float", "bf16", _slack(1.5e-4, 3.0, (8e-4, 0.5), (8e-3, 1.0)), _slack(4e-4, 3.0, (8e-4, 0.5), (8e-3, 1.0)),
                  export_float=True, arch_column=True, trt_weak_flags=("BF16",), torch_dtype="bfloat16", onnx_type="BFLOAT16",
                  runtimes=("tensorrt",)),
        Precision("int8", 8, "int", "int8", _EIGHT_BIT_SLACK, _EIGHT_BIT_CROSS, export_float=False, arch_column=True,
                  trt_weak_flags=("INT8", "FP16")),
        Precision("fp8", 8, "float", "fp8", _EIGHT_BIT_SLACK, _EIGHT_BIT_CROSS, export_float=False, arch_column=True,
                  trt_weak_flags=("FP8", "FP16"), min_opset=19),
    )
})  # fmt: skip
# The 8-bit formats, best first: what --quantize auto prefers where the GPU runs both.
EIGHT_BIT: tuple[str, ...] = ("fp8", "int8")
# The GPU table's columns: the reduced precisions above, plus fp4, which the table records
# (with sources) though the toolkit does not build it yet. Order as the table prints it.
ARCH_PRECISIONS: tuple[str, ...] = ("fp16", "bf16", "int8", "fp8", "fp4")


def precision_names(*, export_float: bool | None = None) -> tuple[str, ...]:
    """The precisions' names in table order (fp32, fp16, bf16, int8, fp8); ``export_float`` filters."""
    return tuple(n for n, p in PRECISIONS.items() if export_float is None or p.export_float == export_float)


def get_precision(name: str, *, what: str = "a precision", choices: tuple[str, ...] | None = None) -> Precision:
    """The ``Precision`` called ``name`` (limited to ``choices`` when given); ConfigError otherwise."""
    allowed = choices if choices is not None else tuple(PRECISIONS)
    if name not in allowed:
        raise ConfigError(f"expected {what} in {', '.join(allowed)}, got {name!r}; use one of {', '.join(allowed)}")
    return PRECISIONS[name]


def check_export_precision(name: str) -> Precision:
    """``--precision``: the float type a graph is exported in; an 8-bit name points at ``--quantize``."""
    floats = precision_names(export_float=True)
    if name not in floats:
        fix = f"--quantize {name}" if name in PRECISIONS else f"--precision {floats[0]}"
        raise ConfigError(f"expected --precision in {'|'.join(floats)}, got {name!r}; use {fix}")
    return PRECISIONS[name]


def float_precision_of(onnx_types: Iterable[str]) -> str:
    """The export float a graph is in, from the ONNX element type names (``TensorProto``'s, e.g. ``FLOAT16``)
    its weights, inputs or GEMMs hold: the first reduced float present, else fp32."""
    names = set(onnx_types)
    return next((p.name for p in PRECISIONS.values() if p.export_float and p.name != "fp32" and p.onnx_type in names), "fp32")


def engine_precision(quantize: str | None, float_precision: str) -> str:
    """The rule the plan decides an engine's precision by (``pipeline.plan.Plan.engine_precision``, its only
    caller): the 8-bit format ``--quantize`` names (int8 for ``auto`` until a format ships), else ``--precision``."""
    if quantize in (None, "none"):
        return float_precision
    if quantize in PRECISIONS and PRECISIONS[quantize].quantized:
        return quantize
    return "int8"  # auto (or a route precision the registry adds): int8 runs on every TensorRT GPU
