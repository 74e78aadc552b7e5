"""The encoder job: a pretrained checkpoint through every route, judged on held-out text.

``run_encoder_pipeline(EncoderPipelineConfig(checkpoint="minilm", layers="all"))`` loads
the checkpoint, tokenizes the shipped corpus (calibration and validation texts are
disjoint), and produces one report ``Stage`` per artifact: ONNX fp32, fp16 (fp32 softmax
and LayerNorm), int8 (dynamic, static, torchao) and low-rank + distillation (alone and
then int8). The subject is the whole encoder or layer N (``layers="N"``), whose artifacts
are judged in context (see ``attn_export.checkpoint.evaluate``). Every stage reports the
sentence-embedding cosine (mean, min) and top-1 neighbour agreement against eager fp32,
and its latency at ``batch`` x ``seq_len`` side by side with eager.
"""

from __future__ import annotations

import copy
import logging
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attn_export.checkpoint.compress import low_rank_encoder_, quantize_encoder_static
from attn_export.checkpoint.evaluate import (
    ENCODER_TOLERANCES,
    EncoderTolerance,
    EncoderValidation,
    embed,
    evaluate_encoder_stage,
)
from attn_export.checkpoint.export import ENCODER_INPUT_NAMES, ENCODER_OUTPUT_NAMES, encoder_export_spec, export_encoder
from attn_export.checkpoint.loader import load_bert_checkpoint, resolve_checkpoint
from attn_export.checkpoint.text import (
    all_layer_inputs,
    load_text_corpus,
    load_tokenizer,
    text_token_splits,
    tokenize,
)
from attn_export.compress.distill import DistillConfig
from attn_export.compress.lowrank import LowRankConfig
from attn_export.compress.quant_eager import quantize_eager_
from attn_export.compress.quant_onnx import quantize_dynamic_onnx
from attn_export.compress.quant_static import StaticQuantSpec, quantize_static_onnx
from attn_export.errors import ConfigError
from attn_export.export import ExportSpec, export_onnx
from attn_export.layers.encoder import SentenceEncoder, parse_layers
from attn_export.layers.registry import MaskedLayer
from attn_export.runtime import EagerRunner, OrtRunner, SessionFromOnnx
from attn_export.runtime.base import Runner
from attn_export.validate.latency import set_threads, time_runners
from attn_export.validate.report import Report, Stage

__all__ = ["ENCODER_STAGES", "LOWRANK_INT8_TOLERANCE", "EncoderPipelineConfig", "default_encoder_distill", "run_encoder_pipeline"]

log = logging.getLogger(__name__)

ENCODER_STAGES: tuple[str, ...] = ("onnx-fp32", "onnx-fp16", "int8-dynamic", "int8-static", "int8-torchao", "lowrank", "lowrank-int8")
# low-rank then int8: the two errors add, so the bar is the product of theirs (0.99 * 0.99).
LOWRANK_INT8_TOLERANCE = EncoderTolerance(0.98, 0.9)


def default_encoder_distill() -> DistillConfig:
    """Per-layer attention distillation measured on MiniLM (Q/K at 50%): 120 steps at 1e-3 lift the
    held-out cosine from 0.9885 to 0.992; 200 steps reach 0.9925. The attention-KL term does the work."""
    return DistillConfig(steps=120, lr=1e-3, batch_size=16, attn_kl_weight=1.0, eval_every=20, patience=3, progress=False)


@dataclass
class EncoderPipelineConfig:
    """One encoder run. ``onnx-fp32`` always runs: every other ONNX route starts from it."""

    checkpoint: str = "minilm"
    layers: str = "all"
    out: Path = field(default_factory=lambda: Path("attn-export-out"))
    stages: tuple[str, ...] = ENCODER_STAGES
    max_len: int = 64  # tokens per calibration/validation text
    languages: tuple[str, ...] | None = None  # corpus languages (default: all shipped)
    batch: int = 8  # latency input shape
    seq_len: int = 128
    attention: str = "decomposed"
    opset: int | None = None
    int8_per_channel: bool = True  # per-tensor int8 weights cost MiniLM ~4 points of cosine
    static: StaticQuantSpec = field(default_factory=lambda: StaticQuantSpec(method="percentile"))
    lowrank: LowRankConfig = field(default_factory=lambda: LowRankConfig(rank_ratio=0.5, targets=("q", "k")))
    distill: DistillConfig | None = field(default_factory=default_encoder_distill)
    threads: int | None = None
    warmup: int = 2
    repeats: int = 10
    val_batch: int = 16

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        self.stages = tuple(dict.fromkeys(("onnx-fp32", *self.stages)))
        unknown = [s for s in self.stages if s not in ENCODER_STAGES]
        if unknown:
            raise ConfigError(f"expected stages from {', '.join(ENCODER_STAGES)}, got {', '.join(unknown)}")
        if "lowrank-int8" in self.stages and "lowrank" not in self.stages:
            raise ConfigError("stage lowrank-int8 quantizes the low-rank model; add the lowrank stage too")
        for name in ("max_len", "batch", "seq_len", "repeats", "val_batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"expected --{name.replace('_', '-')} >= 1, got {getattr(self, name)}")
        if self.max_len < 2 or self.warmup < 0:
            raise ConfigError(f"expected --max-len >= 2 and --warmup >= 0, got {self.max_len} and {self.warmup}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"expected --threads >= 1, got {self.threads}")
        parse_layers(self.layers, 1 << 30)  # syntax only; the depth is checked once loaded
        self.export_spec("fp32")

    def export_spec(self, precision: str) -> ExportSpec:
        return ExportSpec(attention=self.attention, opset=self.opset, precision=precision)


class _Run:
    """State shared by the stages of one run (the subject, its feeds, the output folder)."""

    def __init__(self, cfg: EncoderPipelineConfig, say: Callable[[str], None]) -> None:
        self.cfg, self.say = cfg, say
        self.threads = cfg.threads or os.cpu_count() or 1
        self.path = resolve_checkpoint(cfg.checkpoint)
        self.encoder = load_bert_checkpoint(self.path)
        self.index = parse_layers(cfg.layers, len(self.encoder.layers))
        if cfg.max_len > self.encoder.config.max_position_embeddings or cfg.seq_len > self.encoder.config.max_position_embeddings:
            raise ConfigError(f"expected --max-len and --seq-len <= {self.encoder.config.max_position_embeddings} (the checkpoint's positions)")
        self.tokenizer = load_tokenizer(self.path)
        corpus = load_text_corpus(cfg.languages)
        self.splits = text_token_splits(self.tokenizer, cfg.max_len, corpus)
        lat_texts = [corpus.val[i % len(corpus.val)] for i in range(cfg.batch)]
        self.latency_tokens = tokenize(self.tokenizer, lat_texts, cfg.seq_len, pad_to=cfg.seq_len)
        self.prefix = "encoder" if self.index is None else f"layer{self.index}"

    def subject(self, encoder: SentenceEncoder) -> nn.Module:
        return encoder.subject("all" if self.index is None else self.index)

    def runner(self, module: nn.Module, name: str) -> Runner:
        if self.index is None:
            return EagerRunner(module, ENCODER_INPUT_NAMES, ENCODER_OUTPUT_NAMES, name=name)
        return EagerRunner(module, ["x", "key_padding_mask"], ["y"], name=name)

    def ort(self, path: Path, name: str) -> Runner:
        return OrtRunner(SessionFromOnnx(path, providers=["cpu"], intra_op_threads=self.threads), name=name)

    def export(self, encoder: SentenceEncoder, path: Path, precision: str) -> Any:
        spec = encoder_export_spec(self.cfg.export_spec(precision))
        if self.index is None:
            return export_encoder(encoder, path, spec)
        return export_onnx(MaskedLayer(encoder.layers[self.index], "padding"), path, spec)

    def layer_feeds(self, encoder: SentenceEncoder, tokens: Any, batch_size: int) -> list[dict[str, np.ndarray]]:
        acts = all_layer_inputs(encoder, tokens, layers=[self.index])[self.index]
        return [{"x": acts.x[i : i + batch_size], "key_padding_mask": acts.key_padding_mask[i : i + batch_size]} for i in range(0, len(acts), batch_size)]

    def validation(self) -> EncoderValidation:
        cfg = self.cfg
        eager = self.runner(self.subject(self.encoder), "eager-fp32")
        feeds = self.splits.val.feeds(cfg.val_batch)
        ref_emb = embed(EagerRunner(self.encoder, ENCODER_INPUT_NAMES, ENCODER_OUTPUT_NAMES), feeds)
        if self.index is None:
            subject_feeds, latency_feed = feeds, self.latency_tokens.feed()
        else:
            subject_feeds = self.layer_feeds(self.encoder, self.splits.val, cfg.val_batch)
            latency_feed = self.layer_feeds(self.encoder, self.latency_tokens, cfg.batch)[0]
        subject_refs = [eager.infer(f) for f in subject_feeds]
        self.say(f"timing eager fp32 at batch {cfg.batch} x seq {cfg.seq_len} ({cfg.repeats} runs, {self.threads} threads)")
        eager_latency = time_runners({"eager": eager}, latency_feed, cfg.warmup, cfg.repeats, cfg.batch)["eager"]
        return EncoderValidation(self.encoder, feeds, ref_emb, eager, subject_feeds, subject_refs, latency_feed,
                                 eager_latency, self.index, cfg.warmup, cfg.repeats, cfg.batch)  # fmt: skip


def _environment(threads: int) -> dict[str, Any]:
    import onnxruntime

    return {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpu_count": os.cpu_count(), "threads": threads}  # fmt: skip


def run_encoder_pipeline(cfg: EncoderPipelineConfig, progress: Callable[[str], None] | None = None) -> Report:
    """Run every configured stage on the checkpoint; writes the artifacts and ``report.json`` to ``cfg.out``."""
    say = progress or log.info
    cfg.out.mkdir(parents=True, exist_ok=True)
    run = _Run(cfg, say)
    set_threads(run.threads)
    enc, c = run.encoder, run.encoder.config
    say(f"loaded {run.path}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads} heads; subject {run.prefix}")
    model = {
        "layer": f"sentence-encoder[{run.prefix}]",  # the keys the CLI summary reads
        "d_model": c.hidden_size,
        "heads": c.num_attention_heads,
        "checkpoint": str(run.path),
        "name": cfg.checkpoint,
        "layers": cfg.layers,
        "num_layers": c.num_hidden_layers,
        "params": sum(p.numel() for p in enc.parameters()),
        "subject_params": sum(p.numel() for p in run.subject(enc).parameters()),
    }
    inputs = {
        "data": run.splits.source,
        "calib_texts": len(run.splits.calib),
        "val_texts": len(run.splits.val),
        "max_len": cfg.max_len,
        "latency_batch": cfg.batch,
        "latency_seq_len": cfg.seq_len,
    }
    report = Report(model=model, inputs=inputs, environment=_environment(run.threads))
    ctx = run.validation()

    def add(
        name: str, runner: Runner, artifact: Path | None, precision: str, tolerance: EncoderTolerance, details: dict[str, Any], params: int | None = None
    ) -> Stage:
        size = artifact.stat().st_size if artifact is not None else None
        stage = evaluate_encoder_stage(name, runner, ctx, precision=precision, tolerance=tolerance,
                                       artifact=None if artifact is None else str(artifact), size_bytes=size, params=params, progress=say)  # fmt: skip
        stage.details.update(details)
        report.add(stage)
        report.write(cfg.out / "report.json")  # after every stage: a long run leaves partial results
        return stage

    subject_params = report.model["subject_params"]
    fp32_path = cfg.out / f"{run.prefix}.onnx"
    say(f"exporting {fp32_path} (fp32, {cfg.attention})")
    result = run.export(enc, fp32_path, "fp32")
    add("onnx-fp32", run.ort(fp32_path, "ort-fp32"), fp32_path, "fp32", ENCODER_TOLERANCES["fp32"], {"export": result.to_dict()}, subject_params)
    if "onnx-fp16" in cfg.stages:
        path = cfg.out / f"{run.prefix}-fp16.onnx"
        say(f"exporting {path} (fp16, softmax and LayerNorm in fp32)")
        result = run.export(enc, path, "fp16")
        add("onnx-fp16", run.ort(path, "ort-fp16"), path, "fp16", ENCODER_TOLERANCES["fp16"], {"export": result.to_dict()}, subject_params)
    if "int8-dynamic" in cfg.stages:
        path = cfg.out / f"{run.prefix}-int8-dynamic.onnx"
        say(f"quantizing {path} (dynamic int8, per-{'channel' if cfg.int8_per_channel else 'tensor'} weights)")
        q = quantize_dynamic_onnx(fp32_path, path, per_channel=cfg.int8_per_channel)
        add("int8-dynamic", run.ort(path, "ort-int8-dynamic"), path, "int8", ENCODER_TOLERANCES["int8"], {"quantization": q.to_dict()}, subject_params)
    if "int8-static" in cfg.stages:
        path = cfg.out / f"{run.prefix}-int8-static.onnx"
        say(f"quantizing {path} (static int8, {cfg.static.method} calibration on the calibration texts)")
        if run.index is None:
            q = quantize_encoder_static(fp32_path, path, run.splits.calib, cfg.static)
        else:
            q = quantize_static_onnx(fp32_path, path, all_layer_inputs(enc, run.splits.calib, layers=[run.index])[run.index], cfg.static)
        add("int8-static", run.ort(path, "ort-int8-static"), path, "int8", ENCODER_TOLERANCES["int8"], {"quantization": q.to_dict()}, subject_params)
    if "int8-torchao" in cfg.stages:
        say("quantizing the eager model with torchao (int8 dynamic activations, int8 weights)")
        quantized = quantize_eager_(run.subject(enc), "int8-dynamic")
        add(
            "int8-torchao",
            run.runner(quantized, "torchao-int8"),
            None,
            "int8",
            ENCODER_TOLERANCES["int8"],
            {"quantization": {"route": "torchao", "mode": "int8-dynamic"}},
            subject_params,
        )
    if "lowrank" in cfg.stages:
        say(f"low-rank {','.join(cfg.lowrank.targets)} at rank ratio {cfg.lowrank.rank_ratio} ({cfg.lowrank.method})"
            + (f" + distillation ({cfg.distill.steps} steps per layer)" if cfg.distill else ""))  # fmt: skip
        student = copy.deepcopy(enc)
        summary = low_rank_encoder_(student, enc, run.splits.calib, cfg.lowrank, cfg.distill, None if run.index is None else [run.index])
        path = cfg.out / f"{run.prefix}-lowrank.onnx"
        result = run.export(student, path, "fp32")
        params = sum(p.numel() for p in run.subject(student).parameters())
        add(
            "lowrank",
            run.ort(path, "ort-lowrank"),
            path,
            "fp32",
            ENCODER_TOLERANCES["lowrank"],
            {"low_rank": summary.to_dict(), "export": result.to_dict()},
            params,
        )
        if "lowrank-int8" in cfg.stages:
            qpath = cfg.out / f"{run.prefix}-lowrank-int8.onnx"
            q = quantize_dynamic_onnx(path, qpath, per_channel=cfg.int8_per_channel)
            add(
                "lowrank-int8",
                run.ort(qpath, "ort-lowrank-int8"),
                qpath,
                "int8",
                LOWRANK_INT8_TOLERANCE,
                {"quantization": q.to_dict(), "low_rank": {"replaced_ratio": summary.replaced_ratio}},
                params,
            )
    report.notes.append(
        "accuracy: sentence_embedding vs eager fp32 on the validation texts (never used for calibration, "
        "distillation or early stopping); details.embedding: per-text mean/min cosine and top-1 neighbour agreement"
    )
    report.write(cfg.out / "report.json")
    return report
