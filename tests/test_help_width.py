"""``--help`` of every command reads whole at 80 and 120 columns, and lists every value a choice option takes (issue 33).

At 80 columns rich cut one-word value lists (``auto|decomposed|onnx-attention|ort-contrib|l…``) and a panel
title, typer printed ``--help <bool>``, and "[default: (off)]" stood beside help that stated a number. The
value lists are now generated from the vocabulary and the registries (``cli.help.one_of``); this test renders
every command's help the way a terminal of each width gets it.
"""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from attn_export.cli.app import _register, app

WIDTHS = (80, 120)


def _commands() -> dict[str, object]:
    """Every command path (``""`` is the main command) -> its click command."""
    _register()
    root = typer.main.get_command(app)
    out: dict[str, object] = {"": root}
    for name, cmd in root.commands.items():  # type: ignore[attr-defined]
        out[name] = cmd
        for sub_name, sub in (getattr(cmd, "commands", None) or {}).items():
            out[f"{name} {sub_name}"] = sub
    return out


def _render(command: str, width: int) -> str:
    res = CliRunner().invoke(app, [*command.split(), "--help"], env={"COLUMNS": str(width), "TERMINAL_WIDTH": None}, terminal_width=width)
    assert res.exit_code == 0, res.output
    return res.output


def _panels(cmd: object) -> set[str]:
    return {getattr(p, "rich_help_panel", None) or "Options" for p in cmd.params if not getattr(p, "hidden", False)}  # type: ignore[attr-defined]


@pytest.mark.parametrize("width", WIDTHS)
def test_every_command_help_fits_the_terminal_whole(width: int) -> None:
    commands = _commands()
    assert {"", "bench", "sweep", "report", "check", "check-trt", "encoder", "calib generate", "calib check"} <= set(commands)
    problems = []
    for name, cmd in commands.items():
        text = _render(name, width)
        where = f"attn-export {name} --help at {width} columns".replace("  ", " ")
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= width, f"{where}: rendered wider than the terminal"
        problems += [f"{where}: cut: {line.strip()}" for line in lines if "…" in line]
        problems += [f"{where}: {line.strip()}" for line in lines if "(off" in line or "<bool>" in line]
        if name != "encoder":  # encoder's help is the main command's panels (checked there)
            problems += [f"{where}: panel title cut: {t!r}" for t in _panels(cmd) if f"─ {t} ─" not in text]
    assert not problems, "\n".join(problems)


def _accepted() -> dict[tuple[str, str], tuple[str, ...]]:
    """(command, option) -> every value the option takes, from the vocabulary and registries its validation reads."""
    from attn_export.campaigns.bench.grid import VARIANT_NAMES
    from attn_export.compress.registry import precisions, route_choices
    from attn_export.runtime.tensorrt.spec import HARDWARE_COMPATIBILITY
    from attn_export.targets.targets import TARGETS
    from attn_export.vocab import choices as v
    from attn_export.vocab.precisions import precision_names

    floats, eight_bit = precision_names(export_float=True), (*precisions(), "auto", "none")
    main = {"--layer": v.LAYER_NAMES, "--mask": v.MASK_KINDS, "--attention": ("auto", *v.ATTENTION_FORMS), "--attention-impl": v.ATTENTION_IMPLS,
            "--precision": floats, "--quantize": eight_bit, "--int8-mode": route_choices(), "--int8-encoding": v.CPU_INT8_ENCODINGS,
            "--calib-method": v.CALIB_CHOICES, "--low-rank-method": v.LOW_RANK_METHODS, "--low-rank-targets": v.LOW_RANK_TARGET_NAMES,
            "--int8-qat-scales": v.INT8_QAT_SCALES, "--target": tuple(TARGETS), "--hardware-compatibility": tuple(HARDWARE_COMPATIBILITY),
            "--pooling": v.POOLING_MODES, "--encoder-form": ("auto", *v.ENCODER_FORMS), "--smoothquant": ("auto", "none"),
            "--int8-fallback": ("auto", "none")}  # fmt: skip
    sweep = {"--quantize": eight_bit, "--int8-mode": route_choices(), "--calib-method": v.CALIB_CHOICES, "--precision": floats, "--target": tuple(TARGETS)}
    return {**{("", k): vals for k, vals in main.items()}, **{("sweep", k): vals for k, vals in sweep.items()},
            ("bench", "--variants"): VARIANT_NAMES, ("check-trt", "--precision"): precision_names()}  # fmt: skip


def test_every_value_a_choice_option_takes_is_in_its_help() -> None:
    commands = _commands()
    missing = []
    for (command, flag), values in _accepted().items():
        cmd = commands[command]
        ctx = cmd.make_context(f"attn-export {command}".strip(), [], resilient_parsing=True)  # type: ignore[attr-defined]
        (param,) = [p for p in cmd.params if flag in getattr(p, "opts", ())]  # type: ignore[attr-defined]
        names, help_text = param.get_help_record(ctx)
        text = " ".join(f"{names} {help_text}".split())
        missing += [f"attn-export {command} {flag}: {value}".replace("  ", " ") for value in values
                    if not re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text)]  # fmt: skip
    assert not missing, "values missing from --help:\n" + "\n".join(missing)
