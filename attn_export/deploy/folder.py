"""A deployment folder (``--bundle``, ``--triton``) holds only what attn-export wrote, as ``--out`` does.

Why: ``--bundle DIR`` used to replace DIR wholesale, deleting the user's files in it (and
``--bundle .`` tried to replace the current directory); the Triton writer deleted a model
folder with whatever else was in it. Now:

* every folder attn-export writes here gets ``.attn-export-deploy.json``, the sha256 of each
  file it wrote; a file it lists with those bytes is ours, and only ours is ever replaced or
  removed. Anything else in the folder (a ``thesis.txt``, a ``sub/`` folder, a link, our own
  file edited since) is *foreign*: the run is refused before any work, naming the first one
  (``refuse_foreign``), unless ``--force`` moves every foreign entry, byte for byte (a rename),
  into a new sibling folder ``<DIR>.attn-export-aside-<UTC stamp>`` that the run names;
* a folder is never deleted, only emptied of our own files and then removed if we leave it
  empty; new files are staged in ``DIR/.attn-export-staging-*`` and renamed into place, the
  manifest (listing old and new bytes while they are swapped) written before and after;
* a run holds an exclusive ``flock`` on ``DIR/.attn-export.lock`` (``run_dir_fs.take_lock``)
  for its whole run, so two runs with the same ``--bundle`` cannot interleave: the second is
  refused at once, naming the PID. A folder inside ``--out`` is covered by ``--out``'s lock.

Names starting with ``.attn-export`` directly in DIR are ours only with the record a run leaves
(``outdir.bookkeeping``): the manifest when it parses as ours, the lock when it holds a run's
record, a staging folder when it holds its marker. Without it such an entry is the user's and
foreign like any other (a user's ``.attn-export-staging-mine/`` is refused, never deleted).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from attn_export.errors import ConfigError
from attn_export.outdir.bookkeeping import (STAGING_FORMAT, STAGING_MARKER, is_our_lock, marker_bytes, new_run_id,
                                            parse_marker, parse_record)
from attn_export.outdir.manifest import sha256_fd
from attn_export.outdir.fs import SIBLING_INFIX, OutDir, make_sibling, move_into, take_lock

__all__ = ["DeployClaim", "MANIFEST_NAME", "check_deploy_paths", "claim_deploy_folders", "foreign_entries", "publish", "refuse_foreign", "staging"]

MANIFEST_NAME = ".attn-export-deploy.json"
MANIFEST_FORMAT = "attn-export-deploy/1"
LOCK_NAME = ".attn-export.lock"
STAGING_PREFIX = ".attn-export-staging-"
_MAX_MANIFEST_BYTES = 16 << 20


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="allow")
    format: str
    files: dict[str, str]
    pending: dict[str, str] = {}


def _reserved(name: str) -> bool:
    return name.startswith(".attn-export")


def _read_regular(path: Path, limit: int) -> bytes | None:
    """At most ``limit`` bytes of the regular file at ``path`` (no link followed, no FIFO blocks), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, limit) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


def _ours_reserved(folder: Path, entry: os.DirEntry[str]) -> bool:
    """A ``.attn-export*`` entry of ``folder`` that carries the record a run of ours leaves (see the module doc)."""
    path = folder / entry.name
    if entry.name == LOCK_NAME:
        return is_our_lock(entry.stat(follow_symlinks=False), _read_regular(path, 1 << 16))
    if entry.name == MANIFEST_NAME:
        return _read_manifest(folder) is not None
    if entry.name.startswith(STAGING_PREFIX) and entry.is_dir(follow_symlinks=False):
        return parse_marker(_read_regular(path / STAGING_MARKER, 1 << 16), STAGING_FORMAT) is not None
    return False


def _sha256(path: Path) -> str | None:
    """The sha256 of a regular file reached without following a link at its name, else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return sha256_fd(fd) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


def _read_manifest(folder: Path) -> _Manifest | None:
    raw = _read_regular(folder / MANIFEST_NAME, _MAX_MANIFEST_BYTES + 1)
    return parse_record(raw, _Manifest, MANIFEST_FORMAT, _MAX_MANIFEST_BYTES)


def _owned(folder: Path) -> dict[str, set[str]]:
    """rel -> the sha256 values the manifest vouches for (empty when there is no readable manifest of ours)."""
    m = _read_manifest(folder)
    if m is None:
        return {}
    owned: dict[str, set[str]] = {}
    for files in (m.files, m.pending):
        for rel, digest in files.items():
            owned.setdefault(rel, set()).add(digest)
    return owned


def foreign_entries(folder: Path) -> list[str]:
    """Entries of ``folder`` attn-export did not write, relative, sorted (a folder holding nothing of ours counts as one)."""
    if os.path.islink(folder) or not folder.is_dir():
        return []
    owned = _owned(folder)

    def walk(rel: str) -> tuple[list[str], bool]:
        foreign: list[str] = []
        ours = False
        with os.scandir(folder / rel if rel else folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            sub = f"{rel}/{e.name}" if rel else e.name
            if not rel and _reserved(e.name) and _ours_reserved(folder, e):
                continue
            if e.is_dir(follow_symlinks=False):
                try:
                    inner, has = walk(sub)
                except OSError:  # a folder we cannot list holds nothing we wrote
                    inner, has = [sub], False
                foreign.extend(inner if has else [sub])
                ours |= has
            elif e.is_file(follow_symlinks=False) and sub in owned and _sha256(folder / sub) in owned[sub]:
                ours = True
            else:
                foreign.append(sub)
        return foreign, ours

    try:
        return walk("")[0]
    except OSError as err:
        raise ConfigError(f"{folder}: cannot list the folder ({err.strerror or err}); pass a folder attn-export can read and write") from None


def refuse_foreign(folder: Path, flag: str) -> None:
    """One line naming the first foreign entry of ``folder`` and the fixes; nothing when there is none."""
    foreign = foreign_entries(folder)
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""  # one name and a count, however many
        raise ConfigError(
            f"{flag} {folder} holds {foreign[0]!r}{more}, which attn-export did not write (a {flag} folder holds only its files); "
            f"pass another {flag} (new or empty), or add --force to move them into {folder.name}{SIBLING_INFIX}<UTC time> first"
        )


def move_aside(folder: Path, flag: str) -> Path | None:
    """Rename every foreign entry of ``folder`` into a new sibling folder (same relative paths); returns it, or None.

    The same mechanism as ``--out``'s ``--force`` (``run_dir_fs.make_sibling`` / ``move_into``):
    a new folder made with ``mkdir``, entries reached without following links, renamed, never copied."""
    foreign = foreign_entries(folder)
    if not foreign:
        return None
    od = OutDir(folder, flag)
    try:
        aside = make_sibling(od, _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
        move_into(od, foreign, aside)
    finally:
        od.close()
    return aside


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_deploy_paths(out: Path, folders: list[tuple[str, Path]], force: bool) -> None:
    """Before any work: a deployment folder is neither ``--out`` nor above it, nor the current directory or above
    it, nor inside ``--out``'s bookkeeping, nor the other deployment folder; and it holds nothing foreign
    (``refuse_foreign``) unless ``force``."""
    out_real = os.path.realpath(out)
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:  # the current directory was removed: nothing can be above it
        cwd = "\0"
    for flag, path in folders:
        real = os.path.realpath(path)
        own = f"pass a folder of its own (e.g. {flag} {Path(out) / flag[2:]})"
        if real == out_real:
            raise ConfigError(f"{flag} {path} is the --out folder; {own}")
        if _within(out_real, real):
            raise ConfigError(f"{flag} {path} is a folder above --out {out}, which would mix the run's files with the deployment; {own}")
        if _within(cwd, real):
            raise ConfigError(f"{flag} {path} is the current directory or a folder above it; a {flag} folder holds only attn-export's files: {own}")
        rel = Path(os.path.relpath(real, out_real)).parts
        if rel and rel[0] != ".." and _reserved(rel[0]):
            raise ConfigError(f"{flag} {path} is inside --out's bookkeeping folder {rel[0]}, which the run moves and deletes; {own}")
    if len(folders) == 2:
        (fa, a), (fb, b) = folders
        ra, rb = os.path.realpath(a), os.path.realpath(b)
        if ra == rb:
            raise ConfigError(f"{fa} {a} and {fb} {b} are the same folder; pass a folder of its own to each (e.g. {fb} {Path(out) / fb[2:]})")
        for (f1, p1, r1), (f2, p2, r2) in (((fa, a, ra), (fb, b, rb)), ((fb, b, rb), (fa, a, ra))):
            if _within(r1, r2):
                raise ConfigError(f"{f1} {p1} is inside {f2} {p2}; pass folders that do not contain each other (e.g. {f1} {Path(out) / f1[2:]})")
    if not force:
        for flag, path in folders:
            refuse_foreign(Path(path), flag)


@contextlib.contextmanager
def staging(final: Path) -> Iterator[Path]:
    """A new folder ``final/.attn-export-staging-*/files`` to write into (``final`` is created); removed on the way out,
    with ``final`` too if this created it and nothing else is in it. The staging folder holds its marker
    (``STAGING_MARKER``) beside ``files/`` from the start, so a leftover of a killed run is known as ours."""
    if os.path.islink(final):
        raise ConfigError(f"{final} is a symbolic link; attn-export never writes through a link: pass the folder it points to")
    created = not final.exists()
    final.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=final))
    try:
        (tmp / STAGING_MARKER).write_bytes(marker_bytes(STAGING_FORMAT, new_run_id()))
        (tmp / "files").mkdir()
        yield tmp / "files"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # our own temporary folder
        if created:
            with contextlib.suppress(OSError):
                final.rmdir()


def _files_of(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _write_manifest(final: Path, files: dict[str, str], pending: dict[str, str], kind: str) -> None:
    from attn_export.outdir.atomic import atomic_write_bytes

    data: dict[str, Any] = {"format": MANIFEST_FORMAT, "kind": kind, "files": files}
    if pending:
        data["pending"] = pending
    atomic_write_bytes(final / MANIFEST_NAME, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def publish(staged: Path, final: Path, flag: str, kind: str) -> Path:
    """Move the files of ``staged`` into ``final``, replacing only attn-export's own earlier files there.

    A foreign entry in ``final`` is refused (``refuse_foreign``); our files the new set does not
    have are removed, and folders they leave empty. The manifest lists old and new bytes while
    the files are swapped, so an interrupted swap leaves nothing that looks foreign."""
    refuse_foreign(final, flag)
    old = {rel: digests for rel, digests in _owned(final).items()}
    new = {rel: _sha256(staged / rel) or "" for rel in _files_of(staged)}
    _write_manifest(final, new, {rel: d for rel, ds in old.items() for d in sorted(ds)[:1]}, kind)
    for rel in new:
        target = final / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged / rel, target)
    for rel in sorted(set(old) - set(new), key=lambda r: -r.count("/")):
        path = final / rel
        if path.is_file() and not path.is_symlink() and _sha256(path) in old[rel]:
            path.unlink()
            for parent in path.parents:  # folders our files left empty, up to (not including) final
                if parent == final or not parent.is_relative_to(final):
                    break
                with contextlib.suppress(OSError):
                    parent.rmdir()
    _write_manifest(final, new, {}, kind)
    return final


class DeployClaim:
    """A run's hold on one deployment folder: the lock (outside ``--out``), then ``make_room`` (``--force``'s aside folder)."""

    def __init__(self, folder: Path, flag: str, out: Path) -> None:
        self.folder, self.flag = Path(folder), flag
        self.inside_out = os.path.realpath(self.folder).startswith(os.path.realpath(out) + os.sep)
        self.created = False
        self.aside: Path | None = None
        self._od: Any = None
        self._fd: int | None = None

    def acquire(self, force: bool) -> DeployClaim:

        if not self.inside_out:
            if os.path.islink(self.folder):
                raise ConfigError(f"{self.flag} {self.folder} is a symbolic link; attn-export never writes through a link: pass the folder it points to")
            self.created = not self.folder.exists()
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise ConfigError(f"{self.flag} {self.folder}: cannot create the folder ({err.strerror or err}); pass a writable {self.flag} DIR") from None
            self._od = OutDir(self.folder, self.flag)
            self._fd = take_lock(self._od, LOCK_NAME, {"pid": os.getpid(), "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})
            with os.scandir(self.folder) as entries:  # a killed run's staging folder, by its marker (we hold the lock)
                leftovers = [e.name for e in entries
                             if e.name.startswith(STAGING_PREFIX) and _ours_reserved(self.folder, e)]
            for name in leftovers:
                shutil.rmtree(self.folder / name, ignore_errors=True)
        if not force:
            refuse_foreign(self.folder, self.flag)
        elif self.inside_out:  # before --out is claimed, so the aside folder is not taken for the run's own output
            self.aside = move_aside(self.folder, self.flag)
        return self

    def make_room(self, force: bool) -> Path | None:
        """With ``force``, move the foreign entries aside (once --out is held too); returns where they went, or None."""
        if force and self.aside is None:
            self.aside = move_aside(self.folder, self.flag)
        return self.aside

    def release(self) -> None:
        published = (self.folder / MANIFEST_NAME).is_file()
        if self._fd is not None:
            if not published:  # nothing of ours was written: leave the folder as it was found
                with contextlib.suppress(OSError):
                    os.unlink(LOCK_NAME, dir_fd=self._od.fd)
            os.close(self._fd)
            self._fd = None
        if self._od is not None:
            self._od.close()
            self._od = None
        if self.created and not published:
            with contextlib.suppress(OSError):
                self.folder.rmdir()


@contextlib.contextmanager
def claim_deploy_folders(cfg: Any) -> Iterator[list[DeployClaim]]:
    """Hold ``cfg``'s ``--bundle`` and ``--triton`` folders for the block (see the module doc)."""
    claims: list[DeployClaim] = []
    try:
        for flag, folder in (("--bundle", cfg.bundle), ("--triton", cfg.triton)):
            if folder is not None:
                claim = DeployClaim(Path(folder), flag, cfg.out)
                claims.append(claim)
                claim.acquire(bool(getattr(cfg, "force", False)))
        yield claims
    finally:
        for claim in reversed(claims):
            claim.release()
