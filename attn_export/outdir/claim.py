"""A run owns its output folder: one writer at a time, no earlier run's files beside its own,
a manifest that says what it wrote, and the last complete run kept until the new one completes.

Why: two runs into one ``--out`` produced a report from one seed next to a model from the
other (the report said PASS for a model it never judged); an int8 run followed by a plain run
left the old ``model.int8.onnx`` beside a report that did not mention it; a run killed while
rendering, followed by a run that failed, lost the last complete run. So a run:

1. refuses a ``--out`` that is a symbolic link, an empty ``--out ''``, and a link (or a FIFO,
   a device) at any name in ``--out`` it uses: the lock, ``run.json``, the aside folder, the
   names it writes, a ``--bundle``/``--triton`` folder inside ``--out``. Everything below is
   done through ``run_dir_fs.OutDir``, which follows no link (the folder may be shared);
2. takes an exclusive ``fcntl.flock`` on ``OUT/.attn-export.lock`` (opened ``O_NOFOLLOW``, a
   regular file with one link, or refused) before writing anything; a second run refuses at
   once, naming the PID that holds it. (flock, not a PID file: the kernel drops the lock when
   its holder dies, so a crashed run never blocks the next one.)
3. brings back the last complete run if a run was killed (``run_dir_aside.recover``); refuses
   a ``--out`` holding a file with a name a run writes that no complete ``run.json`` lists with
   its bytes (the user's own ``model.onnx``), unless ``--force`` moves such files into a new
   folder beside ``--out`` (``check_owned`` makes the same check before any work); then
   moves the last run's files aside into ``OUT/.attn-export-previous/`` and writes ``run.json``
   "running" (with a snapshot of what ``--out`` held, so a kill can be cleaned up later);
4. on success writes ``run.json`` "complete" atomically, last (command line, seed, versions,
   configuration and the sha256 of every file it wrote): that is the commit, and only then is
   the earlier run dropped; on failure or interrupt removes what it wrote and puts the earlier
   run's files back, so ``--out`` holds one complete run or the previous one, never a mix.

The protocol and its crash states are described in ``attn_export.outdir.recovery``.
``RunDir.stamp(report)`` records in the report the sha256 of each artifact it judged
(``stage.details["sha256"]``, ``selection[key]["sha256"]``); ``attn-export check`` compares them
with the files next to the report (``attn_export.validate.gate.check.verify_artifact_hashes``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from attn_export.errors import ConfigError
from attn_export.outdir.bookkeeping import new_run_id, shown
from attn_export.outdir.manifest import MANIFEST_NAME, manifest_bytes, manifest_record, sha256_file
from attn_export.host.paths import COMMAND_LINE, given_empty
from attn_export.outdir.recovery import (
    ARTIFACT_PATTERNS,
    LOCK_NAME,
    PREVIOUS_NAME,
    REPORT_FILES,
    bookkeeping_error,
    check_owned,
    conflict_error,
    discard_aside,
    earlier_files,
    foreign_bookkeeping,
    foreign_files,
    is_manifest,
    is_reserved,
    move_aside,
    read_manifest,
    recover,
    refuse_links,
    restore,
)
from attn_export.outdir.fs import OutDir, Stat, make_sibling, move_into, stat_key, take_lock

__all__ = [
    "ARTIFACT_PATTERNS",
    "LOCK_NAME",
    "PREVIOUS_NAME",
    "REPORT_FILES",
    "RunDir",
    "check_owned",
    "claim",
    "claim_output",
]

log = logging.getLogger(__name__)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class RunDir:
    """The claim of one run on its output folder; use through ``claim()`` / ``claim_output()``."""

    def __init__(self, out: Path, flag: str = "--out", config: Mapping[str, Any] | None = None, seed: int | None = None,
                 deployed: Mapping[str, Path | None] | None = None, force: bool = False, names: Iterable[str] | None = None) -> None:  # fmt: skip
        self.out = Path(out)
        # only these names are this command's (``report``): the rest of the run in --out stays, and stays listed
        self.names = None if names is None else frozenset(names)
        self._base: dict[str, Any] | None = None  # that run's manifest
        self._kept: set[str] = set()
        self.force = force  # move files attn-export did not write into a new sibling folder instead of refusing
        self.aside: Path | None = None  # that folder, once made
        self._aside_files: list[str] = []
        self.flag = flag
        self.config = dict(config or {})
        self.seed = seed
        self.deployed = {k: Path(v) for k, v in (deployed or {}).items() if v is not None}
        self.started = _now()
        self.run = new_run_id()  # in the lock, the aside folder's marker and run.json: what this run made is its own
        self._dir: OutDir | None = None
        self._fd: int | None = None
        self._created: list[Path] = []  # folders this run created, outermost first
        self._moved: list[str] = []  # relative paths moved into PREVIOUS_NAME
        self._before: dict[str, Stat] = {}
        self._before_dirs: set[str] = set()
        self._touched: set[str] = set()
        self._inside_before: dict[str, Stat] = {}
        self._snapshot: bool | None = None  # set once the folder's files before the run are known
        self._manifest_written = False
        self._committed = False
        self._hashes: dict[tuple[str, Stat], str] = {}

    @property
    def dir(self) -> OutDir:
        if self._dir is None:
            raise RuntimeError("the output folder is not claimed")  # a programming error, not user input
        return self._dir

    # -- the folder and its lock -----------------------------------------------------------
    @property
    def lock_path(self) -> Path:
        return self.out / LOCK_NAME

    def _mkdir(self) -> None:

        if given_empty(self.flag):
            raise ConfigError(f"{self.flag} '': expected a folder, got an empty string; pass a path (e.g. {self.flag} out)")
        if os.path.islink(self.out):
            raise ConfigError(f"{self.flag} {self.out} is a symbolic link; attn-export never writes through a link: pass the folder it points to")
        missing: list[Path] = []
        p = self.out.absolute()
        while not os.path.lexists(p) and p != p.parent:
            missing.append(p)
            p = p.parent
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"{self.flag} {self.out}: cannot create the folder ({err.strerror or err}); pass a writable {self.flag} DIR") from None
        self._created = list(reversed(missing))
        self._dir = OutDir(self.out, self.flag)  # O_NOFOLLOW: a link swapped in since the check is refused too

    def _lock(self) -> None:
        command = COMMAND_LINE.get()
        holder = {"pid": os.getpid(), "run": self.run, "started": self.started, "command": list(command) if command else None}
        self._fd = take_lock(self.dir, LOCK_NAME, holder)

    def _unlock(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(LOCK_NAME, dir_fd=self.dir.fd)  # while still holding it: a waiter that opened it retries (inode check)
            os.close(self._fd)
            self._fd = None
        if self._dir is not None:
            self._dir.close()
            self._dir = None

    # -- files -----------------------------------------------------------------------------
    def _top(self) -> dict[str, Stat]:
        """The files and folders directly in --out (name -> stat; folders with size -1), but the tool's bookkeeping.

        Only the top level is listed: --out may be a large existing folder, and a run writes its
        files there; folders are walked only where the run wrote (``_ours``)."""
        return {n: stat_key(st) for n, st in self.dir.entries("").items()
                if not is_reserved(n) and (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode))}  # fmt: skip

    def _ours(self) -> dict[str, Stat]:
        """Files written (created or replaced) since the claim."""
        ours: dict[str, Stat] = {}
        for name, st in self._top().items():
            if st[2] >= 0:
                if self._before.get(name) != st:
                    ours[name] = st
            elif self._before.get(name) != st or name in self._touched:  # a folder the run made, or wrote into
                ours.update({rel: fst for rel, fst in self.dir.files(name).items() if self._inside_before.get(rel) != fst})
        return ours

    def _hash(self, path: Path, rel: str | None = None) -> str | None:
        try:
            st = self.dir.lstat(rel) if rel is not None else os.stat(path)
        except OSError:
            return None
        if st is None:
            return None
        key = (str(path.absolute()), stat_key(st))
        if key not in self._hashes:
            digest = self.dir.sha256(rel) if rel is not None else sha256_file(path)
            if digest is None:
                return None
            self._hashes[key] = digest
        return self._hashes[key]

    # -- the run's life --------------------------------------------------------------------
    def acquire(self) -> RunDir:
        try:
            self._mkdir()
            self._lock()
        except BaseException:
            self._unlock()
            for folder in reversed(self._created):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise
        try:
            refuse_links(self.dir, self.out, self.deployed.values())
            if self.force and not is_manifest(self.dir):
                self._set_aside([MANIFEST_NAME])  # a run.json that is not an attn-export manifest is the user's file too
            theirs = foreign_bookkeeping(self.dir)  # named like our bookkeeping, without our record: the user's
            if theirs and not self.force:
                raise bookkeeping_error(self.out, self.flag, theirs)
            self._set_aside(theirs)
            recover(self.dir)  # a killed run's files out, the last complete run back in
            manifest, _ = read_manifest(self.dir)
            foreign = foreign_files(self.dir, manifest, self.names)  # the user's files at names this run may write
            if foreign and not self.force:
                raise conflict_error(self.out, self.flag, foreign[0])
            self._set_aside(foreign)
            earlier = earlier_files(self.dir, manifest)
            if self.names is not None:
                self._base, self._kept = manifest, {rel for rel in earlier if rel not in self.names and rel != MANIFEST_NAME}
                earlier = [rel for rel in earlier if rel not in self._kept]
            self._moved = move_aside(self.dir, earlier, self.run)
            before = self._top()
            before.pop(MANIFEST_NAME, None)
            self._touched = {rel.split("/", 1)[0] for rel in self._moved if "/" in rel}  # folders an earlier run wrote into
            self._inside_before = {rel: st for name in self._touched for rel, st in self.dir.files(name).items()}
            self._before_dirs = {rel for name in self._touched for rel in self.dir.dirs(name)}
            self._before, self._snapshot = before, True
            snapshot = {"top": before, "inside": self._inside_before, "touched": sorted(self._touched), "dirs": sorted(self._before_dirs)}
            self._manifest_written = True
            self._write_manifest({"status": "running", "claim": snapshot})
        except BaseException:
            self.abort()
            raise
        return self

    def _set_aside(self, files: list[str]) -> None:
        """--force: move the user's files into a new folder beside --out (``run_dir_fs.make_sibling``), before anything is written."""
        if not files:
            return
        if self.aside is None:
            self.aside = make_sibling(self.dir, _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
        move_into(self.dir, files, self.aside)
        self._aside_files += files
        log.warning("--force: moved %d file(s) attn-export did not write out of %s into %s: %s", len(files), self.out, self.aside,
                    shown(files))

    def finish(self) -> Path:
        """Write the complete manifest (the commit), then drop the earlier run's files and release the folder."""
        try:
            try:
                artifacts = {rel: {"sha256": self._hash(self.out / rel, rel), "size_bytes": st[2]} for rel, st in sorted(self._ours().items())
                             if rel != MANIFEST_NAME}  # fmt: skip
                deployed = {}
                for flag, folder in self.deployed.items():
                    if folder.is_dir() and not _is_within(folder, self.out):
                        files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
                        deployed[flag] = {"path": str(folder.absolute()),
                                          "files": {p.relative_to(folder).as_posix(): {"sha256": self._hash(p), "size_bytes": p.stat().st_size} for p in files}}  # fmt: skip
                if self._base is not None:  # the entries of the files it left in place
                    artifacts = {**{rel: e for rel, e in self._base["artifacts"].items() if rel in self._kept}, **artifacts}
                path = self._write_manifest({"status": "complete", "finished": _now(), "artifacts": artifacts, "deployed": deployed})
                self._committed = True
            except BaseException:
                self.abort()
                raise
            with contextlib.suppress(OSError, ConfigError):  # committed: a leftover aside is dropped by the next run
                discard_aside(self.dir)
                for name in sorted(self._touched):  # folders the earlier run's files left empty (deepest first)
                    for rel in sorted(self.dir.dirs(name), key=len, reverse=True):
                        with contextlib.suppress(OSError):
                            self.dir.rmdir(rel)
            return path
        finally:
            self._unlock()

    def abort(self) -> None:
        """Remove what this run wrote, then its run.json, then put the earlier run's files back; release the folder."""
        if self._fd is None or self._committed:
            return
        try:
            if self._snapshot is not None:  # only files that appeared or changed since the claim are ours
                for rel in self._ours():
                    if rel != MANIFEST_NAME:
                        with contextlib.suppress(OSError, ConfigError):
                            self.dir.unlink(rel)
                self._remove_new_dirs()
            if self._manifest_written:
                with contextlib.suppress(OSError):
                    self.dir.unlink(MANIFEST_NAME)
            if not restore(self.dir, strict=False):
                log.warning("some files of the earlier run are still in %s; the next run into %s puts them back", PREVIOUS_NAME, self.out)
        finally:
            self._unlock()
            for folder in reversed(self._created):  # innermost first; only if still empty
                with contextlib.suppress(OSError):
                    folder.rmdir()

    def _remove_new_dirs(self) -> None:
        """Folders this run created under --out, if it left them empty (innermost first)."""
        for name, st in self._top().items():
            new = self._before.get(name) != st
            if st[2] >= 0 or not (new or name in self._touched):
                continue
            for rel in sorted(self.dir.dirs(name), key=len, reverse=True):
                if new or rel not in self._before_dirs:
                    with contextlib.suppress(OSError):
                        self.dir.rmdir(rel)

    def _write_manifest(self, fields: Mapping[str, Any]) -> Path:
        command = COMMAND_LINE.get()
        data = manifest_record(fields["status"], command=list(command) if command else None, seed=self.seed, started=self.started,
                               config=self.config, **{k: v for k, v in fields.items() if k != "status"})  # fmt: skip
        data["run"] = self.run  # the aside folder's marker carries it too: complete with this id = this run committed
        if self._base is not None:  # it amends that run: its command, seed and options stay, with this command added
            data.update({k: self._base[k] for k in ("command", "seed", "versions", "started", "config", "deployed") if k in self._base})
            data["amended"] = [*(self._base.get("amended") or []), {"command": list(command) if command else None, "started": self.started}]
        if self.aside is not None:  # --force: where the user's files went
            data["moved_aside"] = {"folder": str(self.aside), "files": self._aside_files}
        self.dir.write_atomic(MANIFEST_NAME, manifest_bytes(data))
        return self.out / MANIFEST_NAME

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
        if os.path.dirname(os.path.abspath(path)) != os.path.abspath(self.out):
            return None  # not directly in --out (e.g. an eager-only route): nothing this run can vouch for
        return self._hash(path, path.name)


def _is_within(path: Path, folder: Path) -> bool:
    return path.absolute().resolve().is_relative_to(folder.absolute().resolve())


@contextlib.contextmanager
def claim(out: str | os.PathLike[str], flag: str = "--out", *, config: Mapping[str, Any] | None = None, seed: int | None = None,
          deployed: Mapping[str, Path | None] | None = None, force: bool = False, names: Iterable[str] | None = None) -> Iterator[RunDir]:  # fmt: skip
    """Own ``out`` for the block: lock, the user's files refused (or, ``force``, moved beside it),
    earlier run aside, manifest on success, clean-up on failure. With ``names`` (``attn-export
    report``) only those files of the earlier run are replaced; its other files stay listed."""
    owner = RunDir(Path(out), flag, config, seed, deployed, force, names).acquire()
    try:
        yield owner
    except BaseException:
        owner.abort()
        raise
    owner.finish()


def claim_output(cfg: Any) -> contextlib.AbstractContextManager[RunDir]:
    """``claim()`` for a ``RunConfig``: its --out, options, seed, deployment folders and --force."""
    return claim(cfg.out, "--out", config=cfg.to_dict(), seed=cfg.seed, deployed={"--bundle": cfg.bundle, "--triton": cfg.triton},
                 force=cfg.force)  # fmt: skip

