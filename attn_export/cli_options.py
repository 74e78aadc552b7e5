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
