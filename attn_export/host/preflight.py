"""What the process itself must have before a command starts: a current folder, UTF-8 arguments, file descriptors.

Why each one, and why here (before typer, torch or onnxruntime is imported):

* **a deleted current folder**: ``os.getcwd()`` raises ``FileNotFoundError``; Python's import
  system, ``os.path.abspath`` and every relative path fail with tracebacks, and torch's oneMKL
  aborts the process at import ("Cannot load libtorch_cpu.so") leaving ``run.json`` "running";
* **arguments that are not UTF-8** (a folder named with a Latin-1 byte, under ``LANG=C`` or
  any locale): Python keeps such bytes as lone surrogates, which onnxruntime's and torch's
  C++ bindings cannot convert (an internal error after the model was built);
* **too few file descriptors** (``ulimit -n``): the imports alone open more than a dozen
  shared libraries, and a run holds its lock, ``--out`` and the model files open; under the
  limit a run failed half-way with EMFILE and could not even clean up. ``MIN_OPEN_FILES`` is
  what a tiny run needs, measured, with room to spare; a soft limit below it is raised up to
  the hard one where the hard one allows (any process may), and refused only where it does not.

Each problem is one line naming it and the fix; the entry point prints it and exits 2.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["MIN_OPEN_FILES", "environment_problem"]

# Measured: the smallest main-command run fails with EMFILE under ``ulimit -n 16`` and passes under 20; a checkpoint's
# tokenizer and weight files, ONNX Runtime's and TensorRT's libraries add more. Three times that leaves room.
MIN_OPEN_FILES = 64


def _cwd_problem() -> str | None:
    try:
        os.getcwd()
    except FileNotFoundError:
        return "the current folder was deleted (os.getcwd() fails); cd into a folder that exists and run again"
    except OSError as err:
        return f"the current folder cannot be read ({err.strerror or err}); cd into a folder you can read and run again"
    return None


def _utf8_problem(argv: Sequence[str]) -> str | None:
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = os.fsencode(arg).decode("ascii", "backslashreplace")  # the raw bytes, printable under any locale
            return (f"the argument {shown!r} is not valid UTF-8; rename the file or folder to a UTF-8 name "
                    "(attn-export's libraries need UTF-8 paths)")
    return None


def _open_files_problem() -> str | None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= MIN_OPEN_FILES:
        return None
    if hard == resource.RLIM_INFINITY or hard >= MIN_OPEN_FILES:
        try:  # the soft limit may be raised up to the hard one without privileges: do so, as many programs do
            resource.setrlimit(resource.RLIMIT_NOFILE, (MIN_OPEN_FILES, hard))
            return None
        except (ValueError, OSError):
            pass
    return (f"the open-file limit is {soft} (ulimit -n), below the {MIN_OPEN_FILES} a run needs; "
            f"raise it (ulimit -n {MIN_OPEN_FILES} or more) and run again")  # fmt: skip


def environment_problem(argv: Sequence[str]) -> str | None:
    """The first problem of the process's environment that stops any command, as one line; None when there is none."""
    return _cwd_problem() or _utf8_problem(argv) or _open_files_problem()
