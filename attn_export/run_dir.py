"""A run owns its output folder: one writer at a time, no earlier run's files beside its own,
and a manifest that says what it wrote.

Why: two runs into one ``--out`` produced a report from one seed next to a model from the
other (the report said PASS for a model it never judged), and an int8 run followed by a plain
run left the old ``model.int8.onnx`` beside a report that did not mention it. So a run:

1. takes an exclusive ``fcntl.flock`` on ``OUT/.attn-export.lock`` before writing anything; a
   second run refuses at once, naming the PID that holds it. (flock, not a PID file: the
   kernel drops the lock when its holder dies, so a crashed run never blocks the next one.)
2. moves the files of the earlier run aside (into ``OUT/.attn-export-previous/``). Only files
   an earlier run wrote are touched: those its ``run.json`` lists, or, for a folder written
   before run manifests existed or by a run that was killed, the artifact names a run writes
   (``model*.onnx``, ``report.*``, ``*.png``, ``model*.engine*``), and only when that folder
   holds a ``report.json`` or a ``run.json``. A user's other files are left alone.
3. on success writes ``run.json`` atomically (command line, seed, versions, configuration and
   the sha256 of every file it wrote) and deletes the earlier run's files; on failure or
   interrupt removes what it wrote and puts the earlier run's files back, so ``--out`` holds
   one complete run or the previous one, never a mix.

``RunDir.stamp(report)`` records in the report the sha256 of each artifact it judged
(``stage.details["sha256"]``, ``selection[key]["sha256"]``); ``attn-export check`` compares them
with the files next to the report (``attn_export.validate.gate.verify_artifact_hashes``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fnmatch
import hashlib
import json
import logging
import os
import shutil
import stat
import sys
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path, PurePosixPath
from typing import Any

from attn_export.errors import ConfigError

__all__ = [
    "COMMAND_LINE",
    "LOCK_NAME",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "PREVIOUS_NAME",
    "RunDir",
    "claim",
    "claim_output",
    "sha256_file",
]

log = logging.getLogger(__name__)

MANIFEST_NAME = "run.json"
MANIFEST_FORMAT = "attn-export-run/1"
LOCK_NAME = ".attn-export.lock"
PREVIOUS_NAME = ".attn-export-previous"
# What a run writes into --out; used only where no manifest lists the files (see the module doc).
ARTIFACT_PATTERNS = ("model*.onnx", "model*.onnx.data", "model*.engine", "model*.engine.*", "report.json", "report.md", "report.html",
                     "*.png", "bench.json", "bench.md", "sweep.json", "pareto.md", MANIFEST_NAME)  # fmt: skip
# The command line of the CLI invocation in progress (set by ``attn_export.cli.app.main``).
COMMAND_LINE: ContextVar[tuple[str, ...] | None] = ContextVar("attn_export_command_line", default=None)

_Stat = tuple[int, int, int]  # (inode, mtime_ns, size)


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    from attn_export import __version__

    out: dict[str, str | None] = {"attn_export": __version__, "python": sys.version.split()[0]}
    for dist in ("torch", "onnx", "onnxruntime", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


class RunDir:
    """The claim of one run on its output folder; use through ``claim()`` / ``claim_output()``."""

    def __init__(self, out: Path, flag: str = "--out", config: Mapping[str, Any] | None = None, seed: int | None = None,
                 deployed: Mapping[str, Path | None] | None = None) -> None:  # fmt: skip
        self.out = Path(out)
        self.flag = flag
        self.config = dict(config or {})
        self.seed = seed
        self.deployed = {k: Path(v) for k, v in (deployed or {}).items() if v is not None}
        self.started = _now()
        self._fd: int | None = None
        self._created: list[Path] = []  # folders this run created, outermost first
        self._moved: list[str] = []  # relative paths moved into PREVIOUS_NAME
        self._before: dict[str, _Stat] = {}
        self._before_dirs: set[str] = set()
        self._touched: set[str] = set()
        self._inside_before: dict[str, _Stat] = {}
        self._snapshot: bool | None = None  # set once the folder's files before the run are known
        self._manifest_written = False
        self._hashes: dict[tuple[str, _Stat], str] = {}

    # -- the lock --------------------------------------------------------------------------
    @property
    def lock_path(self) -> Path:
        return self.out / LOCK_NAME

    def _mkdir(self) -> None:
        missing: list[Path] = []
        p = self.out.absolute()
        while not p.exists() and p != p.parent:
            missing.append(p)
            p = p.parent
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"{self.flag} {self.out}: cannot create the folder ({err.strerror or err}); pass a writable {self.flag} DIR") from None
        if not self.out.is_dir():
            raise ConfigError(f"{self.flag} {self.out} is a file; pass a directory (it is created if missing)")
        self._created = list(reversed(missing))

    def _lock(self) -> None:
        import fcntl

        for _ in range(10):  # the holder may unlink the file between our open and our flock: retry
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as err:
                raise ConfigError(f"{self.flag} {self.out}: cannot create {LOCK_NAME} ({err.strerror or err}); pass a writable {self.flag} DIR") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise ConfigError(f"{self.flag} {self.out}: cannot lock {LOCK_NAME} ({err.strerror or err}); pass a folder on a local disk") from None
                raise ConfigError(
                    f"{self.flag} {self.out} is in use by another attn-export run ({self._holder()}); "
                    f"wait for it to finish or pass another {self.flag}"
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                command = COMMAND_LINE.get()
                os.ftruncate(fd, 0)
                os.write(fd, json.dumps({"pid": os.getpid(), "started": self.started, "command": list(command) if command else None}).encode() + b"\n")
                return
            os.close(fd)
        raise ConfigError(f"{self.flag} {self.out}: could not take {LOCK_NAME} (it keeps being replaced); pass another {self.flag}")

    def _holder(self) -> str:
        import time

        for _ in range(20):  # the holder writes its PID right after locking
            try:
                info = json.loads(self.lock_path.read_text(encoding="utf-8") or "null")
            except (OSError, ValueError, UnicodeDecodeError):
                info = None
            if isinstance(info, dict) and isinstance(info.get("pid"), int):
                started = f", started {info['started']}" if isinstance(info.get("started"), str) else ""
                return f"PID {info['pid']}{started}"
            time.sleep(0.05)
        return "PID unknown"

    def _unlock(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self.lock_path.unlink()  # while still holding it: a waiter that opened it retries (inode check)
        os.close(self._fd)
        self._fd = None

    # -- files -----------------------------------------------------------------------------
    def _top(self) -> dict[str, _Stat]:
        """The entries directly in --out (name -> stat; folders with size -1), but the lock and the aside folder.

        Only the top level is listed: --out may be a large existing folder, and a run writes its
        files there; folders are walked only where the run wrote (``_walk``)."""
        entries: dict[str, _Stat] = {}
        try:
            names = os.listdir(self.out)
        except OSError:
            return entries
        for name in names:
            if name in (LOCK_NAME, PREVIOUS_NAME):
                continue
            try:
                st = os.lstat(self.out / name)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                entries[name] = (st.st_ino, st.st_mtime_ns, st.st_size)
            elif stat.S_ISDIR(st.st_mode):
                entries[name] = (st.st_ino, 0, -1)
        return entries

    def _walk(self, folder: str) -> dict[str, _Stat]:
        """Every regular file under ``OUT/folder`` (relative POSIX path -> stat)."""
        files: dict[str, _Stat] = {}
        for root, _dirs, names in os.walk(self.out / folder):
            for name in names:
                path = Path(root) / name
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    files[path.relative_to(self.out).as_posix()] = (st.st_ino, st.st_mtime_ns, st.st_size)
        return files

    def _earlier(self) -> list[str]:
        """Files of an earlier run in --out (relative paths), by its manifest or by the artifact names."""
        manifest, report = self.out / MANIFEST_NAME, self.out / "report.json"
        if manifest.is_file():
            data = _read_manifest(manifest, self.flag)
            if data.get("status") == "complete":
                names = [n for n in data.get("artifacts") or {} if _inside(n)]
                return sorted({*names, MANIFEST_NAME})
        elif not report.is_file():
            return []  # not a folder an attn-export run wrote: leave it alone
        present = self._top()
        return sorted(n for n, st in present.items() if st[2] >= 0 and any(fnmatch.fnmatch(n, p) for p in ARTIFACT_PATTERNS))

    def _move_aside(self) -> None:
        earlier = self._earlier()  # may refuse the folder: before anything is moved
        aside = self.out / PREVIOUS_NAME
        if aside.exists():  # left by a run that was killed: superseded by what is in --out now
            shutil.rmtree(aside, ignore_errors=True)
        root = self.out.resolve()
        for rel in earlier:
            src = self.out / rel
            if not src.is_file() or src.is_symlink() or not src.parent.resolve().is_relative_to(root):
                continue  # only regular files really inside --out (no symlinked folder leads outside)
            dst = aside / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
            self._moved.append(rel)
        if self._moved:
            log.info("moved %d files of an earlier run aside: %s", len(self._moved), ", ".join(self._moved))

    def _restore(self) -> None:
        aside = self.out / PREVIOUS_NAME
        for rel in self._moved:
            with contextlib.suppress(OSError):
                (self.out / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(aside / rel, self.out / rel)
        shutil.rmtree(aside, ignore_errors=True)

    def _ours(self) -> dict[str, _Stat]:
        """Files written (created or replaced) since the claim."""
        ours: dict[str, _Stat] = {}
        for name, st in self._top().items():
            if st[2] >= 0:
                if self._before.get(name) != st:
                    ours[name] = st
            elif self._before.get(name) != st or name in self._touched:  # a folder the run made, or wrote into
                ours.update({rel: fst for rel, fst in self._walk(name).items() if self._inside_before.get(rel) != fst})
        return ours

    def _hash(self, path: Path) -> str | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (str(path.absolute()), (st.st_ino, st.st_mtime_ns, st.st_size))
        if key not in self._hashes:
            self._hashes[key] = sha256_file(path)
        return self._hashes[key]

    # -- the run's life --------------------------------------------------------------------
    def acquire(self) -> RunDir:
        self._mkdir()
        try:
            self._lock()
        except BaseException:
            for folder in reversed(self._created):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise
        try:
            self._move_aside()
            self._write_manifest({"status": "running"})
            self._manifest_written = True
            before = self._top()
            before.pop(MANIFEST_NAME, None)
            self._touched = {rel.split("/", 1)[0] for rel in self._moved if "/" in rel}  # folders an earlier run wrote into
            self._inside_before = {rel: st for name in self._touched for rel, st in self._walk(name).items()}
            self._before_dirs = {rel for name in self._touched for rel in self._subdirs(name)}
            self._before, self._snapshot = before, True
        except BaseException:
            self.abort()
            raise
        return self

    def finish(self) -> Path:
        """Write the complete manifest, drop the earlier run's files, release the folder."""
        try:
            artifacts = {rel: {"sha256": self._hash(self.out / rel), "size_bytes": st[2]} for rel, st in sorted(self._ours().items())
                         if rel != MANIFEST_NAME}  # fmt: skip
            deployed = {}
            for flag, folder in self.deployed.items():
                if folder.is_dir() and not _is_within(folder, self.out):
                    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
                    deployed[flag] = {"path": str(folder.absolute()),
                                      "files": {p.relative_to(folder).as_posix(): {"sha256": self._hash(p), "size_bytes": p.stat().st_size} for p in files}}  # fmt: skip
            path = self._write_manifest({"status": "complete", "finished": _now(), "artifacts": artifacts, "deployed": deployed})
            shutil.rmtree(self.out / PREVIOUS_NAME, ignore_errors=True)
            for rel in self._moved:  # folders the earlier run's files left empty
                for parent in list(PurePosixPath(rel).parents)[:-1]:
                    with contextlib.suppress(OSError):
                        (self.out / parent).rmdir()
            return path
        finally:
            self._unlock()

    def abort(self) -> None:
        """Remove what this run wrote, put the earlier run's files back, release the folder."""
        if self._fd is None:
            return
        try:
            if self._snapshot is not None:  # only files that appeared or changed since the claim are ours
                for rel in self._ours():
                    with contextlib.suppress(OSError):
                        (self.out / rel).unlink()
                self._remove_new_dirs()
            if self._manifest_written:
                with contextlib.suppress(OSError):
                    (self.out / MANIFEST_NAME).unlink()
            self._restore()
        finally:
            self._unlock()
            for folder in reversed(self._created):  # innermost first; only if still empty
                with contextlib.suppress(OSError):
                    folder.rmdir()

    def _subdirs(self, name: str) -> set[str]:
        return {Path(root).relative_to(self.out).as_posix() for root, _d, _n in os.walk(self.out / name)}

    def _remove_new_dirs(self) -> None:
        """Folders this run created under --out, if it left them empty (innermost first)."""
        for name, st in self._top().items():
            new = self._before.get(name) != st
            if st[2] >= 0 or not (new or name in self._touched):
                continue
            for rel in sorted(self._subdirs(name), key=len, reverse=True):
                if new or rel not in self._before_dirs:
                    with contextlib.suppress(OSError):
                        (self.out / rel).rmdir()

    def _write_manifest(self, fields: Mapping[str, Any]) -> Path:
        from attn_export._atomic import atomic_path

        command = COMMAND_LINE.get()
        data: dict[str, Any] = {
            "format": MANIFEST_FORMAT, "status": fields["status"], "pid": os.getpid(),
            "command": list(command) if command else None, "seed": self.seed, "versions": _versions(),
            "started": self.started, **{k: v for k, v in fields.items() if k != "status"}, "config": self.config,
        }  # fmt: skip
        path = self.out / MANIFEST_NAME
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
        return path

    # -- the report ------------------------------------------------------------------------
    def stamp(self, report: Any) -> int:
        """Record the sha256 of every artifact in --out that ``report`` judged; returns how many."""
        count = 0
        for stage in getattr(report, "stages", []):
            digest = self._artifact_hash(stage.artifact)
            if digest:
                stage.details["sha256"] = digest
                count += 1
        for entry in getattr(report, "selection", {}).values():
            if isinstance(entry, dict) and isinstance(entry.get("artifact"), str):
                digest = self._artifact_hash(entry["artifact"])
                if digest:
                    entry["sha256"] = digest
                    count += 1
        return count

    def _artifact_hash(self, artifact: str | os.PathLike[str] | None) -> str | None:
        if not artifact:
            return None
        path = Path(artifact)
        if not path.is_file() or path.absolute().parent.resolve() != self.out.absolute().resolve():
            return None
        return self._hash(path)


def _inside(rel: object) -> bool:
    """A manifest entry names a file inside --out (relative, no '..')."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        return False
    p = PurePosixPath(rel)
    return not p.is_absolute() and ".." not in p.parts and p.parts[0] not in (LOCK_NAME, PREVIOUS_NAME)


def _is_within(path: Path, folder: Path) -> bool:
    return path.absolute().resolve().is_relative_to(folder.absolute().resolve())


def _read_manifest(path: Path, flag: str) -> dict[str, Any]:
    from attn_export.validate.schema import RunManifestSchema, read_json, validate

    fix = f"it is not an attn-export run manifest: move it away or pass another {flag}"
    data = read_json(path, "an attn-export run.json", fix, error=ConfigError)
    validate(RunManifestSchema, data, str(path), fix, error=ConfigError)
    return data


@contextlib.contextmanager
def claim(out: str | os.PathLike[str], flag: str = "--out", *, config: Mapping[str, Any] | None = None, seed: int | None = None,
          deployed: Mapping[str, Path | None] | None = None) -> Iterator[RunDir]:  # fmt: skip
    """Own ``out`` for the block: lock, earlier run aside, manifest on success, clean-up on failure."""
    owner = RunDir(Path(out), flag, config, seed, deployed).acquire()
    try:
        yield owner
    except BaseException:
        owner.abort()
        raise
    owner.finish()


def claim_output(cfg: Any) -> contextlib.AbstractContextManager[RunDir]:
    """``claim()`` for a ``RunConfig``: its --out, options, seed and deployment folders."""
    return claim(cfg.out, "--out", config=cfg.to_dict(), seed=cfg.seed, deployed={"--bundle": cfg.bundle, "--triton": cfg.triton})
