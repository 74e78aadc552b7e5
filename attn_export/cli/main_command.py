"""The main command: ``attn-export [OPTIONS]`` runs the one pipeline on a layer or a checkpoint.

With no options it exports the default TransformerLayer, validates it against eager PyTorch
on ONNX Runtime CPU and writes ``model.onnx``, ``report.json``, ``report.md`` and
``report.html``. ``--checkpoint DIR|minilm`` makes a pretrained encoder the subject; every
other option means the same for both subjects or is refused before any work (see
``attn_export.config.run``).
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from attn_export.cli.check_trt import engine_default
from attn_export.cli.options import (
    AcceptEngineMismatchOpt,
    AcceptPartialOpt,
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
    LengthBucketsOpt,
    SortWindowOpt,
    TritonConfigOpt,
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
from attn_export.config.run import run_default  # light: the defaults are RunConfig's (engine options: EngineSpec's)

__all__ = ["config_from_options", "register", "run_main"]

# Options that only shape the terminal output; everything else becomes a RunConfig field.
OUTPUT_ONLY = ("quiet", "as_json", "progress")
TOLERANCE_OPTIONS = {"atol": "atol", "rtol": "rtol", "cosine_min": "cosine-min"}
# Engine options map into EngineSpec (RunConfig.engine), option -> its EngineSpec field; the rest map 1:1 onto RunConfig.
ENGINE_OPTIONS = {"min_shape": "profiles", "opt_shape": "profiles", "max_shape": "profiles", "workspace": "workspace_bytes",
                  "timing_cache": "timing_cache", "hardware_compatibility": "hardware_compatibility", "version_compatible": "version_compatible",
                  "builder_optimization_level": "optimization_level", "dla_core": "dla_core",
                  "length_buckets": "length_buckets", "sort_window": "sort_window"}  # fmt: skip


def config_from_options(options: dict[str, Any]) -> Any:
    """The ``RunConfig`` for the main command's parsed options (validated on construction)."""
    from attn_export.cli.check_trt import engine_spec_from_options
    from attn_export.config.run import RunConfig
    from attn_export.host.memory import parse_bytes
    from attn_export.validate.tolerances import parse_tolerance_overrides
    from attn_export.vocab.precisions import check_export_precision

    opts = {k: v for k, v in options.items() if k not in OUTPUT_ONLY}
    opts["max_memory"] = parse_bytes(opts.get("max_memory"), "--max-memory")
    tolerances = parse_tolerance_overrides({flag: opts.pop(name, None) for name, flag in TOLERANCE_OPTIONS.items()})
    opts["tolerance_overrides"] = tolerances or None
    engine_args = {k: opts.pop(k) for k in ENGINE_OPTIONS}
    check_export_precision(opts.get("precision", run_default("precision")))  # before the engine spec, which would name the engine instead
    engine = engine_spec_from_options(  # the engine's precision is the plan's (Plan.engine_precision), set at deploy
        min_shape=engine_args["min_shape"], opt_shape=engine_args["opt_shape"], max_shape=engine_args["max_shape"],
        workspace=engine_args["workspace"], timing_cache=engine_args["timing_cache"],
        hardware_compatibility=engine_args["hardware_compatibility"], version_compatible=engine_args["version_compatible"],
        optimization_level=engine_args["builder_optimization_level"], dla_core=engine_args["dla_core"],
        length_buckets=engine_args["length_buckets"], sort_window=engine_args["sort_window"],
    )  # fmt: skip
    return RunConfig(**opts, engine=engine)


def run_main(options: dict[str, Any]) -> int:
    """Validate, run, print the summary; returns the exit code (``validate.verdict.EXIT_CODES``: 1 FAIL, 3 PARTIAL)."""
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
        checkpoint: CheckpointMainOpt = run_default("checkpoint"),
        layers: LayersMainOpt = run_default("layers"),
        max_len: MaxLenOpt = run_default("max_len"),
        max_texts: MaxTextsOpt = run_default("max_texts"),
        languages: LanguagesOpt = run_default("languages"),
        pooling: PoolingOpt = run_default("pooling"),
        prompt: PromptOpt = run_default("prompt"),
        encoder_form: EncoderFormOpt = run_default("encoder_form"),
        layer: LayerOpt = run_default("layer"),
        d_model: DModelOpt = run_default("d_model"),
        heads: HeadsOpt = run_default("heads"),
        mask: MaskOpt = run_default("mask"),
        seq_len: SeqLenOpt = run_default("seq_len"),
        batch: BatchOpt = run_default("batch"),
        seed: SeedOpt = run_default("seed"),
        opset: OpsetOpt = run_default("opset"),
        attention: AttentionOpt = run_default("attention"),
        attention_impl: AttentionImplOpt = run_default("attention_impl"),
        precision: PrecisionOpt = run_default("precision"),
        out: OutOpt = run_default("out"),
        force: ForceOpt = run_default("force"),
        threads: ThreadsOpt = run_default("threads"),
        warmup: WarmupOpt = run_default("warmup"),
        repeats: RepeatsOpt = run_default("repeats"),
        quiet: QuietOpt = False,
        as_json: JsonOpt = False,
        progress: ProgressOpt = False,
        max_memory: MaxMemoryOpt = run_default("max_memory"),
        low_rank: LowRankOpt = run_default("low_rank"),
        low_rank_method: LowRankMethodOpt = run_default("low_rank_method"),
        low_rank_targets: LowRankTargetsOpt = run_default("low_rank_targets"),
        distill: DistillOpt = run_default("distill"),
        quantize: QuantizeOpt = run_default("quantize"),
        int8_mode: Int8ModeOpt = run_default("int8_mode"),
        int8_encoding: Int8EncodingOpt = run_default("int8_encoding"),
        with_torchao: WithTorchaoOpt = run_default("with_torchao"),
        calib: CalibOpt = run_default("calib"),
        calib_method: CalibMethodOpt = run_default("calib_method"),
        smoothquant: SmoothQuantOpt = run_default("smoothquant"),
        int8_fallback: Int8FallbackOpt = run_default("int8_fallback"),
        int8_qat: Int8QatOpt = run_default("int8_qat"),
        int8_qat_scales: Int8QatScalesOpt = run_default("int8_qat_scales"),
        target: TargetOpt = run_default("target"),
        trt_version: TrtVersionOpt = run_default("trt_version"),
        gpu_arch: GpuArchOpt = run_default("gpu_arch"),
        min_shape: MinShapeOpt = None,
        opt_shape: OptShapeOpt = None,
        max_shape: MaxShapeOpt = None,
        workspace: WorkspaceOpt = None,
        timing_cache: TimingCacheOpt = engine_default("timing_cache"),
        hardware_compatibility: HwCompatOpt = engine_default("hardware_compatibility"),
        version_compatible: VersionCompatOpt = engine_default("version_compatible"),
        builder_optimization_level: OptLevelOpt = engine_default("optimization_level"),
        dla_core: DlaCoreOpt = engine_default("dla_core"),
        length_buckets: LengthBucketsOpt = None,
        sort_window: SortWindowOpt = engine_default("sort_window"),
        build_engine: BuildEngineOpt = run_default("build_engine"),
        accept_engine_mismatch: AcceptEngineMismatchOpt = run_default("accept_engine_mismatch"),
        bundle: BundleOpt = run_default("bundle"),
        triton: TritonOpt = run_default("triton"),
        triton_config: TritonConfigOpt = run_default("triton_config"),
        atol: AtolOpt = None,
        rtol: RtolOpt = None,
        cosine_min: CosineMinOpt = None,
        accept_partial: AcceptPartialOpt = run_default("accept_partial"),
    ) -> None:
        """Export a layer or a checkpoint to ONNX, compress it, validate every artifact against eager PyTorch, and report."""
        if ctx.invoked_subcommand is not None:
            return
        options = {k: v for k, v in locals().items() if k not in ("ctx",)}
        code = run_main(options)
        if code:
            raise typer.Exit(code=code)
