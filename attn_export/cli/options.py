"""Reusable CLI option groups (typer ``Annotated`` types), shared by every command.

Each group shows under its own panel in ``--help`` with its default visible. An option whose
default depends on the subject (a reference layer or a checkpoint) has no Python default
(None, so "not given" can be told apart) and shows its effective default in ``--help``.
Option names mean the same thing in every command that takes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from attn_export.cli.help import one_of  # value lists that wrap at any width, from the vocabulary
from attn_export.compress.registry import precisions, route_help
from attn_export.runtime.tensorrt.spec import HARDWARE_COMPATIBILITY
from attn_export.subjects.kinds import KINDS  # the subject-dependent defaults --help shows
from attn_export.targets.targets import TARGETS
from attn_export.vocab.choices import (ATTENTION_FORMS, ATTENTION_IMPLS, CALIB_CHOICES, CPU_INT8_ENCODINGS, INT8_QAT_SCALES,
                                       LAYER_NAMES, LOW_RANK_METHODS, LOW_RANK_TARGET_NAMES, MASK_KINDS, PER_TENSOR, POOLING_MODES)
from attn_export.vocab.precisions import precision_names

__all__ = [
    "AcceptEngineMismatchOpt",
    "AcceptPartialOpt",
    "AtolOpt",
    "CosineMinOpt",
    "RtolOpt",
    "AttentionOpt",
    "BatchOpt",
    "BuildEngineOpt",
    "BundleOpt",
    "CalibMethodOpt",
    "CalibOpt",
    "CheckpointMainOpt",
    "DModelOpt",
    "DistillOpt",
    "DlaCoreOpt",
    "GpuArchOpt",
    "HeadsOpt",
    "HwCompatOpt",
    "Int8EncodingOpt",
    "Int8FallbackOpt",
    "Int8ModeOpt",
    "Int8QatOpt",
    "Int8QatScalesOpt",
    "JsonOpt",
    "LanguagesOpt",
    "LayerOpt",
    "LayersMainOpt",
    "LowRankMethodOpt",
    "LowRankOpt",
    "LowRankTargetsOpt",
    "MaskOpt",
    "MaxLenOpt",
    "MaxMemoryOpt",
    "MaxShapeOpt",
    "MinShapeOpt",
    "LengthBucketsOpt",
    "SortWindowOpt",
    "TritonConfigOpt",
    "OpsetOpt",
    "OptLevelOpt",
    "OptShapeOpt",
    "OutOpt",
    "ForceOpt",
    "PoolingOpt",
    "PromptOpt",
    "EncoderFormOpt",
    "PrecisionOpt",
    "ProgressOpt",
    "QuantizeOpt",
    "QuietOpt",
    "RepeatsOpt",
    "SeedOpt",
    "SeqLenOpt",
    "SmoothQuantOpt",
    "TargetOpt",
    "ThreadsOpt",
    "TimingCacheOpt",
    "TritonOpt",
    "TrtVersionOpt",
    "VersionCompatOpt",
    "WarmupOpt",
    "WithTorchaoOpt",
    "WorkspaceOpt",
]

_MODEL = "Model options"


def _layer(name: str) -> str:
    """A reference layer's default for ``name``, as ``--help`` shows it: the subject kind's (``subjects/kinds.py``)."""
    return _shown(KINDS["layer"].defaults[name])


def _checkpoint(name: str) -> str:
    return _shown(KINDS["encoder"].defaults[name])


def _both(name: str) -> str:
    """A default that depends on the subject: the layer's and the checkpoint's."""
    return f"{_layer(name)} for a layer; {_checkpoint(name)} for --checkpoint"


def _shown(value: object) -> str:
    return "none" if value is None else str(value)  # none: what the option takes for "not applied" (--smoothquant none)
_EXPORT = "Export options"
_COMPARE = "Comparison options"
_OUTPUT = "Output options"

LayerOpt = Annotated[
    Optional[str],
    typer.Option("--layer", help=f"Reference layer: {one_of(LAYER_NAMES)}.", show_default=_layer("layer"), rich_help_panel=_MODEL),
]
DModelOpt = Annotated[Optional[int], typer.Option("--d-model", help="Model width of the reference layer.", show_default=_layer("d_model"), rich_help_panel=_MODEL)]
HeadsOpt = Annotated[Optional[int], typer.Option("--heads", help="Attention heads (must divide --d-model).", show_default=_layer("heads"), rich_help_panel=_MODEL)]
SeqLenOpt = Annotated[int, typer.Option("--seq-len", help="Sequence length of the latency input (and of random validation inputs).", rich_help_panel=_MODEL)]
BatchOpt = Annotated[int, typer.Option("--batch", help="Batch size of the latency input (and of validation batches).", rich_help_panel=_MODEL)]
MaskOpt = Annotated[Optional[str], typer.Option("--mask", help=f"Mask kind: {one_of(MASK_KINDS)}.", show_default=_layer("mask"), rich_help_panel=_MODEL)]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for weights and inputs (same seed, same weights).", rich_help_panel=_MODEL)]
OpsetOpt = Annotated[
    Optional[int], typer.Option("--opset", help="ONNX opset.", show_default="the target's: 18; 23 for --target tensorrt and --attention onnx-attention", rich_help_panel=_EXPORT)
]
AttentionOpt = Annotated[
    Optional[str],
    typer.Option(
        "--attention", help="Attention form: " + one_of(("auto", *ATTENTION_FORMS), {"auto": "long-seq on ort-cpu from 512 tokens, TensorRT's fused form where it has a kernel"}) + ".",
        show_default="auto", rich_help_panel=_EXPORT,
    ),
]
AttentionImplOpt = Annotated[
    str, typer.Option("--attention-impl", help="Eager reference attention: " + one_of(ATTENTION_IMPLS, {"math": "explicit, the ground truth", "sdpa": "PyTorch's fused kernel"}) + ".", rich_help_panel=_EXPORT)
]
PrecisionOpt = Annotated[str, typer.Option("--precision", help=f"Export precision: {one_of(precision_names(export_float=True))}.", rich_help_panel=_EXPORT)]
OutOpt = Annotated[Path, typer.Option("--out", help="Output directory.", rich_help_panel=_OUTPUT)]
ForceOpt = Annotated[
    bool,
    typer.Option("--force", metavar="", help="Files in the output folders (--out, --bundle, --triton) with names a run writes that attn-export did not write, and entries named like its bookkeeping (.attn-export*) that no run of attn-export made, are moved into a new folder beside each, DIR.attn-export-aside-<UTC time>/, instead of refusing the run.",
                 rich_help_panel=_OUTPUT),
]
ThreadsOpt = Annotated[
    Optional[int], typer.Option("--threads", help="Threads for eager and ONNX Runtime (the same count for both).", show_default="all cores", rich_help_panel=_COMPARE)
]
WarmupOpt = Annotated[int, typer.Option("--warmup", help="Untimed warm-up runs per variant.", rich_help_panel=_COMPARE)]
RepeatsOpt = Annotated[int, typer.Option("--repeats", help="Timed runs per variant.", rich_help_panel=_COMPARE)]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", metavar="", help="No progress output.", rich_help_panel=_OUTPUT)]
JsonOpt = Annotated[bool, typer.Option("--json", metavar="", help="Print the report as JSON on stdout instead of a table.", rich_help_panel=_OUTPUT)]
MaxMemoryOpt = Annotated[
    Optional[str],
    typer.Option("--max-memory", metavar="SIZE", help="Memory the run may use, e.g. 16G: runs whose estimated peak is larger are refused before any work.",
                 show_default="the memory available", rich_help_panel=_OUTPUT),
]
ProgressOpt = Annotated[bool, typer.Option("--progress", metavar="", help="Progress lines on stderr even when it is not a terminal (CI logs).", rich_help_panel=_OUTPUT)]

_COMPRESS = "Compression options"
_JUDGE = "Accuracy options"

AtolOpt = Annotated[Optional[list[str]], typer.Option("--atol", metavar="[OUTPUT:]VALUE", help="Max abs error bound for every output, or one (y:1e-3); repeatable, as Polygraphy's --atol.", show_default="the tolerance table's", rich_help_panel=_JUDGE)]
RtolOpt = Annotated[Optional[list[str]], typer.Option("--rtol", metavar="[OUTPUT:]VALUE", help="Relative L2 error bound for every output, or one; repeatable.", show_default="the tolerance table's", rich_help_panel=_JUDGE)]
CosineMinOpt = Annotated[Optional[list[str]], typer.Option("--cosine-min", metavar="[OUTPUT:]VALUE", help="Minimum cosine to the reference for every output, or one; repeatable.", show_default="the tolerance table's", rich_help_panel=_JUDGE)]
AcceptPartialOpt = Annotated[bool, typer.Option("--accept-partial", metavar="", help="Ship a model that meets its tolerance on the report split but fails another data set it was judged on (the shipped corpus, long texts filling --seq-len): exit 0 instead of 3 (PARTIAL), recorded in report.json.", rich_help_panel=_JUDGE)]
_DEPLOY = "Deployment options"

LowRankOpt = Annotated[
    Optional[float],
    typer.Option("--low-rank", metavar="[RATIO]", help="Low-rank factorize Q/K/V/O keeping RATIO of their parameters (alone: 0.5).", show_default="no factorization", rich_help_panel=_COMPRESS),
]
LowRankMethodOpt = Annotated[str, typer.Option("--low-rank-method", help=one_of(LOW_RANK_METHODS, {"activation": "whitened, SVD-LLM/ASVD", "svd": "plain"}) + ".", rich_help_panel=_COMPRESS)]
LowRankTargetsOpt = Annotated[Optional[str], typer.Option("--low-rank-targets", help=f"Comma list of {','.join(LOW_RANK_TARGET_NAMES)}.", show_default=_both("low_rank_targets"), rich_help_panel=_COMPRESS)]
DistillOpt = Annotated[
    Optional[int],
    typer.Option("--distill", metavar="[STEPS]", help="Distil the low-rank student from the original (alone: 200 steps).", show_default="no distillation", rich_help_panel=_COMPRESS),
]
QuantizeOpt = Annotated[Optional[str], typer.Option("--quantize", help="8-bit precision: " + one_of((*precisions(), "auto", "none"), {"fp8": "TensorRT on sm89+", "auto": "the best 8-bit format the target's GPU runs"}) + ". Every route the target can deploy is built; the one meeting the tolerance ships.", show_default="none", rich_help_panel=_COMPRESS)]
Int8ModeOpt = Annotated[str, typer.Option("--int8-mode", help=route_help(), rich_help_panel=_COMPRESS)]  # the registry's routes, each in its own words
Int8EncodingOpt = Annotated[
    str,
    typer.Option("--int8-encoding", help="ONNX Runtime CPU int8: " + one_of(CPU_INT8_ENCODINGS, {"auto": "u8u8 where this CPU's U8S8 GEMM saturates, i.e. x86 without VNNI; full-range elsewhere",
                     "reduce-range": "7-bit weights, safe in any session", "u8u8": "ORT's U8U8 kernel, session.x64quantprecision=1"}) + ".", rich_help_panel=_COMPRESS),
]
WithTorchaoOpt = Annotated[bool, typer.Option("--with-torchao", metavar="", help="Also time torchao's eager int8 (skipped by default where it is slower than fp32 on this CPU).", rich_help_panel=_COMPRESS)]
CalibOpt = Annotated[Optional[Path], typer.Option("--calib", help="Calibration data: activations (.npz/.npy/.safetensors) for a layer, a .txt file (one text per line) for a checkpoint.", show_default="the shipped set", rich_help_panel=_COMPRESS)]
CalibMethodOpt = Annotated[Optional[str], typer.Option("--calib-method", help=f"Static int8 calibration: {one_of(CALIB_CHOICES, {PER_TENSOR: 'each activation the method that quantizes it best'})}.", show_default=_both("calib_method"), rich_help_panel=_COMPRESS)]
SmoothQuantOpt = Annotated[Optional[str], typer.Option("--smoothquant", metavar="ALPHA|auto|none", help="SmoothQuant for activation outliers (int8 static and dynamic): an alpha in [0, 1], auto (searched per GEMM input, applied where it helps) or none.", show_default=_both("smoothquant"), rich_help_panel=_COMPRESS)]
Int8QatOpt = Annotated[Optional[int], typer.Option("--int8-qat", metavar="STEPS", help="Also refine the static int8 route by distillation through fake int8 (QAT-lite) for up to STEPS steps; both routes compete in the selection.", show_default="no QAT-lite", rich_help_panel=_COMPRESS)]
Int8QatScalesOpt = Annotated[str, typer.Option("--int8-qat-scales", help=f"QAT-lite activation ranges: {one_of(INT8_QAT_SCALES, {'learned': 'trained with the weights', 'frozen': 'as calibrated'})}.", rich_help_panel=_COMPRESS)]
Int8FallbackOpt = Annotated[str, typer.Option("--int8-fallback", metavar="auto|none|N", help="int8 (static and dynamic routes): keep the most sensitive GEMM groups in float (fp16 on TensorRT) until the 8-bit goal is met on the select split (auto), none, or exactly N.", rich_help_panel=_COMPRESS)]

TargetOpt = Annotated[str, typer.Option("--target", help=f"{one_of(TARGETS)} (fixes opset, attention form, precision).", rich_help_panel=_DEPLOY)]
GpuArchOpt = Annotated[Optional[str], typer.Option("--gpu-arch", help="GPU the engine is for: sm87 (Jetson Orin), sm110 (Jetson Thor), sm89 (Ada: L4, L40S), sm90 (Hopper: H100, H200), sm100 (Blackwell)...; decides FP8 and --quantize auto.", show_default="the one GPU the Jetson release runs on (10.3: sm87, 10.13: sm110), else unknown", rich_help_panel=_DEPLOY)]
TrtVersionOpt = Annotated[Optional[str], typer.Option("--trt-version", help="TensorRT version to check against.", show_default="the target's", rich_help_panel=_DEPLOY)]
MinShapeOpt = Annotated[Optional[str], typer.Option("--min-shape", help="Engine profile min BATCHxSEQ.", show_default="1x1", rich_help_panel=_DEPLOY)]
OptShapeOpt = Annotated[Optional[str], typer.Option("--opt-shape", help="Engine profile opt BATCHxSEQ.", show_default="--batch x --seq-len", rich_help_panel=_DEPLOY)]
MaxShapeOpt = Annotated[Optional[str], typer.Option("--max-shape", help="Engine profile max BATCHxSEQ.", show_default="4 x --batch by 4 x --seq-len", rich_help_panel=_DEPLOY)]
WorkspaceOpt = Annotated[Optional[str], typer.Option("--workspace", help="TensorRT workspace limit, e.g. 4G.", show_default="TensorRT's (the GPU's memory)", rich_help_panel=_DEPLOY)]
TimingCacheOpt = Annotated[Optional[str], typer.Option("--timing-cache", help="Timing-cache file reused across builds.", show_default="none", rich_help_panel=_DEPLOY)]
HwCompatOpt = Annotated[str, typer.Option("--hardware-compatibility", help=one_of(HARDWARE_COMPATIBILITY) + ".", rich_help_panel=_DEPLOY)]
VersionCompatOpt = Annotated[bool, typer.Option("--version-compatible", metavar="", help="Build a version-compatible engine.", rich_help_panel=_DEPLOY)]
OptLevelOpt = Annotated[int, typer.Option("--builder-optimization-level", help="TensorRT builder optimization level 0-5.", rich_help_panel=_DEPLOY)]
DlaCoreOpt = Annotated[Optional[int], typer.Option("--dla-core", help="DLA core (attention falls back to the GPU; static shapes).", show_default="none (GPU only)", rich_help_panel=_DEPLOY)]
BuildEngineOpt = Annotated[bool, typer.Option("--build-engine", metavar="", help="Build and validate a TensorRT engine (needs TensorRT and a GPU).", rich_help_panel=_DEPLOY)]
AcceptEngineMismatchOpt = Annotated[bool, typer.Option("--accept-engine-mismatch", metavar="", help="Keep a built engine whose inspector shows a GEMM running wider than the plan placed it (FP32 for fp16/int8) or attention unfused where the kernel table says it fuses: recorded in report.json instead of failing the run.", rich_help_panel=_DEPLOY)]
BundleOpt = Annotated[Optional[Path], typer.Option("--bundle", help="Write a Jetson bundle (model, build_engine.sh, validate_on_device.py) to DIR.", show_default="none", rich_help_panel=_DEPLOY)]
TritonOpt = Annotated[Optional[Path], typer.Option("--triton", help="Write a Triton model repository to DIR.", show_default="none", rich_help_panel=_DEPLOY)]
TritonConfigOpt = Annotated[Optional[Path], typer.Option("--triton-config", metavar="FILE", help="Your config.pbtxt for the TensorRT plan in --triton, used only if the engine's profiles can serve it (max batch, dims).", show_default="derived from the engine's profiles", rich_help_panel=_DEPLOY)]
LengthBucketsOpt = Annotated[Optional[str], typer.Option("--length-buckets", metavar="L1,L2,...", help="One engine profile per token-length bucket, e.g. 32,64,128 (TensorRT 10.x has no packed attention); the runner picks the smallest that holds a batch.", show_default="one profile", rich_help_panel=_DEPLOY)]
SortWindowOpt = Annotated[Optional[int], typer.Option("--sort-window", metavar="N", help="Texts the runner may sort by length before cutting batches (less padding, more reordering); the report gives the padding it leaves.", show_default="the batch (no reordering)", rich_help_panel=_DEPLOY)]

_CHECKPOINT = "Checkpoint options"
CheckpointMainOpt = Annotated[
    Optional[str],
    typer.Option("--checkpoint", help="BERT-family checkpoint dir (config.json, model.safetensors, tokenizer.json) or 'minilm'.", show_default="none: a reference layer", rich_help_panel=_CHECKPOINT),
]
LayersMainOpt = Annotated[Optional[str], typer.Option("--layers", help="With --checkpoint: 'all' (the whole encoder) or a layer index N.", show_default=_checkpoint("layers"), rich_help_panel=_CHECKPOINT)]
MaxLenOpt = Annotated[Optional[int], typer.Option("--max-len", help="With --checkpoint: token limit of the corpus texts.", show_default=_checkpoint("max_len"), rich_help_panel=_CHECKPOINT)]
MaxTextsOpt = Annotated[Optional[int], typer.Option("--max-texts", help="With --checkpoint: texts per corpus split (train, select, report).", show_default=_checkpoint("max_texts"), rich_help_panel=_CHECKPOINT)]
PoolingOpt = Annotated[Optional[str], typer.Option("--pooling", help=f"With --checkpoint: the sentence embedding's pooling, overriding the model's own: {one_of(POOLING_MODES)} (or several joined by +, each once).", show_default="the model's (1_Pooling/config.json), else mean", rich_help_panel=_CHECKPOINT)]
PromptOpt = Annotated[Optional[str], typer.Option("--prompt", help="With --checkpoint: the sentence-transformers prompt prepended to every text, by name (a key of prompts in config_sentence_transformers.json); '' for none.", show_default="the model's default_prompt_name, else none", rich_help_panel=_CHECKPOINT)]
EncoderFormOpt = Annotated[Optional[str], typer.Option("--encoder-form", help="With --checkpoint: how the whole encoder is exported: padded (the (batch, seq) grid), packed (real tokens only: GEMMs, LayerNorm and GELU skip the padding; attention per sequence), or auto: both on ONNX Runtime targets, the faster on the real-text batches ships (padded on TensorRT targets; packed there needs TensorRT >= 11.1).", show_default="auto", rich_help_panel=_CHECKPOINT)]
LanguagesOpt = Annotated[Optional[str], typer.Option("--languages", help="With --checkpoint: corpus languages, e.g. en,de.", show_default="all shipped", rich_help_panel=_CHECKPOINT)]
