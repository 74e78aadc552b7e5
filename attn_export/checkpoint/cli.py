"""``attn-export encoder``: a pretrained checkpoint through every route, from the command line.

Registered on the main typer app with ``register(app)``. The option groups are the main
command's (``attn_export.cli_options``) plus a "Checkpoint options" panel.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Optional

import typer

from attn_export.cli_options import (
    AttentionOpt,
    BatchOpt,
    JsonOpt,
    OpsetOpt,
    OutOpt,
    QuietOpt,
    RepeatsOpt,
    SeqLenOpt,
    ThreadsOpt,
    WarmupOpt,
)
from attn_export.errors import ConfigError

__all__ = ["encoder_config_from_main", "register"]

log = logging.getLogger(__name__)

_CKPT = "Checkpoint options"

CheckpointOpt = Annotated[
    str, typer.Option("--checkpoint", help="Checkpoint directory (config.json, model.safetensors, tokenizer.json) or 'minilm'.", rich_help_panel=_CKPT)
]
LayersOpt = Annotated[str, typer.Option("--layers", help="Subject: 'all' (the whole encoder) or a layer index N.", rich_help_panel=_CKPT)]
StagesOpt = Annotated[
    str,
    typer.Option("--stages", help="Comma-separated: onnx-fp32,onnx-fp16,int8-dynamic,int8-static,int8-torchao,lowrank,lowrank-int8.", rich_help_panel=_CKPT),
]
MaxLenOpt = Annotated[int, typer.Option("--max-len", help="Token limit of the calibration/validation texts.", rich_help_panel=_CKPT)]
DistillStepsOpt = Annotated[int, typer.Option("--distill-steps", help="Distillation steps per layer after low-rank (0 = none).", rich_help_panel=_CKPT)]
LanguagesOpt = Annotated[Optional[str], typer.Option("--languages", help="Corpus languages, e.g. en,zh (default: all shipped).", rich_help_panel=_CKPT)]


def register(app: typer.Typer) -> None:
    """Add the ``encoder`` subcommand to ``app``."""

    @app.command("encoder")
    def encoder(
        checkpoint: CheckpointOpt = "minilm",
        layers: LayersOpt = "all",
        stages: StagesOpt = "onnx-fp32,onnx-fp16,int8-dynamic,int8-static,int8-torchao,lowrank,lowrank-int8",
        max_len: MaxLenOpt = 64,
        distill_steps: DistillStepsOpt = 120,
        languages: LanguagesOpt = None,
        seq_len: SeqLenOpt = 128,
        batch: BatchOpt = 8,
        attention: AttentionOpt = "decomposed",
        opset: OpsetOpt = None,
        out: OutOpt = Path("attn-export-out"),
        threads: ThreadsOpt = None,
        warmup: WarmupOpt = 2,
        repeats: RepeatsOpt = 10,
        quiet: QuietOpt = False,
        as_json: JsonOpt = False,
    ) -> None:
        """Load a BERT-family checkpoint, export and compress it, judge every artifact on held-out text."""
        from dataclasses import replace

        from rich.console import Console

        from attn_export.checkpoint.pipeline import EncoderPipelineConfig, default_encoder_distill, run_encoder_pipeline
        from attn_export.cli import finish

        err = Console(stderr=True)
        distill = replace(default_encoder_distill(), steps=distill_steps) if distill_steps > 0 else None
        cfg = EncoderPipelineConfig(
            checkpoint=checkpoint, layers=layers, out=out, stages=tuple(s.strip() for s in stages.split(",") if s.strip()),
            max_len=max_len, languages=tuple(languages.split(",")) if languages else None, batch=batch, seq_len=seq_len,
            attention=attention, opset=opset, threads=threads, warmup=warmup, repeats=repeats, distill=distill,
        )  # fmt: skip
        progress = None if quiet or as_json else (lambda msg: err.print(f"[dim]•[/dim] {msg}"))
        report = run_encoder_pipeline(cfg, progress=progress or (lambda msg: None))
        finish(report, cfg.out, as_json)


def encoder_config_from_main(
    *,
    checkpoint: str,
    layers: str,
    out: Path,
    precision: str,
    quantize: str | None,
    int8_mode: str,
    low_rank: float | None,
    low_rank_method: str,
    low_rank_targets: str | None,
    distill: int | None,
    calib_method: str,
    attention: str | None,
    opset: int | None,
    batch: int,
    seq_len: int,
    threads: int | None,
    warmup: int,
    repeats: int,
    target: str,
):  # type: ignore[no-untyped-def]
    """Map the main command's flags (``attn-export --checkpoint minilm --quantize int8 ...``) onto
    the encoder pipeline's stages, so one set of flags drives both subjects."""
    from dataclasses import replace

    from attn_export.checkpoint.pipeline import EncoderPipelineConfig, default_encoder_distill
    from attn_export.compress import LowRankConfig, StaticQuantSpec

    if target != "ort-cpu":
        raise ConfigError(f"--checkpoint runs validate on ONNX Runtime CPU; drop --target {target} (export the ONNX, then use check-trt)")
    if quantize not in (None, "int8"):
        raise ConfigError(f"expected --quantize int8, got {quantize!r}")
    if distill is not None and low_rank is None:
        raise ConfigError("--distill trains a compressed student; add --low-rank RATIO")
    stages = ["onnx-fp32"]
    if precision == "fp16":
        stages.append("onnx-fp16")
    if quantize:
        routes = {"auto": ("int8-dynamic", "int8-static", "int8-torchao")}.get(int8_mode, (f"int8-{int8_mode}",))
        stages.extend(routes)
    lowrank_cfg = LowRankConfig(rank_ratio=0.5, targets=("q", "k"))
    if low_rank is not None:
        targets = tuple(t.strip() for t in (low_rank_targets or "q,k").split(","))
        lowrank_cfg = LowRankConfig(rank_ratio=low_rank, method=low_rank_method, targets=targets)
        stages.append("lowrank")
        if quantize:
            stages.append("lowrank-int8")
    distill_cfg = replace(default_encoder_distill(), steps=distill) if distill else None
    return EncoderPipelineConfig(
        checkpoint=checkpoint, layers=layers, out=out, stages=tuple(stages), batch=batch, seq_len=seq_len,
        attention=attention or "decomposed", opset=opset, threads=threads, warmup=warmup, repeats=repeats,
        lowrank=lowrank_cfg, distill=distill_cfg, static=StaticQuantSpec(method=calib_method if calib_method != "minmax" else "percentile"),
    )  # fmt: skip
