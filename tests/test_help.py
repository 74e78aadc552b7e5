"""``--help`` is fast (no torch) and shows every option's default, for every command."""

from __future__ import annotations

import subprocess
import sys
import time

import typer

from attn_export.cli.app import _register, app


def _options(command, ctx, prefix):  # type: ignore[no-untyped-def]
    for p in command.params:
        if p.param_type_name == "option" and p.name != "help":
            yield f"{prefix} {p.opts[0]}", p.get_help_record(ctx)
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _options(sub, type(ctx)(sub, parent=ctx), f"{prefix} {name}")


def test_every_option_of_every_command_shows_its_default():
    _register()
    root = typer.main.get_command(app)
    ctx_type = type(root.make_context("attn-export", [], resilient_parsing=True))
    records = list(_options(root, ctx_type(root), "attn-export"))
    assert len(records) > 60
    missing = [name for name, rec in records if rec is None or not ("[default" in rec[1] or "[required]" in rec[1])]
    assert not missing, f"options without a visible default: {missing}"


def test_help_imports_neither_torch_nor_onnx():
    code = "import sys; from attn_export.cli import main; sys.argv=['attn-export','--help']\ntry:\n    main()\nfinally:\n    print(sorted(m for m in ('torch','onnx','onnxruntime') if m in sys.modules))"
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - started
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout[-500:]
    assert "--quantize" in proc.stdout and elapsed < 10  # the budget is 1.5 s; the bench below measures it
