"""The ``attn-export`` app and its entry point ``main()``: one error path for every command.

Every command lives in its own module of this package and registers itself on ``app``;
modules import only typer and the option types at import time, so ``attn-export --help``
never loads torch or ONNX. ``main()`` owns the process context (``attn_export.host.process``):
it is entered before any command can import torch, so the OpenMP wait policy takes effect,
and it restores everything on the way out.

Exit codes, for every command: 0 success; 1 a tolerance or gate failure (the report says
which), or an unexpected internal error (one line, the traceback saved to a file); 2 bad
input (``attn-export: error: <one line>``), memory that ran out, or a standard output that
cannot be written (a reader that closed the pipe, as ``| head -1`` does, is not that: the
output ends there and the command's own code stands); 130 interrupted (Ctrl-C); 143 terminated.

The standard streams are inputs too: a closed one (``>&-``) is /dev/null for the command (so
no file the run opens lands on descriptor 1 or 2), and a crash in native code (a library that
cannot allocate under ``ulimit -v``) leaves the Python stacks in a crash file, not on the terminal.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import importlib
import io
import logging
import os
import re
import signal
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

import typer

from attn_export.cli.help import App

__all__ = ["COMMAND_MODULES", "app", "main"]

app = App(
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
    "attn_export.cli.golden",
    "attn_export.cli.bench",
    "attn_export.cli.sweep",
    "attn_export.cli.fleet",
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
                   errno.EPERM: "check its permissions or pass another path",
                   errno.EMFILE: "raise the open-file limit (ulimit -n 1024) and run again",
                   errno.ENFILE: "the system's table of open files is full; close some programs and run again"}  # fmt: skip


# What a native library or torch says when an allocation fails (MemoryError is Python's own).
_OUT_OF_MEMORY = re.compile(r"bad_alloc|can't allocate memory|Failed to allocate memory|out of memory|Cannot allocate memory|not enough memory",
                            re.IGNORECASE)


def memory_ran_out(err: BaseException) -> str | None:
    """The one line for an allocation that failed anywhere in ``err``'s chain, or None.

    The run's memory estimate refuses what cannot fit before anything is built
    (``resources.check_fits``); this is what is left when the estimate was short."""
    from attn_export.host.memory import format_bytes, memory_budgets

    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, MemoryError) or (isinstance(cause, OSError) and cause.errno == errno.ENOMEM) or (
                isinstance(cause, RuntimeError) and _OUT_OF_MEMORY.search(str(cause))):  # fmt: skip
            limits = ", ".join(f"{format_bytes(b.limit)} {b.source}" for b in memory_budgets(None))
            return (f"memory ran out ({limits or 'no limit known'}); raise the limit (ulimit -v, the container's memory), "
                    "or lower --batch/--seq-len/--d-model or drop a --quantize/--low-rank stage")  # fmt: skip
        cause = cause.__cause__ or cause.__context__
    return None


@contextlib.contextmanager
def standard_streams() -> Iterator[None]:
    """A closed stdin, stdout or stderr (``attn-export ... >&-``) becomes /dev/null for the command.

    Python sets ``sys.stdout`` to None when descriptor 1 is closed at start-up: every print (and
    rich's ``isatty``) failed. Worse, the first file the run opened would get descriptor 1, and
    anything a library writes to stdout would land in it. The descriptors are filled with
    /dev/null, the Python streams set on them, and both put back on the way out."""
    filled: list[int] = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            filled.append(fd)
    saved = {name: getattr(sys, name) for name in ("stdin", "stdout", "stderr")}
    replaced = [name for name, stream in saved.items() if stream is None or (name != "stdin" and not _writable(stream))]
    for name in replaced:  # its own /dev/null: the descriptor number may belong to a file an import opened meanwhile
        setattr(sys, name, open(os.devnull, "r" if name == "stdin" else "w", encoding="utf-8"))  # noqa: SIM115 - closed below
    try:
        yield
    finally:
        for name in replaced:
            with contextlib.suppress(OSError, ValueError):
                getattr(sys, name).close()
            setattr(sys, name, saved[name])
        for fd in filled:
            with contextlib.suppress(OSError):
                os.close(fd)


def _writable(stream: object) -> bool:
    """False for a stream on a descriptor opened read-only (a shell wrapper's script took the closed
    descriptor 2 before exec'ing Python: every write failed with EBADF); True when unknown."""
    import fcntl

    try:
        flags = fcntl.fcntl(stream.fileno(), fcntl.F_GETFL)  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return True
    return flags & os.O_ACCMODE != os.O_RDONLY


class StdoutError(Exception):
    """Standard output could not be written (a full disk, /dev/full, a closed pipe)."""


def check_stdout_written() -> None:
    """Flush stdout; raise ``StdoutError`` naming it if the write fails (then stdout is /dev/null, so
    the interpreter's own flush at exit cannot print a second error)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # its reader left (``| head -1``): the output ends there, the command's exit code stands
        _silence_stdout()
    except (OSError, ValueError) as err:
        _silence_stdout()
        raise StdoutError(getattr(err, "strerror", None) or str(err)) from None


def _silence_stdout() -> None:
    if sys.stdout is sys.__stdout__ and sys.stdout is not None:
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)


def _stdout_failed(err: OSError) -> bool:
    """Whether ``err`` (no file name) came from writing stdout: stdout fails again when flushed."""
    if err.filename is not None or sys.stdout is None:
        return False
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        _silence_stdout()
        return True
    return False


@contextlib.contextmanager
def crash_file() -> Iterator[None]:
    """Python's stacks at a crash in native code (SIGSEGV, SIGABRT) go to a file, not the terminal.

    A library that cannot allocate under ``ulimit -v`` may crash instead of raising; the memory
    preflight refuses such runs, and if one still crashes, ``$TMPDIR/attn-export-crash-*.txt``
    holds where (the next run into the same --out restores the previous run). Left alone when
    faulthandler is already on (``python -X faulthandler``, pytest). Removed after a clean exit."""
    if faulthandler.is_enabled():
        yield
        return
    try:
        f = tempfile.NamedTemporaryFile("w", prefix="attn-export-crash-", suffix=".txt", delete=False)  # noqa: SIM115 - closed below
    except OSError:
        yield
        return
    try:
        f.write(f"attn-export (pid {os.getpid()}) crashed in native code; the Python stacks at the crash follow.\n")
        f.flush()
        faulthandler.enable(file=f, all_threads=True)
        yield
    finally:
        faulthandler.disable()
        f.close()
        with contextlib.suppress(OSError):
            os.unlink(f.name)


def _interrupted(signum: int) -> int:
    from attn_export.host.signals import announce

    return announce(signum)  # one line per command, however many times the interrupt surfaces


def main(argv: list[str] | None = None) -> int:
    """Console entry point; see the module docstring for the exit codes."""
    from attn_export.host.signals import Terminated, interrupt_signals, received
    from attn_export.host.paths import COMMAND_LINE

    argv = list(sys.argv[1:] if argv is None else argv)
    token = COMMAND_LINE.set(("attn-export", *argv))
    try:
        with standard_streams(), crash_file(), interrupt_signals():
            try:
                code = _dispatch(argv)
                check_stdout_written()
                return code
            except KeyboardInterrupt:
                return _interrupted(signal.SIGINT)
            except Terminated:
                return _interrupted(signal.SIGTERM)
            except StdoutError as e:
                print(f"attn-export: error: cannot write to standard output: {_one_line(str(e))}; redirect it to a writable file", file=sys.stderr)
                return 2
            except Exception as e:  # noqa: BLE001 - a signal wrapped into another exception, or an internal error
                if received() is not None:
                    return _interrupted(received())  # type: ignore[arg-type]
                if isinstance(e, OSError) and _stdout_failed(e):
                    print(f"attn-export: error: cannot write to standard output: {e.strerror or e}; redirect it to a writable file", file=sys.stderr)
                    return 2
                ran_out = memory_ran_out(e)
                if ran_out:
                    print(f"attn-export: error: {ran_out}", file=sys.stderr)
                    return 2
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
    from attn_export.host.signals import received
    from attn_export.host.process import ProcessSettings, process_settings

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
            print(f"attn-export: error: {_one_line(str(e))}", file=sys.stderr)  # our own message says what ran out and the fix
            return 2
        if received() is not None or rv == 130:  # typer returns Ctrl-C as exit code 130, without a word
            return _interrupted(received() or signal.SIGINT)
        return rv if isinstance(rv, int) else 0
