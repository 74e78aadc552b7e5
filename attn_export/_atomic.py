"""Write-then-rename, so a crash or a bad input never leaves a half-written file behind.

``with atomic_path(final) as tmp:`` gives a temporary path in the same folder; on success
it gets normal file permissions (mkstemp's 0600 is for secrets, not models) and is renamed
over ``final``; on any exception it is removed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "atomic_write_bytes"]


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
