"""Every file a checkpoint loader, transformers or sentence-transformers opens resolves inside the checkpoint directory.

A config or index naming ``../../outside/x.safetensors``, ``/etc/passwd`` or a symlink out of
the folder is refused unopened. The one exception is a Hugging Face cache snapshot
(``<repo>/snapshots/<rev>/``), whose files are symlinks into ``<repo>/blobs/``.

transformers and sentence-transformers open files by name (``tokenizer_config.json``,
``special_tokens_map.json``, ``vocab.txt``, ``README.md``, the module folders' configs), so
``check_checkpoint_files`` checks every file of the folder and of its subfolders before any
of them is read: each must resolve inside the checkpoint, be a regular file (a FIFO or a
device is named from its ``stat``, never opened) and, for the files read whole into memory
(JSON, vocabularies), be no larger than a bound (``st_size``, checked without reading).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from attn_export.errors import CheckpointError

__all__ = ["JSON_MAX_BYTES", "TOKENIZER_MAX_BYTES", "allowed_roots", "check_checkpoint_files", "inside", "max_bytes_of", "regular_stat"]

log = logging.getLogger(__name__)

# config.json, modules.json, tokenizer_config.json, the sentence-transformers configs: a few KB
# (a config with 100k labels: ~3 MB). tokenizer.json and vocabularies: XLM-R's is 17 MB.
JSON_MAX_BYTES = 16 * 2**20
TOKENIZER_MAX_BYTES = 512 * 2**20
_VOCAB_SUFFIXES = (".txt", ".model")  # vocab.txt, merges.txt, sentencepiece.bpe.model, spiece.model
_MAX_ENTRIES = 10_000  # a checkpoint folder holds tens of files


def allowed_roots(checkpoint_dir: Path) -> list[Path]:
    """Where the checkpoint's files may resolve to: the directory itself and, for a Hugging Face
    cache snapshot (``<repo>/snapshots/<rev>/``, whose files are symlinks into ``<repo>/blobs/``),
    that repository's blob store."""
    root = checkpoint_dir.resolve()
    roots = [root]
    if root.parent.name == "snapshots":
        roots.append(root.parent.parent / "blobs")
    return roots


def inside(checkpoint_dir: Path, name: str, what: str) -> Path:
    """``checkpoint_dir / name`` if it resolves (symlinks followed) inside the checkpoint; never opened otherwise."""
    path = checkpoint_dir / name
    try:
        real = path.resolve()
    except (OSError, RuntimeError, ValueError) as err:  # a symlink loop, a NUL byte
        raise CheckpointError(f"{path}: {what}: expected a file inside {checkpoint_dir}, got an unresolvable path ({err}); fix the checkpoint") from None
    if not any(real == r or real.is_relative_to(r) for r in allowed_roots(checkpoint_dir)):
        raise CheckpointError(
            f"{path}: {what}: expected a file inside the checkpoint directory {checkpoint_dir}, got one resolving to {real}; "
            "copy the file into the checkpoint directory"
        )
    return path


def max_bytes_of(name: str) -> int | None:
    """The size bound of a file read whole into memory (None: weights and files no reader loads whole)."""
    if name == "tokenizer.json" or name.endswith(_VOCAB_SUFFIXES):
        return TOKENIZER_MAX_BYTES
    return JSON_MAX_BYTES if name.endswith(".json") else None


def regular_stat(path: Path, st: os.stat_result, bound: int | None) -> None:
    """Refuse, from its stat, a checkpoint file that is not a regular file or exceeds ``bound`` bytes."""
    from attn_export.host.paths import file_kind

    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(
            f"{path.name} is {file_kind(st.st_mode)}, not a regular file ({path}); replace it with the checkpoint's own "
            "file (FIFOs and devices are never opened)"
        )
    if bound is not None and st.st_size > bound:
        raise CheckpointError(
            f"{path}: expected at most {bound:,} bytes (a checkpoint's {path.name} is far smaller), got {st.st_size:,}; "
            "replace it with the checkpoint's original one"
        )


def _check_entry(checkpoint_dir: Path, rel: str) -> bool:
    """Check one entry (a regular file or a folder, inside, bounded); True when it is a folder. The kind comes first:
    a link to ``/dev/zero`` is named a device, not a file to copy in."""
    path = checkpoint_dir / rel
    try:
        st = path.stat()
    except FileNotFoundError:  # a dangling link: no reader can open it
        return False
    except OSError as err:  # a link loop, a folder without permission
        inside(checkpoint_dir, rel, "checkpoint file")
        raise CheckpointError(f"{path}: expected a checkpoint file, got an unreadable entry ({err.strerror or err}); fix or remove it") from None
    is_dir = stat.S_ISDIR(st.st_mode)
    if not is_dir:
        regular_stat(path, st, None)
    inside(checkpoint_dir, rel, "checkpoint file")
    if not is_dir:
        regular_stat(path, st, max_bytes_of(path.name))
    return is_dir


def _entries(checkpoint_dir: Path, folder: str) -> list[str]:
    """The non-hidden names in ``folder`` (relative to the checkpoint), sorted so the first problem named is stable."""
    try:
        with os.scandir(checkpoint_dir / folder) as entries:
            names = sorted(e.name for e in entries if not e.name.startswith("."))
    except OSError as err:
        raise CheckpointError(f"{checkpoint_dir / folder}: expected a readable checkpoint folder, got {err.strerror or err}; fix its permissions") from None
    return [f"{folder}/{name}" if folder else name for name in names]


def check_checkpoint_files(checkpoint_dir: Path) -> None:
    """Every file of the folder and of its subfolders (sentence-transformers modules) resolves inside it, is a regular
    file and, if read whole, is within its size bound; hidden entries (``.git``, ``.cache``) are no reader's input."""
    seen = 0
    folders = [""]
    for depth in range(2):
        below = []
        for folder in folders:
            names = _entries(checkpoint_dir, folder)
            seen += len(names)
            if seen > _MAX_ENTRIES:
                raise CheckpointError(
                    f"{checkpoint_dir}: expected a checkpoint folder (tens of files), got more than {_MAX_ENTRIES:,} files; pass the model's own folder"
                )
            below += [rel for rel in names if _check_entry(checkpoint_dir, rel) and depth == 0]
        folders = below
