"""The main command: ``attn-export [OPTIONS]`` runs the one pipeline on a layer or a checkpoint.

With no options it exports the default TransformerLayer, validates it against eager PyTorch
on ONNX Runtime CPU and writes ``model.onnx``, ``report.json``, ``report.md`` and
``report.html``. ``--checkpoint DIR|minilm`` makes a pretrained encoder the subject; every
other option means the same for both subjects or is refused before any work (see
``attn_export.config.run``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from attn_export.cli.options import (
    AtolOpt,
    AttentionImplOpt,
    AttentionOpt,
    BatchOpt,
    BuildEngineOpt,
    BundleOpt,
    CalibMethodOpt,
    CalibOpt,
    CheckpointMainOpt,
    CosineMinOpt,
    DistillOpt,
    DlaCoreOpt,
    DModelOpt,
    EncoderFormOpt,
    ForceOpt,
    GpuArchOpt,
    HeadsOpt,
    HwCompatOpt,
    Int8EncodingOpt,
    Int8FallbackOpt,
    Int8ModeOpt,
    Int8QatOpt,
    Int8QatScalesOpt,
    JsonOpt,
    LanguagesOpt,
    LayerOpt,
    LayersMainOpt,
    LowRankMethodOpt,
    LowRankOpt,
    LowRankTargetsOpt,
    MaskOpt,
    MaxLenOpt,
    MaxMemoryOpt,
    MaxShapeOpt,
    MaxTextsOpt,
    MinShapeOpt,
    OpsetOpt,
    OptLevelOpt,
    OptShapeOpt,
    OutOpt,
    PoolingOpt,
    PrecisionOpt,
    ProgressOpt,
    PromptOpt,
    QuantizeOpt,
    QuietOpt,
    RepeatsOpt,
    RtolOpt,
    SeedOpt,
    SeqLenOpt,
    SmoothQuantOpt,
    TargetOpt,
    ThreadsOpt,
    TimingCacheOpt,
    TritonOpt,
    TrtVersionOpt,
    VersionCompatOpt,
    WarmupOpt,
    WithTorchaoOpt,
    WorkspaceOpt,
)

__all__ = ["config_from_options", "register", "run_main"]

# Options that only shape the terminal output; everything else becomes a RunConfig field.
OUTPUT_ONLY = ("quiet", "as_json", "progress")
# Engine options map into EngineSpec (RunConfig.engine); the rest map 1:1 onto RunConfig.
TOLERANCE_OPTIONS = {"atol": "atol", "rtol": "rtol", "cosine_min": "cosine-min"}
ENGINE_OPTIONS = ("min_shape", "opt_shape", "max_shape", "workspace", "timing_cache", "hardware_compatibility",
                  "version_compatible", "builder_optimization_level", "dla_core")  # fmt: skip


def config_from_options(options: dict[str, Any]) -> Any:
    """The ``RunConfig`` for the main command's parsed options (validated on construction)."""
    from attn_export.cli.check_trt import engine_spec_from_options
    from attn_export.config.run import RunConfig
    from attn_export.host.memory import parse_bytes
    from attn_export.validate.tolerances import parse_tolerance_overrides
    from attn_export.vocab.precisions import check_export_precision, engine_precision

    opts = {k: v for k, v in options.items() if k not in OUTPUT_ONLY}
    opts["max_memory"] = parse_bytes(opts.get("max_memory"), "--max-memory")
    tolerances = parse_tolerance_overrides({flag: opts.pop(name, None) for name, flag in TOLERANCE_OPTIONS.items()})
    opts["tolerance_overrides"] = tolerances or None
    engine_args = {k: opts.pop(k) for k in ENGINE_OPTIONS}
    check_export_precision(opts.get("precision", "fp32"))  # before the engine spec, which would name the engine instead
    engine = engine_spec_from_options(
        precision=engine_precision(opts.get("quantize"), opts.get("precision", "fp32")),
        min_shape=engine_args["min_shape"], opt_shape=engine_args["opt_shape"], max_shape=engine_args["max_shape"],
        workspace=engine_args["workspace"], timing_cache=engine_args["timing_cache"],
        hardware_compatibility=engine_args["hardware_compatibility"], version_compatible=engine_args["version_compatible"],
        optimization_level=engine_args["builder_optimization_level"], dla_core=engine_args["dla_core"],
    )  # fmt: skip
    return RunConfig(**opts, engine=engine)


def run_main(options: dict[str, Any]) -> int:
    """Validate, run, print the summary; returns the exit code (1 when a required stage failed)."""
    from attn_export.cli._common import err_console, progress_lines
    from attn_export.host.signals import raise_if_interrupted

    cfg = config_from_options(options)
    quiet, as_json = options["quiet"], options["as_json"]
    say = progress_lines(not (quiet or as_json) and (options["progress"] or sys.stderr.isatty()))
    from attn_export.pipeline.runner import run

    def step(msg: str) -> None:  # every stage boundary: stop if an interrupt was swallowed on the way
        raise_if_interrupted()
        if say is not None:
            say(msg)

    raise_if_interrupted()
    result = run(cfg, step, quiet=quiet or as_json)
    from attn_export.cli.summary import finish

    return finish(result, cfg, as_json, quiet, err_console if say else None)


def register(app: typer.Typer) -> None:
    """The main command is the app's callback (it runs when no subcommand is given)."""

    @app.callback(invoke_without_command=True)
    def attn_export(
        ctx: typer.Context,
        checkpoint: CheckpointMainOpt = None,
        layers: LayersMainOpt = None,
        max_len: MaxLenOpt = None,
        max_texts: MaxTextsOpt = None,
        languages: LanguagesOpt = None,
        pooling: PoolingOpt = None,
        prompt: PromptOpt = None,
        encoder_form: EncoderFormOpt = None,
        layer: LayerOpt = None,
        d_model: DModelOpt = None,
        heads: HeadsOpt = None,
        mask: MaskOpt = None,
        seq_len: SeqLenOpt = 128,
        batch: BatchOpt = 8,
        seed: SeedOpt = 0,
        opset: OpsetOpt = None,
        attention: AttentionOpt = None,
        attention_impl: AttentionImplOpt = "math",
        precision: PrecisionOpt = "fp32",
        out: OutOpt = Path("attn-export-out"),
        force: ForceOpt = False,
        threads: ThreadsOpt = None,
        warmup: WarmupOpt = 3,
        repeats: RepeatsOpt = 20,
        quiet: QuietOpt = False,
        as_json: JsonOpt = False,
        progress: ProgressOpt = False,
        max_memory: MaxMemoryOpt = None,
        low_rank: LowRankOpt = None,
        low_rank_method: LowRankMethodOpt = "activation",
        low_rank_targets: LowRankTargetsOpt = None,
        distill: DistillOpt = None,
        quantize: QuantizeOpt = None,
        int8_mode: Int8ModeOpt = "auto",
        int8_encoding: Int8EncodingOpt = "auto",
        with_torchao: WithTorchaoOpt = False,
        calib: CalibOpt = None,
        calib_method: CalibMethodOpt = None,
        smoothquant: SmoothQuantOpt = None,
        int8_fallback: Int8FallbackOpt = "auto",
        int8_qat: Int8QatOpt = None,
        int8_qat_scales: Int8QatScalesOpt = "learned",
        target: TargetOpt = "ort-cpu",
        trt_version: TrtVersionOpt = None,
        gpu_arch: GpuArchOpt = None,
        min_shape: MinShapeOpt = None,
        opt_shape: OptShapeOpt = None,
        max_shape: MaxShapeOpt = None,
        workspace: WorkspaceOpt = None,
        timing_cache: TimingCacheOpt = None,
        hardware_compatibility: HwCompatOpt = "none",
        version_compatible: VersionCompatOpt = False,
        builder_optimization_level: OptLevelOpt = 3,
        dla_core: DlaCoreOpt = None,
        build_engine: BuildEngineOpt = False,
        bundle: BundleOpt = None,
        triton: TritonOpt = None,
        atol: AtolOpt = None,
        rtol: RtolOpt = None,
        cosine_min: CosineMinOpt = None,
    ) -> None:
        """Export a layer or a checkpoint to ONNX, compress it, validate every artifact against eager PyTorch, and report."""
        if ctx.invoked_subcommand is not None:
            return
        options = {k: v for k, v in locals().items() if k not in ("ctx",)}
        code = run_main(options)
        if code:
            raise typer.Exit(code=code)
