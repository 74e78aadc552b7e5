"""Checks on the paths a run reads and writes, made before any model is built.

A run that fails after 60 seconds because ``--bundle`` names a file, or because ``--out`` is
read-only, wastes the user's time and can leave half an output behind. These checks create
nothing: an output folder that does not exist yet is judged by its nearest existing parent.
"""

from __future__ import annotations

import os
from pathlib import Path

from attn_export.errors import ConfigError

__all__ = ["check_input_file", "check_output_dir", "check_output_file"]

_PSEUDO_FS = ("/proc", "/sys", "/dev")


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _refuse_pseudo(path: Path, flag: str) -> None:
    resolved = str(path.absolute())
    if any(resolved == root or resolved.startswith(root + "/") for root in _PSEUDO_FS):
        raise ConfigError(f"{flag} {path} is on a kernel pseudo-filesystem; pass a folder on a real disk")


def check_output_dir(path: Path, flag: str = "--out") -> None:
    """``path`` is, or can become, a writable directory (nothing is created)."""
    path = Path(path)
    _refuse_pseudo(path, flag)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file; pass a directory (it is created if missing)")
    parent = _nearest_existing(path)
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: {parent} is a file, so the folder cannot be created; pass another {flag}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: {parent} is not writable; pass a writable {flag} DIR")


def check_output_file(path: Path, flag: str) -> None:
    """``path`` can be written as a file: not a directory, and its folder exists or can be created writable."""
    path = Path(path)
    _refuse_pseudo(path, flag)
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a directory; pass a file path")
    check_output_dir(path.parent if str(path.parent) else Path("."), flag)


def check_input_file(path: Path, flag: str, allow_dir: bool = False) -> None:
    """``path`` exists and is a readable file (or a folder where ``allow_dir``)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{flag} {path} does not exist; check the path")
    if path.is_dir() and not allow_dir:
        raise ConfigError(f"{flag} {path} is a directory; pass a file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{flag} {path} is not readable; check its permissions")
