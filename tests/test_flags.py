"""Every option of the main command is honoured, or refused with a ConfigError naming it, for both subjects.

The table below lists each option once with a non-default value, what it needs beside it, and
who reads it. A new option that is not in the table fails ``test_the_table_covers_every_option``,
so no flag can again be dropped silently for checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from attn_export.cli.app import _register, app
from attn_export.cli.main_command import config_from_options
from attn_export.errors import ConfigError
from attn_export.pipeline.plan import make_plan

LAYER, CKPT = "layer", "checkpoint"


def _defaults() -> dict[str, object]:
    _register()
    cmd = typer.main.get_command(app)
    return {p.name: p.default for p in cmd.params}


# option -> (value, companions, reader); reader: "plan" (changes the stages), "config:<property>"
# (a resolved value the subject/runner reads), "output" (terminal only). Companions are the
# other options the flag needs to mean anything (e.g. --distill needs --low-rank).
TABLE: dict[str, tuple[object, dict[str, object], str]] = {
    "checkpoint": ("minilm", {}, "config:is_checkpoint"),
    "layers": ("3", {}, "config:resolved_layers"),
    "max_len": (32, {}, "config:resolved_max_len"),
    "max_texts": (64, {}, "config:resolved_max_texts"),
    "languages": ("en,de", {}, "config:resolved_languages"),
    "pooling": ("cls", {}, "config:pooling"),
    "prompt": ("", {}, "config:prompt"),
    "encoder_form": ("padded", {}, "plan"),
    "layer": ("mha", {}, "config:resolved_layer"),
    "d_model": (256, {}, "config:resolved_d_model"),
    "heads": (4, {}, "config:resolved_heads"),
    "mask": ("causal", {}, "config:resolved_mask"),
    "seq_len": (64, {}, "config:seq_len"),
    "batch": (4, {}, "config:batch"),
    "seed": (7, {}, "config:seed"),
    "opset": (20, {}, "plan"),
    "attention": ("ort-contrib", {}, "plan"),
    "attention_impl": ("sdpa", {}, "config:attention_impl"),
    "precision": ("fp16", {}, "plan"),
    "out": (Path("elsewhere"), {}, "config:out"),
    "force": (True, {}, "config:force"),
    "threads": (1, {}, "config:resolved_threads"),
    "warmup": (1, {}, "config:warmup"),
    "repeats": (5, {}, "config:repeats"),
    "quiet": (True, {}, "output"),
    "as_json": (True, {}, "output"),
    "progress": (True, {}, "output"),
    "max_memory": ("16G", {}, "config:max_memory"),
    "low_rank": (0.25, {}, "plan"),
    "low_rank_method": ("svd", {"low_rank": 0.5}, "plan"),
    "low_rank_targets": ("q", {"low_rank": 0.5}, "plan"),
    "distill": (10, {"low_rank": 0.5}, "plan"),
    "quantize": ("int8", {}, "plan"),
    "int8_mode": ("static", {"quantize": "int8"}, "plan"),
    "int8_encoding": ("reduce-range", {"quantize": "int8"}, "plan"),
    "with_torchao": (True, {"quantize": "int8"}, "plan"),
    "calib": ("<calib>", {"quantize": "int8"}, "config:calib"),
    "calib_method": ("entropy", {"quantize": "int8"}, "plan"),
    "smoothquant": ("0.5", {"quantize": "int8"}, "plan"),
    "int8_fallback": ("none", {"quantize": "int8"}, "plan"),
    "int8_qat": (50, {"quantize": "int8"}, "plan"),
    "int8_qat_scales": ("frozen", {"quantize": "int8", "int8_qat": 50}, "plan"),
    "target": ("jetson", {}, "plan"),
    "trt_version": ("10.8", {"target": "tensorrt"}, "config:resolved_trt_version"),
    "gpu_arch": ("sm89", {"target": "tensorrt"}, "config:resolved_gpu_arch"),
    "min_shape": ("2x8", {"target": "jetson"}, "engine"),
    "opt_shape": ("4x64", {"target": "jetson"}, "engine"),
    "max_shape": ("16x512", {"target": "jetson"}, "engine"),
    "workspace": ("1G", {"target": "jetson"}, "engine"),
    "timing_cache": ("cache.bin", {"target": "jetson"}, "engine"),
    "hardware_compatibility": ("ampere+", {"target": "tensorrt"}, "engine"),
    "version_compatible": (True, {"target": "tensorrt"}, "engine"),
    "builder_optimization_level": (5, {"target": "jetson"}, "engine"),
    "dla_core": (0, {"target": "jetson", "precision": "fp16"}, "engine"),
    "length_buckets": ("32,64,128", {"target": "jetson"}, "engine"),
    "sort_window": (64, {"target": "jetson"}, "engine"),
    "build_engine": (True, {"target": "jetson"}, "plan"),
    "accept_engine_mismatch": (True, {"target": "jetson", "build_engine": True}, "config:accept_engine_mismatch"),
    "bundle": (Path("bundle"), {"target": "jetson"}, "plan"),
    "triton": (Path("triton"), {}, "plan"),
    "triton_config": (Path("plan.pbtxt"), {"target": "jetson", "triton": Path("triton"), "build_engine": True}, "config:triton_config"),
    "atol": (["y:1e-3"], {}, "config:tolerance_overrides"),
    "rtol": (["2e-2"], {}, "config:tolerance_overrides"),
    "cosine_min": (["0.9999"], {}, "config:tolerance_overrides"),
    "accept_partial": (True, {}, "config:accept_partial"),
}
# Refused for one subject: option -> (subject it is refused for, text the error must contain).
REFUSED: dict[str, tuple[str, str]] = {
    "layers": (LAYER, "--layers applies to a --checkpoint"),
    "max_len": (LAYER, "--max-len applies to a --checkpoint"),
    "max_texts": (LAYER, "--max-texts applies to a --checkpoint"),
    "languages": (LAYER, "--languages applies to a --checkpoint"),
    "pooling": (LAYER, "--pooling applies to a --checkpoint"),
    "prompt": (LAYER, "--prompt applies to a --checkpoint"),
    "encoder_form": (LAYER, "--encoder-form applies to a --checkpoint"),
    "layer": (CKPT, "--layer picks a reference layer"),
    "d_model": (CKPT, "--d-model picks a reference layer"),
    "heads": (CKPT, "--heads picks a reference layer"),
    "mask": (CKPT, "--mask picks a reference layer"),
}


def _options(subject: str, name: str | None, tmp_path: Path) -> dict[str, object]:
    opts = _defaults()
    if subject == CKPT:
        opts["checkpoint"] = "minilm"
    if name is not None:
        value, companions, _ = TABLE[name]
        opts.update(companions)
        if value == "<calib>":
            value = tmp_path / ("texts.txt" if subject == CKPT else "acts.npz")
        opts[name] = value
    return opts


def _plan_signature(cfg) -> tuple:  # type: ignore[no-untyped-def]
    plan = make_plan(cfg)
    return (tuple((s.name, repr(s.config), s.source) for s in plan.steps), tuple(d.kind for d in plan.deploy), tuple(plan.notes))


def test_the_table_covers_every_option():
    assert set(_defaults()) == set(TABLE), f"options without a decision: {set(_defaults()) ^ set(TABLE)}"


@pytest.mark.parametrize("subject", [LAYER, CKPT])
@pytest.mark.parametrize("name", sorted(TABLE))
def test_every_option_is_honoured_or_refused(subject, name, tmp_path):
    if name == "checkpoint" and subject == CKPT:
        pytest.skip("the option that makes the subject")
    value, _, reader = TABLE[name]
    refused_for, message = REFUSED.get(name, (None, ""))
    base = config_from_options(_options(subject, None, tmp_path)) if name != "checkpoint" else None
    if refused_for == subject:
        with pytest.raises(ConfigError, match=message):
            config_from_options(_options(subject, name, tmp_path))
        return
    opts = _options(subject, name, tmp_path)
    cfg = config_from_options(opts)
    if reader == "output":
        return  # terminal only: same meaning for both subjects by construction (cli/summary.py)
    if reader == "engine":
        field = {"builder_optimization_level": "optimization_level", "workspace": "workspace_bytes", "min_shape": "profiles",
                 "opt_shape": "profiles", "max_shape": "profiles"}.get(name, name)  # fmt: skip
        companion = config_from_options(_options(subject, None, tmp_path) | TABLE[name][1])
        assert getattr(cfg.engine, field) != getattr(companion.engine, field), name
        return
    if reader == "plan":
        companion = config_from_options(_options(subject, None, tmp_path) | TABLE[name][1])
        assert _plan_signature(cfg) != _plan_signature(companion), f"{name} does not change the {subject} plan"
        return
    prop = reader.split(":", 1)[1]
    if base is not None:
        assert getattr(cfg, prop) != getattr(base, prop), f"{name} does not change {prop} for the {subject}"


def test_checkpoint_calib_must_be_text_and_layer_calib_must_not(tmp_path):
    with pytest.raises(ConfigError, match="a checkpoint calibrates on text"):
        config_from_options(_options(CKPT, None, tmp_path) | {"quantize": "int8", "calib": tmp_path / "acts.npz"})
    with pytest.raises(ConfigError, match="text calibrates a --checkpoint"):
        config_from_options(_options(LAYER, None, tmp_path) | {"quantize": "int8", "calib": tmp_path / "texts.txt"})


def test_int8_flags_without_quantize_are_refused(tmp_path):
    for flag, value in (("int8_mode", "static"), ("int8_encoding", "u8u8"), ("with_torchao", True), ("smoothquant", "0.5"), ("int8_fallback", "2")):
        with pytest.raises(ConfigError, match="add --quantize int8"):
            config_from_options(_options(LAYER, None, tmp_path) | {flag: value})


def test_engine_options_need_a_tensorrt_target(tmp_path):
    with pytest.raises(ConfigError, match="TensorRT engine options"):
        config_from_options(_options(CKPT, None, tmp_path) | {"workspace": "1G"})


def test_distill_default_steps_are_the_same_for_both_subjects():
    from attn_export.cli.app import fill_optional_values

    assert fill_optional_values(["--low-rank", "--distill"]) == ["--low-rank", "0.5", "--distill", "200"]


def test_int8_fallback_smoothquant_and_calibration_values(tmp_path):
    base = _options(CKPT, None, tmp_path) | {"quantize": "int8"}
    assert config_from_options(base | {"int8_fallback": "3"}).int8_fallback == 3
    assert config_from_options(base | {"int8_fallback": "NONE"}).int8_fallback == "none"
    for bad in ("-1", "some", "1.5"):
        with pytest.raises(ConfigError, match="--int8-fallback auto|none|N"):
            config_from_options(base | {"int8_fallback": bad})
    assert config_from_options(base).resolved_smoothquant == "auto", "a checkpoint searches SmoothQuant by default"
    assert config_from_options(_options(LAYER, None, tmp_path) | {"quantize": "int8"}).resolved_smoothquant is None, "the layer keeps it off"
    assert config_from_options(base | {"smoothquant": "none"}).resolved_smoothquant is None
    assert config_from_options(base | {"smoothquant": "0.7"}).resolved_smoothquant == pytest.approx(0.7)
    for bad in ("1.5", "max"):
        with pytest.raises(ConfigError, match="--smoothquant"):
            config_from_options(base | {"smoothquant": bad})
    assert config_from_options(base | {"calib_method": "per-tensor"}).resolved_calib_method == "per-tensor"
    with pytest.raises(ConfigError, match="refines the static int8 route"):
        config_from_options(base | {"int8_qat": 10, "int8_mode": "dynamic"})
    with pytest.raises(ConfigError, match="add --int8-qat"):
        config_from_options(base | {"int8_qat_scales": "frozen"})
    plan = make_plan(config_from_options(base | {"int8_qat": 10, "target": "jetson"}))
    assert [s.name for s in plan.steps][-2:] == ["int8-static", "int8-static+qat"] and plan.selections[0].candidates == ("int8-static", "int8-static+qat")


def _command_params(name: str | None) -> dict[str, object]:
    """The click parameters of the main command (``name`` None) or of a subcommand, by name."""
    _register()
    cmd = typer.main.get_command(app)
    if name is not None:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return {p.name: p for p in cmd.params if p.param_type_name == "option"}


def _same(a: object, b: object) -> bool:
    return str(a) == str(b) if isinstance(a, Path) or isinstance(b, Path) else a == b and type(a) is type(b)


@pytest.mark.parametrize("command", [None, "sweep"], ids=["attn-export", "sweep"])
def test_every_option_of_a_run_config_field_has_its_default(command):
    """One edit changes the library and the CLI: an option that sets a RunConfig field defaults to the field's
    default (read through click, as a user gets it); an engine option to EngineSpec's; sweep's timing to its points'."""
    import dataclasses

    from attn_export.cli.main_command import ENGINE_OPTIONS
    from attn_export.config.run import RunConfig, run_default
    from attn_export.runtime.tensorrt.spec import EngineSpec
    from attn_export.campaigns.sweep import MAX_POINTS, POINT_DEFAULTS, SweepConfig

    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    engine = {f.name: f.default for f in dataclasses.fields(EngineSpec)}
    own: dict[str, object] = {}
    if command == "sweep":  # its timing is its points' (repeats None: POINT_DEFAULTS', quick 5); its axes default to SweepConfig's
        # grid (None, shown from there); --out is the sweep's own folder, not a point's
        own = {**POINT_DEFAULTS, "repeats": None, **{f.name: None for f in dataclasses.fields(SweepConfig) if f.name != "base"},
               "max_points": MAX_POINTS}
        run_fields.discard("out")
    checked, wrong = 0, []
    for name, param in _command_params(command).items():
        if name in own:
            expected = own[name]
        elif name in run_fields:
            expected = run_default(name)
        elif name in ENGINE_OPTIONS and command is None:
            expected = engine[ENGINE_OPTIONS[name]] if ENGINE_OPTIONS[name] != "profiles" else None
        else:
            continue
        checked += 1
        if not _same(param.default, expected):
            wrong.append(f"--{name.replace('_', '-')}: {param.default!r}, expected {expected!r}")
    assert checked >= (50 if command is None else 10)
    assert not wrong, f"CLI defaults that are not the library's: {wrong}"


def test_run_default_is_the_field_default_and_refuses_an_unknown_name():
    from attn_export.config.run import RunConfig, run_default

    assert run_default("out") == RunConfig().out and run_default("int8_mode") == RunConfig().int8_mode
    with pytest.raises(KeyError, match="no_such_option"):
        run_default("no_such_option")


@pytest.mark.parametrize("text,ok", [("12", True), ("0", True), ("", False), ("²", False), ("①", False), ("١٢", False), ("-1", False), ("1.5", False)])
def test_counts_are_ascii_digits(text, ok):
    """The one check every count (--int8-fallback N, --layers N, --seqs, a label id) passes before int()."""
    from attn_export.vocab.choices import is_ascii_digits

    assert is_ascii_digits(text) is ok
    assert is_ascii_digits("12345678", max_len=7) is False and is_ascii_digits("1234567", max_len=7) is True


def test_bench_and_sweep_quick_read_their_defaults_from_the_library():
    """bench's layer shape is BenchConfig's (the reference layer's, subjects/kinds.py); sweep --quick's help is its preset."""
    from attn_export.campaigns.bench import BenchConfig
    from attn_export.subjects.kinds import KINDS
    from attn_export.campaigns.sweep import QUICK, SweepConfig

    bench = _command_params("bench")
    for name in ("d_model", "heads"):
        assert bench[name].default == getattr(BenchConfig(), name) == KINDS["layer"].defaults[name]
    quick_help = " ".join(_command_params("sweep")["quick"].help.split())
    assert "--low-rank none,0.5 --distill none,40" in quick_help and all(f"--{k.replace('_', '-')} " in quick_help for k in QUICK)
    assert SweepConfig.quick().low_rank == QUICK["low_rank"]
