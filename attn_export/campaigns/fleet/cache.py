"""The content-addressed cache of whole point folders, safe under concurrent writers, with LRU eviction.

Granularity: one entry per point, keyed by what determines every file the point writes: the model's
content (sha256 of every file of a checkpoint folder, or the shipped name and attn-export's version),
the point's canonical RunConfig (recipe, target, TensorRT release, GPU arch, engine build options),
the versions a run records (attn-export, Python, torch, onnx, onnxruntime and its build, numpy), and the target's compute capability (its sm label) for GPU points.
A changed recipe changes only its points' keys; an entry is written in a temporary sibling and renamed
into place (``os.rename`` of a folder is atomic on one filesystem: a reader sees none or all of it, and of
two concurrent writers the first rename wins and the second discards its copy).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attn_export.host.environment import package_versions
from attn_export.outdir.manifest import sha256_file

__all__ = ["Cache", "point_key"]

_USED = ".last-used"


def model_hash(checkpoint: str | None) -> str:
    """sha256 over a checkpoint folder's files (path and content); a shipped name or reference layer hashes by name."""
    h = hashlib.sha256()
    folder = Path(checkpoint) if checkpoint else None
    if folder is None or not folder.is_dir():
        h.update(f"named:{checkpoint}".encode())
        return h.hexdigest()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode() + b"\0" + sha256_file(f).encode())
    return h.hexdigest()


def point_key(config_dict: dict[str, Any], checkpoint: str | None, compute_capability: str | None = None) -> str:
    """The cache key of a point: model content + canonical RunConfig (minus where it writes) + versions (+ the target's GPU)."""
    canon = {k: v for k, v in config_dict.items() if k not in ("out", "force", "render")}
    payload = {"model": model_hash(checkpoint), "config": canon, "versions": package_versions(), "cc": compute_capability}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


class Cache:
    """``root/entries/<key>/`` (a point's whole output folder); ``limit_bytes`` bounds the total, oldest-used evicted first."""

    def __init__(self, root: str | os.PathLike[str], limit_bytes: int) -> None:
        self.root = Path(root)
        self.limit_bytes = limit_bytes

    def entry(self, key: str) -> Path:
        return self.root / "entries" / key

    def get(self, key: str) -> Path | None:
        """The entry, marked used now (LRU), or None."""
        path = self.entry(key)
        if not (path / "report.json").is_file():
            return None
        with contextlib.suppress(OSError):
            (path / _USED).touch()
        return path

    @contextlib.contextmanager
    def writing(self, key: str) -> Iterator[Path]:
        """A temporary folder to fill; renamed to the entry when the block succeeds (the first writer wins)."""
        (self.root / "entries").mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", suffix=".tmp", dir=self.root / "entries"))
        try:
            yield tmp
            (tmp / _USED).touch()
            try:
                os.rename(tmp, self.entry(key))
            except OSError:  # another writer renamed its copy first (ENOTEMPTY/EEXIST): theirs is as good
                if not self.entry(key).is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.evict()

    def evict(self) -> list[str]:
        """Remove least-recently-used entries until the total is within the limit; returns the keys removed."""
        entries = [p for p in (self.root / "entries").glob("*") if p.is_dir() and not p.name.startswith(".")]
        sizes = {p: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) for p in entries}
        total, removed = sum(sizes.values()), []
        used = {p: (p / _USED).stat().st_mtime if (p / _USED).exists() else 0.0 for p in entries}
        for p in sorted(entries, key=used.__getitem__):
            if total <= self.limit_bytes:
                break
            gone = p.with_name(f".{p.name}.evicted")  # renamed away first: a reader never sees a half-removed entry
            with contextlib.suppress(OSError):
                os.rename(p, gone)
                shutil.rmtree(gone, ignore_errors=True)
                total -= sizes[p]
                removed.append(p.name)
        return removed
