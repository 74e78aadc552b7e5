"""Helpers every subcommand shares: consoles, progress output and comma-list parsing.

Progress goes to stderr, and only where a person watches: on a terminal, or with
``--progress``. A CI log gets one plain line per step (never ``\r`` redraws), and results go
to stdout.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from attn_export.errors import ConfigError
from attn_export.vocab.choices import is_ascii_digits

__all__ = ["writing", "JsonFlag", "QuietFlag", "ThreadsFlag", "err_console", "int_in", "ints", "out_console", "progress_bar",
           "progress_lines", "strs"]


class _StdoutConsole(Console):
    """rich's console on stdout: a reader that closed the pipe (``... | head -1``) ends the output, not the run.

    rich's own ``on_broken_pipe`` raises ``SystemExit(1)``: a passing run piped into ``head -1``
    exited 1 with no word. This does what Python's signal docs ("Note on SIGPIPE") advise: point
    stdout at /dev/null and go on, so the command's own exit code stands."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more to write: rich drops its buffer
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass  # stdout is not a descriptor (captured): quiet is enough


# Logs and CI capture are not terminals: rich would wrap wide tables at 80 columns there.
out_console = _StdoutConsole(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

QuietFlag = Annotated[bool, typer.Option("--quiet", "-q", metavar="", help="No progress output; print only the result.")]
JsonFlag = Annotated[bool, typer.Option("--json", metavar="", help="Print machine-readable JSON on stdout.")]
ThreadsFlag = Annotated[int | None, typer.Option("--threads", help="Threads for eager and ONNX Runtime.", show_default="all cores")]


def progress_lines(enabled: bool) -> Callable[[str], None] | None:
    """A ``say(msg)`` that prints "• msg" on stderr, or None when progress is off."""
    if not enabled:
        return None
    return lambda msg: err_console.print(f"[dim]•[/dim] {msg}", highlight=False, soft_wrap=not err_console.is_terminal)


@contextmanager
def progress_bar(enabled: bool, label: str) -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress bar on a terminal, plain lines elsewhere, fed by ``callback(message, done, total)``."""
    if not enabled:
        yield lambda msg, done, total: None
        return
    if not err_console.is_terminal:  # CI logs: one plain line per step instead of a redrawn bar
        yield lambda msg, done, total: err_console.print(f"{label} [{done}/{total or '?'}] {msg}", highlight=False)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    cols = (TextColumn(f"[bold]{label}[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"))
    with Progress(*cols, console=err_console, transient=True) as bar:
        task = bar.add_task("", total=None)
        yield lambda msg, done, total: bar.update(task, description=msg, completed=done, total=total if total > 0 else None)


# A comma list multiplies work (bench runs every value of one list with every value of another): each value
# once, and at most this many, so a pasted 20,000-value list is refused before the first run, not after days.
MAX_LIST_VALUES = 32


def distinct(values: tuple[object, ...], flag: str) -> None:
    """A comma list of at most ``MAX_LIST_VALUES`` distinct values; one line naming ``flag`` otherwise."""
    if len(values) > MAX_LIST_VALUES:
        raise ConfigError(f"expected at most {MAX_LIST_VALUES} values in {flag} (each one more run), got {len(values)}; pass fewer")
    if len(set(values)) != len(values):
        repeated = next(v for v in values if values.count(v) > 1)
        raise ConfigError(f"expected each {flag} value once, got {repeated} {values.count(repeated)} times; "
                          f"use {flag} {','.join(map(str, dict.fromkeys(values)))}")  # fmt: skip


def ints(text: str | None, flag: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    parts = [t.strip() for t in text.split(",") if t.strip()]
    if not all(is_ascii_digits(t.removeprefix("-")) and len(t) <= 30 for t in parts):
        raise ConfigError(f"expected {flag} as comma-separated integers like 128,512, got {text[:80]!r}")
    values = tuple(int(t) for t in parts)
    distinct(values, flag)
    return values



def int_in(flag: str, value: int | None, lo: int, hi: int) -> None:
    """``value`` (when given) lies in [lo, hi]; a one-line ConfigError naming ``flag`` otherwise."""
    if value is not None and not lo <= value <= hi:
        raise ConfigError(f"expected {flag} in [{lo}, {hi}], got {value}")


def strs(text: str | None, flag: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    values = tuple(t.strip() for t in text.split(",") if t.strip())
    distinct(values, flag)
    return values


@contextmanager
def writing(path: Path, flag: str) -> Iterator[None]:
    """An OSError while writing an output (read-only folder, /proc, a full disk) as one line."""
    try:
        yield
    except OSError as err:
        raise ConfigError(f"{flag} {path}: expected a writable path, got {err.strerror or err}; pass a writable path") from None
