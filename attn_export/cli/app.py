"""The ``attn-export`` app and its entry point ``main()``: one error path for every command.

Every command lives in its own module of this package and registers itself on ``app``;
modules import only typer and the option types at import time, so ``attn-export --help``
never loads torch or ONNX. ``main()`` owns the process context (``attn_export.process``):
it is entered before any command can import torch, so the OpenMP wait policy takes effect,
and it restores everything on the way out.

Exit codes, for every command: 0 success; 1 a tolerance or gate failure (the report says
which), or an unexpected internal error (one line, the traceback saved to a file); 2 bad
input (``attn-export: error: <one line>``); 130 interrupted (Ctrl-C); 143 terminated.
"""

from __future__ import annotations

import importlib
import logging
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from types import FrameType

import typer

__all__ = ["COMMAND_MODULES", "app", "main"]

app = typer.Typer(
    name="attn-export",
    help="Compress, export and verify attention layers and encoders for ONNX Runtime and TensorRT.",
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=False,
    context_settings={"max_content_width": 120},
)

# One module per command; each exposes ``register(app)``. The main command is the app's callback.
COMMAND_MODULES: tuple[str, ...] = (
    "attn_export.cli.main_command",
    "attn_export.cli.encoder",
    "attn_export.cli.calib",
    "attn_export.cli.check_trt",
    "attn_export.cli.check",
    "attn_export.cli.bench",
    "attn_export.cli.sweep",
    "attn_export.cli.report",
)
_registered = False


def _register() -> None:
    global _registered
    if not _registered:
        for module in COMMAND_MODULES:
            importlib.import_module(module).register(app)
        _registered = True


# Options whose value may be omitted (``--low-rank`` alone = ``--low-rank 0.5``). typer's
# bundled click has no optional-value options, so the default is filled in before parsing.
OPTIONAL_VALUE_DEFAULTS: dict[str, str] = {"--low-rank": "0.5", "--distill": "200"}


def fill_optional_values(argv: list[str], defaults: dict[str, str] | None = None) -> list[str]:
    """Insert the default after an optional-value flag that is followed by no value."""
    defaults = OPTIONAL_VALUE_DEFAULTS if defaults is None else defaults
    out: list[str] = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg in defaults:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is None or (nxt.startswith("-") and not _is_number(nxt)):
                out.append(defaults[arg])
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so ``finally`` blocks clean up temporary files."""


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise _Terminated


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _save_traceback() -> Path | None:
    try:
        with tempfile.NamedTemporaryFile("w", prefix="attn-export-traceback-", suffix=".txt", delete=False) as f:
            traceback.print_exc(file=f)
            return Path(f.name)
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    """Console entry point; see the module docstring for the exit codes."""
    from attn_export.process import ProcessSettings, process_settings

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (e.g. called from a worker): leave signals alone
        previous = None
    try:
        # OpenMP wait policy before any command imports torch; threads are set per run.
        with process_settings(ProcessSettings(threads=None, flush_denormals=False)):
            from attn_export.errors import AttnExportError

            argv = fill_optional_values(list(sys.argv[1:] if argv is None else argv))
            try:
                _register()
                rv = app(args=argv, standalone_mode=False, prog_name="attn-export")
            except typer.Exit as e:
                return e.exit_code
            except typer.Abort:
                print("attn-export: interrupted", file=sys.stderr)
                return 130
            except typer.TyperException as e:  # usage errors (bad option, bad value): typer's click
                text = e.format_message() if hasattr(e, "format_message") else str(e)
                print(f"attn-export: error: {_one_line(text)}", file=sys.stderr)
                return 2
            except AttnExportError as e:
                print(f"attn-export: error: {_one_line(str(e))}", file=sys.stderr)
                return 2
            return rv if isinstance(rv, int) else 0
    except KeyboardInterrupt:
        print("attn-export: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("attn-export: interrupted (terminated)", file=sys.stderr)
        return 143
    except Exception as e:  # noqa: BLE001 - an internal error: one line, and where the traceback went
        saved = _save_traceback()
        where = f"; traceback saved to {saved}" if saved else ""
        print(f"attn-export: internal error: {type(e).__name__}: {_one_line(str(e))[:300]}{where}", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
