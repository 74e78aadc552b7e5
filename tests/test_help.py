"""``--help`` is fast (no torch) and shows every option's default, for every command."""

from __future__ import annotations

import re
import subprocess
import sys

import typer

from attn_export.cli.app import _register, app


def _options(command, ctx, prefix):  # type: ignore[no-untyped-def]
    for p in command.params:
        if p.param_type_name == "option" and p.name != "help":
            yield f"{prefix} {p.opts[0]}", p.get_help_record(ctx)
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _options(sub, type(ctx)(sub, parent=ctx), f"{prefix} {name}")


def test_every_option_of_every_command_shows_its_default():
    """Every option that takes a value shows its default; a switch is off unless given, and says nothing (as click's
    own help does): "[default: (off)]" beside each switch was noise, and beside a stated number a contradiction."""
    _register()
    root = typer.main.get_command(app)
    ctx_type = type(root.make_context("attn-export", [], resilient_parsing=True))
    records = list(_options(root, ctx_type(root), "attn-export"))
    assert len(records) > 60
    switches = {name for name, p in _option_params(root, "attn-export") if getattr(p, "is_flag", False) and not p.secondary_opts and p.default is False}
    assert len(switches) > 15
    missing = [name for name, rec in records if name not in switches and (rec is None or not ("[default" in rec[1] or "[required]" in rec[1]))]
    assert not missing, f"options without a visible default: {missing}"
    said = [name for name, rec in records if name in switches and "[default" in rec[1]]
    assert not said, f"switches with a default shown: {said}"


def _option_params(command, prefix):  # type: ignore[no-untyped-def]
    for p in command.params:
        if p.param_type_name == "option" and p.name != "help":
            yield f"{prefix} {p.opts[0]}", p
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _option_params(sub, f"{prefix} {name}")


def test_help_imports_neither_torch_nor_onnx():
    code = "import sys; from attn_export.cli import main; sys.argv=['attn-export','--help']\ntry:\n    main()\nfinally:\n    print(sorted(m for m in ('torch','onnx','onnxruntime') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout[-500:]
    assert "--quantize" in proc.stdout  # what keeps --help fast is that nothing heavy is imported, checked above


# --- what --help says is what the code does (issue 23) ----------------------------------------------


def _main_options() -> dict[str, tuple[object, str]]:
    """Main-command option name -> (its Python default, the text inside ``[default: ...]``; "" for a switch)."""
    from fixtures import main_option_defaults

    return {name: (default, shown) for name, default, shown in main_option_defaults().values()}


def _resolved_defaults() -> dict[str, str]:
    """What an option left out resolves to, computed from RunConfig (and EngineSpec) the way a run resolves it."""
    from attn_export.config.run import RunConfig
    from attn_export.subjects.kinds import KINDS

    layer, ckpt = RunConfig(), KINDS["encoder"].defaults
    tensorrt = RunConfig(target="tensorrt").export_spec().resolved_opset
    engine = layer.engine_spec(layer.precision).profiles
    assert (engine.min, engine.opt, engine.max) == ((1, 1), (layer.batch, layer.seq_len), (4 * layer.batch, 4 * layer.seq_len))
    return {
        "layer": layer.resolved_layer, "d_model": str(layer.resolved_d_model), "heads": str(layer.resolved_heads), "mask": layer.resolved_mask,
        "layers": layer.resolved_layers, "max_len": str(layer.resolved_max_len), "max_texts": str(layer.resolved_max_texts),
        "low_rank_targets": f"{','.join(layer.resolved_low_rank_targets)} for a layer; {ckpt['low_rank_targets']} for --checkpoint",
        "calib_method": f"{layer.resolved_calib_method} for a layer; {ckpt['calib_method']} for --checkpoint",
        "smoothquant": f"{layer.resolved_smoothquant or 'none'} for a layer; {ckpt['smoothquant']} for --checkpoint",
        "opset": f"the target's: {layer.export_spec().resolved_opset}; {tensorrt} for --target tensorrt and --attention onnx-attention",
        "min_shape": "1x1", "opt_shape": "--batch x --seq-len", "max_shape": "4 x --batch by 4 x --seq-len",
        "threads": "all cores" if layer.threads is None else str(layer.threads),
        "languages": "all shipped" if layer.resolved_languages is None else ",".join(layer.resolved_languages),
        "attention": layer.attention or "auto", "encoder_form": layer.encoder_form or "auto", "max_memory": "the memory available" if layer.max_memory is None else str(layer.max_memory),
    }  # fmt: skip


# Options whose default is "nothing": a sentence or none in --help, None/False in RunConfig (or EngineSpec).
_NOTHING = {"checkpoint": "none: a reference layer", "low_rank": "no factorization", "distill": "no distillation", "quantize": "none",
            "int8_qat": "no QAT-lite", "bundle": "none", "triton": "none", "calib": "the shipped set", "trt_version": "the target's", "workspace": "TensorRT's (the GPU's memory)",
            "timing_cache": "none", "dla_core": "none (GPU only)", "atol": "the tolerance table's", "rtol": "the tolerance table's",
            "cosine_min": "the tolerance table's", "pooling": "the model's (1_Pooling/config.json), else mean",
            "prompt": "the model's default_prompt_name, else none",
            "gpu_arch": "the one GPU the Jetson release runs on (10.3: sm87, 10.13: sm110), else unknown",
            "triton_config": "derived from the engine's profiles", "length_buckets": "one profile", "sort_window": "the batch (no reordering)"}  # fmt: skip
_ENGINE = {"hardware_compatibility": "hardware_compatibility", "version_compatible": "version_compatible", "builder_optimization_level": "optimization_level",
           "workspace": "workspace_bytes", "timing_cache": "timing_cache", "dla_core": "dla_core", "sort_window": "sort_window"}  # fmt: skip


def test_every_main_command_default_shown_is_the_real_default():
    from dataclasses import fields

    from attn_export.config.run import RunConfig
    from attn_export.runtime.tensorrt.spec import EngineSpec

    run_defaults = {f.name: getattr(RunConfig(), f.name) for f in fields(RunConfig)}
    engine_defaults = {f.name: getattr(EngineSpec(), f.name) for f in fields(EngineSpec)}
    resolved = _resolved_defaults()
    wrong = []
    for name, (python_default, shown) in _main_options().items():
        real = engine_defaults[_ENGINE[name]] if name in _ENGINE else run_defaults.get({"as_json": "json"}.get(name, name), python_default)
        if name in resolved:
            expected = resolved[name]
        elif name in _NOTHING:
            expected = _NOTHING[name]
            if real not in (None, False):
                wrong.append(f"--{name}: RunConfig default {real!r}, but --help describes it as {shown!r}")
        elif python_default is False:
            expected = ""  # a switch: off unless given, no default shown
            if real is not False:
                wrong.append(f"--{name}: a switch, but RunConfig's default is {real!r}")
        else:
            expected = str(real)
            if python_default != real:
                wrong.append(f"--{name}: the CLI's default {python_default!r} is not RunConfig's {real!r}")
        if shown != expected:
            wrong.append(f"--{name}: --help shows [default: {shown}], the run uses {expected}")
    assert not wrong, "\n".join(wrong)


def _help_text(*args: str) -> str:
    from typer.testing import CliRunner

    _register()
    res = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "250"}, terminal_width=250)
    assert res.exit_code == 0, res.output
    return res.output


def _switches(command) -> list[str]:  # type: ignore[no-untyped-def]
    return [p.opts[0] for p in command.params if getattr(p, "is_flag", False) and p.name != "help"]


def test_switches_take_no_value_placeholder_in_help():
    _register()
    root = typer.main.get_command(app)
    commands = {"": root, **{name: cmd for name, cmd in root.commands.items() if name != "encoder"}}
    for group in ("calib",):
        commands.update({f"calib {n}": c for n, c in root.commands[group].commands.items()})
    seen = 0
    for name, command in commands.items():
        text = _help_text(*name.split())
        for flag in _switches(command):
            line = next(ln for ln in text.splitlines() if re.search(rf"\s{re.escape(flag)}\b", ln))
            assert "<bool>" not in line, f"attn-export {name} --help: {line.strip()}"
            seen += 1
    assert seen >= 15


def test_encoder_help_lists_the_main_command_options_under_its_preset():
    from attn_export.cli.encoder import ENCODER_PRESET

    text = _help_text("encoder")
    assert "Usage: attn-export encoder [OPTIONS]" in text and f"Preset: {' '.join(ENCODER_PRESET)}" in text
    for flag in ["--" + n.replace("_", "-") for n in _main_options() if n != "as_json"] + ["--json"]:
        assert re.search(rf"\s{re.escape(flag)}\s", text), f"encoder --help does not list {flag}"


def test_int8_encoding_help_says_what_auto_picks():
    from attn_export.compress.quant.int8_encoding import choose_cpu_encoding
    from attn_export.host.environment import CpuInfo
    from attn_export.vocab.choices import CPU_INT8_ENCODINGS

    text = " ".join(_help_text().split())
    assert "auto (u8u8 where this CPU's U8S8 GEMM saturates, i.e. x86 without VNNI; full-range elsewhere)" in text
    assert choose_cpu_encoding("auto", CpuInfo("x86-avx2", "x86_64", "test")).encoding == "u8u8"
    assert choose_cpu_encoding("auto", CpuInfo("x86-avx512-vnni", "x86_64", "test")).encoding == "full-range"
    help_line = text[text.index("--int8-encoding") : text.index("--with-torchao")]
    assert all(v in help_line for v in CPU_INT8_ENCODINGS), help_line


def test_int8_mode_help_names_every_route_of_the_registry_in_its_own_words():
    """--int8-mode's help is generated from compress/registry.py: a new route (weight-only was missed once) shows up by itself."""
    from attn_export.compress.registry import methods, route_choices

    _register()
    root = typer.main.get_command(app)
    ctx = root.make_context("attn-export", [], resilient_parsing=True)
    (param,) = [p for p in root.params if p.name == "int8_mode"]
    text = " ".join(param.get_help_record(ctx)[1].split())
    routes = methods("route")
    assert {m.route for m in routes} >= {"static", "dynamic", "torchao", "weight-only"}
    for name in route_choices():
        assert f"{name} (" in text, name
    for m in routes:
        assert m.description and " ".join(m.description.split()) in text, m.__name__



def test_subject_dependent_defaults_in_help_are_the_subject_kinds():
    """--help shows a subject-dependent default (None in RunConfig) as the subject kind resolves it: one table, subjects/kinds.py."""
    from attn_export.subjects.kinds import KINDS

    _register()
    shown = {p.name: p.show_default for p in typer.main.get_command(app).params}
    layer, ckpt = KINDS["layer"].defaults, KINDS["encoder"].defaults
    for name in ("layer", "d_model", "heads", "mask"):
        assert shown[name] == str(layer[name]), name
    for name in ("layers", "max_len", "max_texts"):
        assert shown[name] == str(ckpt[name]), name
    for name in ("low_rank_targets", "calib_method", "smoothquant"):
        as_shown = ["none" if v is None else str(v) for v in (layer[name], ckpt[name])]
        assert shown[name] == f"{as_shown[0]} for a layer; {as_shown[1]} for --checkpoint", name
