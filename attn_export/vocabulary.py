"""The words the toolkit's options and reports use, defined once.

Every module that takes a precision, an int8 mode or a calibration method imports the
``Literal`` type and the tuple of allowed values from here, so ``--int8-mode`` means the
same thing in the CLI, the plan, the sweep and the bench, and a new value is added in one
place.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "CALIB_METHODS",
    "CPU_INT8_ENCODINGS",
    "CalibMethod",
    "EXPORT_PRECISIONS",
    "INT8_MODES",
    "INT8_ROUTES",
    "Int8Mode",
    "Int8Route",
    "LOW_RANK_METHODS",
    "LOW_RANK_TARGET_NAMES",
    "PRECISIONS",
    "Precision",
    "SUBJECT_KINDS",
    "SubjectKind",
]

Precision = Literal["fp32", "fp16", "int8"]
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8")
# What an ONNX export is written in (int8 models are quantized *from* an fp32 export).
EXPORT_PRECISIONS: tuple[str, ...] = ("fp32", "fp16")

# --int8-mode: which int8 routes to build. "auto" = every route the target can deploy.
Int8Mode = Literal["auto", "static", "dynamic", "torchao"]
INT8_MODES: tuple[str, ...] = ("auto", "static", "dynamic", "torchao")
# The routes themselves: static Q/DQ (TensorRT's), dynamic (ONNX Runtime CPU), torchao (eager).
Int8Route = Literal["static", "dynamic", "torchao"]
INT8_ROUTES: tuple[str, ...] = ("static", "dynamic", "torchao")

# Static calibration: how an activation's range is chosen from the calibration split.
CalibMethod = Literal["minmax", "percentile", "entropy"]
CALIB_METHODS: tuple[str, ...] = ("minmax", "percentile", "entropy")

# How int8 weights are stored for ONNX Runtime CPU (compress/int8_encoding.py).
CPU_INT8_ENCODINGS: tuple[str, ...] = ("auto", "full-range", "reduce-range", "u8u8")

LOW_RANK_METHODS: tuple[str, ...] = ("activation", "svd")
LOW_RANK_TARGET_NAMES: tuple[str, ...] = ("q", "k", "v", "o", "ffn")

# What the pipeline compresses and judges: a reference layer or a pretrained encoder.
SubjectKind = Literal["layer", "encoder"]
SUBJECT_KINDS: tuple[str, ...] = ("layer", "encoder")
