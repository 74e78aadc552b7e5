"""Compression: calibration data, low-rank factorization, distillation and 8-bit quantization.

Each family has one in-place entry point driven by a config dataclass, torchao-style:
``low_rank_(model, LowRankConfig(rank_ratio=0.5), calib)``, ``distill_(student, teacher,
calib, val, DistillConfig())``, ``quantize_eager_(model, mode)``. The pipeline reaches them
through the method registry (``compress.registry``). Names load lazily (PEP 562): the
registry is read while flags are validated, before torch is imported.
"""

from __future__ import annotations

from attn_export.host.lazy import lazy_exports

_WHERE = {
    "ActivationSet": "calib.data", "CalibrationData": "calib.data", "default_calibration_path": "calib.data",
    "generate_calibration": "calib.generate", "load_calibration": "calib.data",
    "DistillConfig": "distill", "DistillSummary": "distill", "distill_": "distill", "output_error": "distill",
    "LowRankConfig": "lowrank", "LowRankLinear": "lowrank", "LowRankSummary": "lowrank", "factorization_is_profitable": "lowrank",
    "linear_flops": "lowrank", "low_rank_": "lowrank",
    "QdqSummary": "quant.qdq", "inspect_qdq": "quant.qdq", "EAGER_INT8_MODES": "quant.eager", "quantize_eager_": "quant.eager",
    "QuantResult": "quant.onnx", "quantize_dynamic_onnx": "quant.onnx", "StaticQuantSpec": "quant.static", "quantize_static_onnx": "quant.static",
}  # fmt: skip
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
