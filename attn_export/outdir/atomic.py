"""Write-then-rename, so a crash or a bad input never leaves a half-written file behind.

``with atomic_path(final) as tmp:`` gives a temporary path in the same folder; on success
it gets normal file permissions (mkstemp's 0600 is for secrets, not models) and is renamed
over ``final``; on any exception it is removed.

``atomic_write_at(dir_fd, name, data)`` does the same inside a folder held open as a file
descriptor (``attn_export.outdir.claim``): the temporary file is created with ``O_EXCL |
O_NOFOLLOW`` and renamed with ``renameat``, so a symbolic link planted at either name is
never written through (rename replaces the link itself), and the data is fsync'ed before the
rename: the file is either the old one or the complete new one, after a crash too.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "atomic_write_at", "atomic_write_bytes"]


def _readable_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary sibling of ``path``; rename it to ``path`` when the block succeeds."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, _readable_mode())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes | memoryview) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(bytes(data))
    return Path(path)


def atomic_write_at(dir_fd: int, name: str, data: bytes) -> None:
    """Replace ``name`` in the folder ``dir_fd`` by ``data`` atomically, following no link."""
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"  # the names atomic_path uses, so leftovers look alike
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _readable_mode(), dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
