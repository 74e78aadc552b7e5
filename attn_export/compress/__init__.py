"""Compression: calibration data, low-rank factorization, distillation and int8 quantization.

Each family has one in-place entry point driven by a config dataclass, torchao-style:
``low_rank_(model, LowRankConfig(rank_ratio=0.5), calib)``, ``distill_(student, teacher,
calib, val, DistillConfig())``, ``quantize_eager_(model, mode)``. Every accuracy figure
is measured on the validation split.
"""

# calibration data, low-rank factorization and distillation (issue 3 §1-§3)
from attn_export.compress.calib_data import (
    ActivationSet,
    CalibrationData,
    default_calibration_path,
    generate_calibration,
    load_calibration,
)
from attn_export.compress.distill import (
    DistillConfig,
    DistillSummary,
    distill_,
    output_error,
)
from attn_export.compress.lowrank import (
    LowRankConfig,
    LowRankLinear,
    LowRankSummary,
    factorization_is_profitable,
    linear_flops,
    low_rank_,
)

# int8 routes (issue 3 §4): torchao eager reference, static Q/DQ and dynamic ONNX.
from attn_export.compress.qdq import QdqSummary, inspect_qdq
from attn_export.compress.quant_eager import EAGER_INT8_MODES, quantize_eager_
from attn_export.compress.quant_layer import quantize_dynamic_layer
from attn_export.compress.quant_onnx import (
    DYNAMIC_NOT_FOR_TENSORRT,
    INT8_ROUTES,
    QuantResult,
    check_route_for_target,
    quantize_dynamic_onnx,
)
from attn_export.compress.quant_static import (
    CALIB_METHODS,
    StaticQuantSpec,
    quantize_static_onnx,
)

__all__ = [
    "CALIB_METHODS",
    "DYNAMIC_NOT_FOR_TENSORRT",
    "EAGER_INT8_MODES",
    "INT8_ROUTES",
    "ActivationSet",
    "CalibrationData",
    "DistillConfig",
    "DistillSummary",
    "LowRankConfig",
    "LowRankLinear",
    "LowRankSummary",
    "QdqSummary",
    "QuantResult",
    "StaticQuantSpec",
    "check_route_for_target",
    "default_calibration_path",
    "distill_",
    "factorization_is_profitable",
    "generate_calibration",
    "inspect_qdq",
    "linear_flops",
    "load_calibration",
    "low_rank_",
    "output_error",
    "quantize_dynamic_layer",
    "quantize_dynamic_onnx",
    "quantize_eager_",
    "quantize_static_onnx",
]
