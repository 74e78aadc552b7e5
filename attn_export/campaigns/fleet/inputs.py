"""What a fleet point reads, checked and hashed before any work: its checkpoint, its texts (``--calib``,
from ``fleet.texts`` or a recipe) and a hand-written Triton config.

Why: the cache key must hold the content of every input, not its path (texts edited in place, or
another model saved under a recipe's ``--checkpoint`` name, must rebuild the points that read them);
and a path that cannot be the input must be refused before the first point runs, and before a whole
tree is hashed (``checkpoint = "/usr"`` is refused by its missing config.json, not after minutes of
hashing). Every folder is bounded in files and bytes before one byte of it is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from attn_export.errors import ConfigError
from attn_export.outdir.manifest import sha256_file

__all__ = ["MAX_CHECKPOINT_BYTES", "MAX_CHECKPOINT_FILES", "MAX_INPUT_BYTES", "InputDigests"]

MAX_CHECKPOINT_FILES = 10_000  # a Hugging Face checkpoint holds tens of files; a tree of thousands is not one
MAX_CHECKPOINT_BYTES = 256 << 30  # 256 GiB: above the largest encoder the toolkit exports, in any precision
MAX_INPUT_BYTES = 16 << 30  # a texts file or a calibration folder


def _fail(where: str, problem: str) -> ConfigError:
    return ConfigError(f"{where}: {problem}")


def _listing(folder: Path, where: str, what: str) -> list[tuple[str, Path, int]]:
    """(relative name, path, size) of every file under ``folder``, bounded before anything is read.

    A link to a file is followed (a Hugging Face hub snapshot links its files to blobs); a link to a
    folder is not walked (it could lead anywhere, or loop)."""
    found: list[tuple[str, Path, int]] = []
    total = 0
    for top, dirs, files in os.walk(folder, onerror=None, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = Path(top) / name
            try:
                st = path.stat()
            except OSError as e:
                raise _fail(where, f"{what} {folder}: {path} cannot be read ({e.strerror or e}); fix it") from None
            if not stat.S_ISREG(st.st_mode):
                continue  # a FIFO or a device in the folder is no file of the model: never opened
            found.append((path.relative_to(folder).as_posix(), path, st.st_size))
            total += st.st_size
            if len(found) > MAX_CHECKPOINT_FILES:
                raise _fail(where, f"{what} {folder} holds over {MAX_CHECKPOINT_FILES} files; pass one model's folder")
            if total > MAX_CHECKPOINT_BYTES:
                raise _fail(where, f"{what} {folder} holds over {MAX_CHECKPOINT_BYTES >> 30} GiB; pass one model")
    return found


class InputDigests:
    """The content digest of every input a point names, each path hashed once per fleet (memoised)."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, str], str] = {}

    def point(self, config: Any, where: str) -> str:
        """sha256 over the content of the point's checkpoint, texts and hand Triton config (what its key must hold)."""
        parts: dict[str, str] = {}
        if config.checkpoint is not None:
            parts["checkpoint"] = self._checkpoint(str(config.checkpoint), where)
        if config.calib is not None:
            parts["calib"] = self._input(Path(config.calib), "--calib", where, allow_dir=not config.is_checkpoint)
        if config.triton_config is not None:
            parts["triton_config"] = self._input(Path(config.triton_config), "--triton-config", where, allow_dir=False)
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def _memoised(self, kind: str, path: str, compute: Any) -> str:
        if (kind, path) not in self._memo:
            self._memo[kind, path] = compute()
        return self._memo[kind, path]

    def _checkpoint(self, name: str, where: str) -> str:
        from attn_export.checkpoint.config_file import KNOWN_CHECKPOINTS

        folder = Path(name).expanduser()
        if not folder.is_dir():
            if name in KNOWN_CHECKPOINTS:  # a shipped model: its package's version is in every key (package_versions)
                return f"named:{name}"
            known = ", ".join(KNOWN_CHECKPOINTS)
            raise _fail(where, f"checkpoint {name} is neither a folder nor a shipped name ({known}); "
                               "pass a checkpoint folder (relative to the fleet file) or a shipped name")  # fmt: skip
        config_json = folder / "config.json"
        if not config_json.is_file():  # checked first: /usr is refused at once, not after hashing it
            raise _fail(where, f"checkpoint {folder} holds no config.json, so it is not a checkpoint folder; "
                               "pass the folder a Hugging Face model was saved to")  # fmt: skip
        return self._memoised("folder", str(folder.resolve()), lambda: self._folder(folder, where, "checkpoint"))

    def _folder(self, folder: Path, where: str, what: str) -> str:
        h = hashlib.sha256()
        for rel, path, _size in _listing(folder, where, what):
            h.update(rel.encode() + b"\0" + sha256_file(path).encode() + b"\n")
        return h.hexdigest()

    def _input(self, path: Path, flag: str, where: str, allow_dir: bool) -> str:
        from attn_export.host.paths import check_input_file

        try:
            check_input_file(path, flag, allow_dir=allow_dir)  # exists, readable, not a FIFO or device
        except ConfigError as e:
            raise _fail(where, str(e)) from None
        if path.is_dir():
            return self._memoised("folder", str(path.resolve()), lambda: self._folder(path, where, flag))
        size = path.stat().st_size
        if size > MAX_INPUT_BYTES:
            raise _fail(where, f"{flag} {path} is over {MAX_INPUT_BYTES >> 30} GiB; pass a smaller set of texts")
        return self._memoised("file", str(path.resolve()), lambda: sha256_file(path))
