"""File operations inside a run's output folder that never follow a symbolic link.

``--out`` may be shared (a CI cache, a volume several users write to), so anything in it may
have been planted: a link named ``.attn-export.lock`` pointing at a file outside, a linked
``.attn-export-previous`` folder, a forged ``run.json``. ``OutDir`` opens ``--out`` once with
``O_DIRECTORY | O_NOFOLLOW`` and reaches every path below it one component at a time the same
way (``openat``-style calls: Python's ``dir_fd=`` arguments, see the ``os`` module's "paths
relative to directory descriptors"), so a link anywhere on a path is refused, never followed;
files are opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked to be regular with ``fstat``
(a FIFO never blocks us), renamed with ``renameat`` and removed with ``unlinkat`` (neither
follows a link), and folders are deleted with ``shutil.rmtree(dir_fd=...)``, which is
itself link-safe on Linux. Every refusal is one ``ConfigError`` line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from attn_export.errors import ConfigError
from attn_export.outdir.bookkeeping import is_our_lock
from attn_export.outdir.manifest import sha256_fd

__all__ = ["SIBLING_INFIX", "OutDir", "Stat", "lock_holder", "make_sibling", "move_into", "stat_key", "take_lock"]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

Stat = tuple[int, int, int]  # (inode, mtime_ns, size); folders have size -1
SIBLING_INFIX = ".attn-export-aside-"  # OUT.attn-export-aside-<UTC time>: where --force moves the user's files


def stat_key(st: os.stat_result) -> Stat:
    if stat.S_ISDIR(st.st_mode):
        return (st.st_ino, 0, -1)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class OutDir:
    """``--out`` held open; every method takes a relative POSIX path and follows no link."""

    def __init__(self, path: Path, flag: str) -> None:
        self.path, self.flag = Path(path), flag
        try:
            self.fd = os.open(self.path, _DIR)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise self.link_error(None) from None
            if err.errno == errno.ENOTDIR:
                raise ConfigError(f"{flag} {path} is a file; pass a directory (it is created if missing)") from None
            raise ConfigError(f"{flag} {path}: cannot open the folder ({err.strerror or err}); pass a writable {flag} DIR") from None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- messages ------------------------------------------------------------------------------
    def link_error(self, rel: str | None) -> ConfigError:
        where = f"{self.flag} {self.path}" if rel is None else f"{self.flag} {self.path}: {rel}"
        return ConfigError(f"{where} is a symbolic link; attn-export never follows links in {self.flag}: remove it or pass another {self.flag}")

    def kind_error(self, rel: str, st: os.stat_result) -> ConfigError:
        from attn_export.host.paths import file_kind

        return ConfigError(f"{self.flag} {self.path}: {rel} is {file_kind(st.st_mode)}, not a file attn-export writes; remove it or pass another {self.flag}")

    # -- walking -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def parent(self, rel: str, create: bool = False) -> Iterator[tuple[int, str]]:
        """(an fd of the folder holding ``rel``, its last component); folders on the way are
        opened without following links, and created where ``create``."""
        parts = PurePosixPath(rel).parts
        if not parts or any(p in ("..", "/") for p in parts):
            raise ValueError(f"not a relative path inside the folder: {rel!r}")
        fd = os.dup(self.fd)
        try:
            for i, part in enumerate(parts[:-1]):
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=fd)
                try:
                    sub = os.open(part, _DIR, dir_fd=fd)
                except OSError as err:
                    if err.errno in (errno.ELOOP, errno.ENOTDIR):
                        st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                        prefix = "/".join(parts[: i + 1])
                        raise (self.link_error(prefix) if stat.S_ISLNK(st.st_mode) else self.kind_error(prefix, st)) from None
                    raise
                os.close(fd)
                fd = sub
            yield fd, parts[-1]
        finally:
            os.close(fd)

    def lstat(self, rel: str) -> os.stat_result | None:
        """The entry itself (a link is reported as a link), or None when it or a folder above it is missing."""
        try:
            with self.parent(rel) as (fd, name):
                return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def entries(self, rel: str = "") -> dict[str, os.stat_result]:
        """The entries of a folder (name -> lstat); ``""`` is --out itself."""
        fd = self._open_dir(rel)
        try:
            out = {}
            for name in os.listdir(fd):
                with contextlib.suppress(FileNotFoundError):
                    out[name] = os.stat(name, dir_fd=fd, follow_symlinks=False)
            return out
        finally:
            os.close(fd)

    def _open_dir(self, rel: str) -> int:
        if not rel:
            return os.dup(self.fd)
        with self.parent(rel) as (fd, name):
            try:
                return os.open(name, _DIR, dir_fd=fd)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise self.link_error(rel) from None
                raise

    def files(self, rel: str) -> dict[str, Stat]:
        """Every regular file under the folder ``rel`` (relative path -> stat); links are skipped, not followed."""
        out: dict[str, Stat] = {}
        for name, st in self._safe_entries(rel).items():
            sub = f"{rel}/{name}"
            if stat.S_ISREG(st.st_mode):
                out[sub] = stat_key(st)
            elif stat.S_ISDIR(st.st_mode):
                out.update(self.files(sub))
        return out

    def dirs(self, rel: str) -> set[str]:
        """The folder ``rel`` and every folder under it (not through links)."""
        out = {rel}
        for name, st in self._safe_entries(rel).items():
            if stat.S_ISDIR(st.st_mode):
                out |= self.dirs(f"{rel}/{name}")
        return out

    def _safe_entries(self, rel: str) -> dict[str, os.stat_result]:
        try:
            return self.entries(rel)
        except (OSError, ConfigError):  # vanished, or replaced by a link since it was listed
            return {}

    # -- reading -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def open_regular(self, rel: str) -> Iterator[int | None]:
        """A read-only fd of the regular file ``rel`` (None when missing); a link or a FIFO/device is refused."""
        try:
            with self.parent(rel) as (pfd, name):
                fd = os.open(name, os.O_RDONLY | _FILE, dir_fd=pfd)
        except FileNotFoundError:
            yield None
            return
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise self.link_error(rel) from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self.kind_error(rel, st)
            yield fd
        finally:
            os.close(fd)

    def sha256(self, rel: str) -> str | None:
        """The sha256 of the regular file ``rel`` (None when missing)."""
        with self.open_regular(rel) as fd:
            return None if fd is None else sha256_fd(fd)

    def read(self, rel: str, limit: int) -> bytes | None:
        """At most ``limit`` bytes of the regular file ``rel`` (None when missing)."""
        with self.open_regular(rel) as fd:
            if fd is None:
                return None
            chunks, left = [], limit
            while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)

    # -- changing ------------------------------------------------------------------------------
    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` (folders above ``dst`` are created); the entry moved is never followed."""
        with self.parent(src) as (sfd, sname), self.parent(dst, create=True) as (dfd, dname):
            os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)

    def unlink(self, rel: str) -> None:
        with self.parent(rel) as (fd, name):
            os.unlink(name, dir_fd=fd)

    def rmdir(self, rel: str) -> None:
        with self.parent(rel) as (fd, name):
            os.rmdir(name, dir_fd=fd)

    def rmtree(self, rel: str) -> None:
        """Delete the real folder ``rel`` and what it holds; links inside are removed, never followed."""
        with contextlib.suppress(FileNotFoundError), self.parent(rel) as (fd, name):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=fd)

    def mkdir_new(self, rel: str) -> None:
        """Create the folder ``rel``, refusing one that exists (a planted folder or link is never reused)."""
        try:
            with self.parent(rel) as (fd, name):
                os.mkdir(name, 0o755, dir_fd=fd)
        except FileExistsError:
            st = self.lstat(rel)
            raise (self.link_error(rel) if st is not None and stat.S_ISLNK(st.st_mode) else
                   ConfigError(f"{self.flag} {self.path}: {rel} appeared while the run held the folder; remove it or pass another {self.flag}")) from None  # fmt: skip

    def write_new(self, rel: str, data: bytes) -> None:
        """Create the file ``rel`` (it must not exist) with ``data``."""
        with self.parent(rel) as (pfd, name):
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=pfd)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)

    def write_atomic(self, rel: str, data: bytes) -> None:
        """Replace ``rel`` by ``data`` (write, fsync, rename): the old file or the whole new one, never half."""
        from attn_export.outdir.atomic import atomic_write_at

        with self.parent(rel) as (fd, name):
            atomic_write_at(fd, name, data)


def take_lock(od: OutDir, name: str, holder: dict[str, object]) -> int:
    """An exclusive ``flock`` on ``OUT/name`` (created if missing), with ``holder`` written into it; returns its fd.

    The file is opened ``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file with one link, so
    a link, a FIFO or a hard link to someone else's file is refused before it is truncated."""
    import fcntl
    import json

    for _ in range(10):  # the holder may unlink the file between our open and our flock: retry
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | _FILE, 0o644, dir_fd=od.fd)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise od.link_error(name) from None
            raise ConfigError(f"{od.flag} {od.path}: cannot create {name} ({err.strerror or err}); pass a writable {od.flag} DIR") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            if not stat.S_ISREG(st.st_mode):
                raise od.kind_error(name, st)
            raise ConfigError(f"{od.flag} {od.path}: {name} has {st.st_nlink} hard links (another file's contents); remove it or pass another {od.flag}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(f"{od.flag} {od.path}: cannot lock {name} ({err.strerror or err}); pass a folder on a local disk") from None
            raise ConfigError(
                f"{od.flag} {od.path} is in use by another attn-export run ({lock_holder(od, name)}); wait for it to finish or pass another {od.flag}"
            ) from None
        now = od.lstat(name)
        if now is not None and now.st_ino == st.st_ino:
            if not is_our_lock(st, os.pread(fd, 1 << 16, 0)):  # a file of the user's at the lock's name is never truncated
                os.close(fd)
                raise ConfigError(f"{od.flag} {od.path} holds {name}, which is not a lock attn-export wrote; "
                                  f"move it away or pass another {od.flag}")
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(holder).encode() + b"\n")
            return fd
        os.close(fd)
    raise ConfigError(f"{od.flag} {od.path}: could not take {name} (it keeps being replaced); pass another {od.flag}")


def lock_holder(od: OutDir, name: str) -> str:
    """"PID n, started t" of the run holding the lock, from what it wrote into the file."""
    import json
    import time

    for _ in range(20):  # the holder writes its PID right after locking
        try:
            info = json.loads((od.read(name, 1 << 16) or b"null").decode("utf-8") or "null")
        except (OSError, ValueError, ConfigError):
            info = None
        if isinstance(info, dict) and isinstance(info.get("pid"), int):
            started = f", started {info['started']}" if isinstance(info.get("started"), str) else ""
            return f"PID {info['pid']}{started}"
        time.sleep(0.05)
    return "PID unknown"


def _sibling_name(base: str, stamp: str, attempt: int) -> str:
    """``base.attn-export-aside-stamp[-n]``, ``base`` shortened (by bytes) so the name stays within NAME_MAX."""
    tail = SIBLING_INFIX + stamp + (f"-{attempt}" if attempt else "")
    room = 255 - len(tail.encode())
    raw = base.encode()[:room]
    return raw.decode(errors="ignore") + tail


def make_sibling(od: OutDir, stamp: str) -> Path:
    """A NEW folder beside --out, ``OUT.attn-export-aside-<stamp>``, for the files ``--force`` moves out of it.

    Made with ``mkdir``: an existing name is never reused (the next free ``-1``, ``-2``... is
    taken). Nothing is copied later, only renamed, so it must be on the filesystem of --out: a
    --out that is a mount point is refused here, before anything moves.
    """
    out = Path(os.path.realpath(od.path))  # --out itself is no link (OutDir); its parents may be
    fix = f"move them yourself or pass another {od.flag}"
    try:
        pfd = os.open(out.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise ConfigError(f"{od.flag} {od.path}: cannot open its parent folder to move the files attn-export did not write ({err.strerror or err}); {fix}") from None
    try:
        for attempt in range(100):
            name = _sibling_name(out.name, stamp, attempt)
            try:
                os.mkdir(name, 0o777, dir_fd=pfd)
                break
            except FileExistsError:
                continue
            except OSError as err:
                raise ConfigError(f"{od.flag} {od.path}: cannot create {out.parent / name} for the files attn-export did not write ({err.strerror or err}); {fix}") from None
        else:
            raise ConfigError(f"{od.flag} {od.path}: every {out}{SIBLING_INFIX}{stamp} name is taken; remove some or pass another {od.flag}")
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
    finally:
        os.close(pfd)
    sibling = out.parent / name
    if st.st_dev != os.fstat(od.fd).st_dev:
        os.rmdir(sibling)
        raise ConfigError(f"{od.flag} {od.path} is on another filesystem than its parent folder, so its files cannot be moved beside it; {fix}")
    return sibling


def move_into(od: OutDir, files: list[str], folder: Path) -> None:
    """Rename ``files`` (relative to --out; subfolders kept) into ``folder``, reached without following links."""
    try:
        afd = os.open(folder, _DIR)
    except OSError as err:
        raise ConfigError(f"{od.flag} {od.path}: cannot open {folder} ({err.strerror or err}); move the files yourself or pass another {od.flag}") from None
    try:
        for rel in files:
            parts = PurePosixPath(rel).parts
            dfd = os.dup(afd)
            try:
                for part in parts[:-1]:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=dfd)
                    sub = os.open(part, _DIR, dir_fd=dfd)
                    os.close(dfd)
                    dfd = sub
                with od.parent(rel) as (sfd, sname):
                    with contextlib.suppress(FileNotFoundError):  # never replace what is already there
                        os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
                        raise FileExistsError(errno.EEXIST, "a file of that name is already there")
                    os.rename(sname, parts[-1], src_dir_fd=sfd, dst_dir_fd=dfd)
            except OSError as err:
                raise ConfigError(f"{od.flag} {od.path}: could not move {rel} into {folder} ({err.strerror or err}); the files moved so far "
                                  f"are there: move the rest yourself or pass another {od.flag}") from None  # fmt: skip
            finally:
                os.close(dfd)
    finally:
        os.close(afd)
