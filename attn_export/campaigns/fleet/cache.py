"""The content-addressed cache of whole point folders, safe under concurrent writers, with LRU eviction.

Granularity: one entry per point, keyed by what determines every file the point writes: the content of
every input it reads (``inputs.InputDigests``: the checkpoint's files, the texts, a hand Triton config;
a shipped name by name), the point's canonical RunConfig (recipe, target, TensorRT release, GPU arch,
engine build options), the versions a run records (attn-export, Python, torch, onnx, onnxruntime and
its build, numpy), and the target's compute capability (its sm label) for GPU points.
A changed recipe changes only its points' keys; an entry is written in a temporary sibling and renamed
into place (``os.rename`` of a folder is atomic on one filesystem: a reader sees none or all of it, and of
two concurrent writers the first rename wins and the second discards its copy).

An entry is served only once verified (``entry_check``): its record (``fleet-entry.json``, written last
into the temporary folder) names its key and the sha256 of every file in it; a link, a file missing,
added or changed, or a record for another key makes it a miss, and the caller rebuilds it.
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

from attn_export.campaigns.fleet.entry import entry_check, write_record
from attn_export.host.environment import package_versions

__all__ = ["Cache", "canonical_config", "point_key"]

_USED = ".last-used"


def canonical_config(config_dict: dict[str, Any]) -> dict[str, Any]:
    """The RunConfig as it enters the key: without where it writes, as JSON carries it (run.json's config compares)."""
    canon = {k: v for k, v in config_dict.items() if k not in ("out", "force", "render")}
    return json.loads(json.dumps(canon, sort_keys=True, default=str))


def point_key(config_dict: dict[str, Any], inputs: str, compute_capability: str | None = None) -> str:
    """The cache key of a point: its inputs' content + canonical RunConfig + versions (+ the target's GPU)."""
    payload = {"inputs": inputs, "config": canonical_config(config_dict), "versions": package_versions(),
               "cc": compute_capability}  # fmt: skip
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


class Cache:
    """``root/entries/<key>/`` (a point's whole output folder); ``limit_bytes`` bounds the total, oldest-used evicted first."""

    def __init__(self, root: str | os.PathLike[str], limit_bytes: int) -> None:
        self.root = Path(root)
        self.limit_bytes = limit_bytes

    def entry(self, key: str) -> Path:
        return self.root / "entries" / key

    def get(self, key: str) -> Path | None:
        """The verified entry, marked used now (LRU), or None (see ``lookup`` for why)."""
        return self.lookup(key)[0]

    def lookup(self, key: str) -> tuple[Path | None, str | None]:
        """(entry, None) for an entry that verifies; (None, why) for one that does not, which is removed
        (a link is unlinked, never followed); (None, None) when there is none."""
        path = self.entry(key)
        if not os.path.lexists(path):
            return None, None
        why = entry_check(path, key, ignore=(_USED,))
        if why is not None:
            self.discard(key)
            return None, why
        with contextlib.suppress(OSError):
            (path / _USED).touch()
        return path, None

    def discard(self, key: str) -> None:
        """Take an entry out of the cache: renamed away first (a reader never sees half of it), then removed;
        a link is removed as a link, and the folder it points to is left alone."""
        path = self.entry(key)
        gone = path.with_name(f".{key}.{os.getpid()}.rejected")
        try:
            os.rename(path, gone)
        except OSError:
            return  # gone already, or another fleet took it
        if gone.is_symlink() or not gone.is_dir():
            gone.unlink(missing_ok=True)
        else:
            shutil.rmtree(gone, ignore_errors=True)

    @contextlib.contextmanager
    def writing(self, key: str) -> Iterator[Path]:
        """A temporary folder to fill; renamed to the entry when the block succeeds (the first writer wins)."""
        (self.root / "entries").mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", suffix=".tmp", dir=self.root / "entries"))
        try:
            yield tmp
            write_record(tmp, key, ignore=(_USED,))
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
