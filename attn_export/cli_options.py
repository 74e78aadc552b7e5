"""Reusable CLI option groups (typer ``Annotated`` types), shared by the main job, bench and sweep.

Each group shows under its own panel in ``--help`` with its default visible.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

__all__ = [
    "LayerOpt",
    "DModelOpt",
    "HeadsOpt",
    "SeqLenOpt",
    "BatchOpt",
    "MaskOpt",
    "SeedOpt",
    "OpsetOpt",
    "AttentionOpt",
    "PrecisionOpt",
    "OutOpt",
    "ThreadsOpt",
    "WarmupOpt",
    "RepeatsOpt",
    "QuietOpt",
    "JsonOpt",
]

_MODEL = "Model options"
_EXPORT = "Export options"
_COMPARE = "Comparison options"
_OUTPUT = "Output options"

LayerOpt = Annotated[
    str, typer.Option("--layer", help="Reference layer: transformer|mha|self-attention|block-sparse|linear.", rich_help_panel=_MODEL)
]
DModelOpt = Annotated[int, typer.Option("--d-model", help="Model width.", rich_help_panel=_MODEL)]
HeadsOpt = Annotated[int, typer.Option("--heads", help="Attention heads (must divide --d-model).", rich_help_panel=_MODEL)]
SeqLenOpt = Annotated[int, typer.Option("--seq-len", help="Sequence length of validation/latency inputs.", rich_help_panel=_MODEL)]
BatchOpt = Annotated[int, typer.Option("--batch", help="Batch size of validation/latency inputs.", rich_help_panel=_MODEL)]
MaskOpt = Annotated[str, typer.Option("--mask", help="Mask kind: none|padding|causal|window.", rich_help_panel=_MODEL)]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for weights and inputs (same seed, same weights).", rich_help_panel=_MODEL)]
OpsetOpt = Annotated[
    Optional[int], typer.Option("--opset", help="ONNX opset (default: 18, or 23 for onnx-attention).", rich_help_panel=_EXPORT)
]
AttentionOpt = Annotated[
    str, typer.Option("--attention", help="Attention form: decomposed|onnx-attention|ort-contrib.", rich_help_panel=_EXPORT)
]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="Export precision: fp32|fp16.", rich_help_panel=_EXPORT)]
OutOpt = Annotated[Path, typer.Option("--out", help="Output directory.", rich_help_panel=_OUTPUT)]
ThreadsOpt = Annotated[
    Optional[int], typer.Option("--threads", help="Threads for eager and ONNX Runtime (default: all cores).", rich_help_panel=_COMPARE)
]
WarmupOpt = Annotated[int, typer.Option("--warmup", help="Untimed warm-up runs per variant.", rich_help_panel=_COMPARE)]
RepeatsOpt = Annotated[int, typer.Option("--repeats", help="Timed runs per variant.", rich_help_panel=_COMPARE)]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress output.", rich_help_panel=_OUTPUT)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout instead of a table.", rich_help_panel=_OUTPUT)]

_COMPRESS = "Compression options"
_DEPLOY = "Deployment options"

LowRankOpt = Annotated[
    Optional[float],
    typer.Option("--low-rank", metavar="[RATIO]", help="Low-rank factorize Q/K/V/O keeping RATIO of their parameters (alone: 0.5).", rich_help_panel=_COMPRESS),
]
LowRankMethodOpt = Annotated[str, typer.Option("--low-rank-method", help="activation (whitened, SVD-LLM/ASVD) | svd (plain).", rich_help_panel=_COMPRESS)]
LowRankTargetsOpt = Annotated[Optional[str], typer.Option("--low-rank-targets", help="Comma list of q,k,v,o,ffn (default: q,k,v,o; q,k for --checkpoint).", rich_help_panel=_COMPRESS)]
DistillOpt = Annotated[
    Optional[int],
    typer.Option("--distill", metavar="[STEPS]", help="Distil the low-rank student from the original layer (alone: 200 steps).", rich_help_panel=_COMPRESS),
]
QuantizeOpt = Annotated[Optional[str], typer.Option("--quantize", help="int8: quantize and pick the fastest route meeting the int8 tolerance.", rich_help_panel=_COMPRESS)]
Int8ModeOpt = Annotated[str, typer.Option("--int8-mode", help="auto | static (Q/DQ) | dynamic (ORT CPU) | torchao (eager).", rich_help_panel=_COMPRESS)]
CalibOpt = Annotated[Optional[Path], typer.Option("--calib", help="Calibration data (.npz/.npy/.safetensors) (default: the shipped set).", rich_help_panel=_COMPRESS)]
CalibMethodOpt = Annotated[str, typer.Option("--calib-method", help="Static int8 calibration: minmax | percentile | entropy.", rich_help_panel=_COMPRESS)]
SmoothQuantOpt = Annotated[Optional[float], typer.Option("--smoothquant", metavar="ALPHA", help="SmoothQuant alpha for activation outliers (static int8).", rich_help_panel=_COMPRESS)]

TargetOpt = Annotated[str, typer.Option("--target", help="ort-cpu | ort-cuda | tensorrt | jetson (fixes opset, attention form, precision).", rich_help_panel=_DEPLOY)]
TrtVersionOpt = Annotated[Optional[str], typer.Option("--trt-version", help="TensorRT version to check against (default: the target's).", rich_help_panel=_DEPLOY)]
MinShapeOpt = Annotated[Optional[str], typer.Option("--min-shape", help="Engine profile min BATCHxSEQ (default 1x1).", rich_help_panel=_DEPLOY)]
OptShapeOpt = Annotated[Optional[str], typer.Option("--opt-shape", help="Engine profile opt BATCHxSEQ (default --batch x --seq-len).", rich_help_panel=_DEPLOY)]
MaxShapeOpt = Annotated[Optional[str], typer.Option("--max-shape", help="Engine profile max BATCHxSEQ (default 4x the opt shape).", rich_help_panel=_DEPLOY)]
WorkspaceOpt = Annotated[Optional[str], typer.Option("--workspace", help="TensorRT workspace limit, e.g. 4G.", rich_help_panel=_DEPLOY)]
TimingCacheOpt = Annotated[Optional[str], typer.Option("--timing-cache", help="Timing-cache file reused across builds.", rich_help_panel=_DEPLOY)]
HwCompatOpt = Annotated[str, typer.Option("--hardware-compatibility", help="none | ampere+ | same-compute-capability.", rich_help_panel=_DEPLOY)]
VersionCompatOpt = Annotated[bool, typer.Option("--version-compatible", help="Build a version-compatible engine.", rich_help_panel=_DEPLOY)]
OptLevelOpt = Annotated[int, typer.Option("--builder-optimization-level", help="TensorRT builder optimization level 0-5.", rich_help_panel=_DEPLOY)]
DlaCoreOpt = Annotated[Optional[int], typer.Option("--dla-core", help="DLA core (attention falls back to the GPU; static shapes).", rich_help_panel=_DEPLOY)]
BuildEngineOpt = Annotated[bool, typer.Option("--build-engine", help="Build and validate a TensorRT engine (needs TensorRT and a GPU).", rich_help_panel=_DEPLOY)]
BundleOpt = Annotated[Optional[Path], typer.Option("--bundle", help="Write a Jetson bundle (model, build_engine.sh, validate_on_device.py) to DIR.", rich_help_panel=_DEPLOY)]
TritonOpt = Annotated[Optional[Path], typer.Option("--triton", help="Write a Triton model repository to DIR.", rich_help_panel=_DEPLOY)]

_CHECKPOINT = "Checkpoint options"
CheckpointMainOpt = Annotated[
    Optional[str],
    typer.Option("--checkpoint", help="BERT-family checkpoint dir (config.json, model.safetensors, tokenizer.json) or 'minilm'.", rich_help_panel=_CHECKPOINT),
]
LayersMainOpt = Annotated[str, typer.Option("--layers", help="With --checkpoint: 'all' (the whole encoder) or a layer index N.", rich_help_panel=_CHECKPOINT)]
