"""Every file a checkpoint loader opens resolves inside the checkpoint directory.

A config or index naming ``../../outside/x.safetensors``, ``/etc/passwd`` or a symlink out of
the folder is refused unopened. The one exception is a Hugging Face cache snapshot
(``<repo>/snapshots/<rev>/``), whose files are symlinks into ``<repo>/blobs/``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from attn_export.errors import CheckpointError

__all__ = ["allowed_roots", "inside"]

log = logging.getLogger(__name__)


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
