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

import errno
import importlib
import logging
import re
import signal
import sys
import tempfile
import traceback
from pathlib import Path

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


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # colour codes some libraries put in messages


def _one_line(text: str) -> str:
    return " ".join(_ANSI.sub("", str(text)).split())


def _save_traceback() -> Path | None:
    try:
        with tempfile.NamedTemporaryFile("w", prefix="attn-export-traceback-", suffix=".txt", delete=False) as f:
            traceback.print_exc(file=f)
            return Path(f.name)
    except OSError:
        return None


# OSErrors a user fixes on their side (space, permissions, a read-only disk): one line, exit 2.
_USER_OS_ERRORS = {errno.ENOSPC: "free some disk space or pass another --out", errno.EDQUOT: "free some quota or pass another --out",
                   errno.EROFS: "pass a folder on a writable disk", errno.EACCES: "check its permissions or pass another path",
                   errno.EPERM: "check its permissions or pass another path"}  # fmt: skip


def _interrupted(signum: int) -> int:
    from attn_export.interrupts import announce

    return announce(signum)  # one line per command, however many times the interrupt surfaces


def main(argv: list[str] | None = None) -> int:
    """Console entry point; see the module docstring for the exit codes."""
    from attn_export.interrupts import Terminated, interrupt_signals, received
    from attn_export.paths import COMMAND_LINE

    argv = list(sys.argv[1:] if argv is None else argv)
    token = COMMAND_LINE.set(("attn-export", *argv))
    try:
        with interrupt_signals():
            try:
                return _dispatch(argv)
            except KeyboardInterrupt:
                return _interrupted(signal.SIGINT)
            except Terminated:
                return _interrupted(signal.SIGTERM)
            except Exception as e:  # noqa: BLE001 - a signal wrapped into another exception, or an internal error
                if received() is not None:
                    return _interrupted(received())  # type: ignore[arg-type]
                if isinstance(e, OSError) and e.errno in _USER_OS_ERRORS:
                    where = f" {e.filename}" if e.filename else ""
                    print(f"attn-export: error: cannot write or read{where}: {e.strerror}; {_USER_OS_ERRORS[e.errno]}", file=sys.stderr)
                    return 2
                saved = _save_traceback()
                where = f"; traceback saved to {saved}" if saved else ""
                print(f"attn-export: internal error: {type(e).__name__}: {_one_line(str(e))[:300]}{where}", file=sys.stderr)
                return 1
    finally:
        COMMAND_LINE.reset(token)


def _dispatch(argv: list[str]) -> int:
    """Parse and run one command; usage and input errors become one line and exit 2."""
    from attn_export.interrupts import received
    from attn_export.process import ProcessSettings, process_settings

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # OpenMP wait policy before any command imports torch; threads are set per run.
    with process_settings(ProcessSettings(threads=None, flush_denormals=False)):
        from attn_export.errors import AttnExportError

        argv = fill_optional_values(argv)
        try:
            _register()
            rv = app(args=argv, standalone_mode=False, prog_name="attn-export")
        except typer.Exit as e:
            if received() is not None or isinstance(e.__cause__, KeyboardInterrupt):  # typer turns Ctrl-C into Exit(130)
                return _interrupted(received() or signal.SIGINT)
            return e.exit_code
        except typer.Abort:
            return _interrupted(received() or signal.SIGINT)
        except typer.TyperException as e:  # usage errors (bad option, bad value): typer's click
            text = e.format_message() if hasattr(e, "format_message") else str(e)
            print(f"attn-export: error: {_one_line(text)}", file=sys.stderr)
            return 2
        except AttnExportError as e:
            if received() is not None:  # an interrupt some library wrapped into its own error
                return _interrupted(received())  # type: ignore[arg-type]
            print(f"attn-export: error: {_one_line(str(e))}", file=sys.stderr)
            return 2
        if received() is not None or rv == 130:  # typer returns Ctrl-C as exit code 130, without a word
            return _interrupted(received() or signal.SIGINT)
        return rv if isinstance(rv, int) else 0
