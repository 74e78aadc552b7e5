"""Checks on the paths a run reads and writes, made before any model is built.

A run that fails after 60 seconds because ``--bundle`` names a file, or because ``--out`` is
read-only, wastes the user's time and can leave half an output behind. These checks create
nothing: an output folder that does not exist yet is judged by its nearest existing parent.

Inputs must be regular files (or folders where a folder is accepted). A FIFO, a character or
block device or a socket is refused from its ``stat`` alone, never opened: opening a FIFO
blocks until a writer appears, and ``/dev/zero`` reports size 0, so a size check passes and
a read never ends. ``stat`` does not open the file, so the refusal is immediate.
"""

from __future__ import annotations

import os
import stat
from contextvars import ContextVar
from pathlib import Path

from attn_export.errors import AttnExportError, ConfigError

__all__ = ["COMMAND_LINE", "check_input_file", "check_name_lengths", "check_output_dir", "check_output_file", "check_regular_file", "file_kind", "given_empty"]

_PSEUDO_FS = ("/proc", "/sys", "/dev")

# The argv of the CLI command in progress (set by cli.app; None outside it): run.json records
# it, and ``given_empty`` reads it because typer turns ``--out ''`` into ``.``.
COMMAND_LINE: ContextVar[tuple[str, ...] | None] = ContextVar("attn_export_command_line", default=None)


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _refuse_pseudo(path: Path, flag: str, resolve: bool = False, what: str = "a folder") -> None:
    resolved = os.path.realpath(path) if resolve else str(path.absolute())
    if any(resolved == root or resolved.startswith(root + "/") for root in _PSEUDO_FS):
        raise ConfigError(f"{flag} {path} is on a kernel pseudo-filesystem; pass {what} on a real disk")


def given_empty(flag: str) -> bool:
    """Whether the command line in progress passed ``flag ''`` (or ``flag=``) as its last value.

    ``Path("")`` is ``Path(".")``, so an empty ``--out`` used to write into the current
    directory; once parsed the two cannot be told apart, so this reads the raw command line
    (``COMMAND_LINE``, set by the CLI; None outside it).
    """

    argv = COMMAND_LINE.get() or ()
    value: str | None = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value is not None and not value.strip()


def _refuse_empty(flag: str, what: str) -> None:
    if given_empty(flag):
        raise ConfigError(f"{flag} '': expected {what}, got an empty string; pass a path (e.g. {flag} out)")


_NAME_MAX, _PATH_MAX = 255, 4096  # bytes: Linux's limits for one name and for a whole path


def check_name_lengths(path: Path, flag: str) -> None:
    """A name over NAME_MAX (or a path over PATH_MAX) fails every call with ENAMETOOLONG: refuse it by name first."""
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > _NAME_MAX:
            raise ConfigError(f"{flag}: expected each folder or file name within {_NAME_MAX} bytes (the filesystem's limit), got one of {size} "
                              f"bytes ({part[:24]}...); pass a shorter {flag}")  # fmt: skip
    size = len(os.fsencode(os.path.abspath(path)))
    if size >= _PATH_MAX:
        raise ConfigError(f"{flag}: expected a path within {_PATH_MAX - 1} bytes, got {size}; pass a shorter {flag}")


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words: "a regular file", "a FIFO", "a character device"..."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def check_regular_file(path: str | os.PathLike[str], what: str, error: type[AttnExportError] = ConfigError,
                       allow_dir: bool = False) -> os.stat_result | None:  # fmt: skip
    """Refuse ``path`` if it exists and is neither a regular file nor (``allow_dir``) a folder.

    Follows symbolic links (an input may be a link to a real file) but never opens the file.
    Returns the stat, or None when nothing is there (the caller says "does not exist" its way).
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as err:  # a link loop, a parent without permission
        raise error(f"{what} {path} cannot be inspected ({err.strerror or err}); check the path") from None
    if stat.S_ISREG(st.st_mode) or (allow_dir and stat.S_ISDIR(st.st_mode)):
        return st
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {path} is a directory; pass a file")
    expected = "a regular file or a folder" if allow_dir else "a regular file"
    raise error(f"{what} {path} is {file_kind(st.st_mode)}, not {expected}; pass {expected} (FIFOs and devices are never opened)")


def check_output_dir(path: Path, flag: str = "--out") -> None:
    """``path`` is, or can become, a writable directory (nothing is created)."""
    path = Path(path)
    _refuse_empty(flag, "a folder")
    check_name_lengths(path, flag)
    _refuse_pseudo(path, flag)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file; pass a directory (it is created if missing)")
    parent = _nearest_existing(path)
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: {parent} is a file, so the folder cannot be created; pass another {flag}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: {parent} is not writable; pass a writable {flag} DIR")


def check_output_file(path: Path, flag: str) -> None:
    """``path`` can be written as a file: not a directory or a FIFO/device, and its folder exists or can be created writable."""
    path = Path(path)
    _refuse_empty(flag, "a file path")
    check_name_lengths(path, flag)
    _refuse_pseudo(path, flag)
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a directory; pass a file path")
    if os.path.lexists(path):
        check_regular_file(path, flag)
    check_output_dir(path.parent if str(path.parent) else Path("."), flag)


def check_input_file(path: Path, flag: str, allow_dir: bool = False) -> None:
    """``path`` exists and is a readable regular file (or a folder where ``allow_dir``); never opened here."""
    path = Path(path)
    _refuse_empty(flag, "a file" if not allow_dir else "a file or folder")
    if check_regular_file(path, flag, allow_dir=allow_dir) is None:
        raise ConfigError(f"{flag} {path} does not exist; check the path")
    _refuse_pseudo(path, flag, resolve=True, what="a file")  # /proc/kmsg is "regular" and blocks; /proc/self/fd/0 is stdin
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{flag} {path} is not readable; check its permissions")
