"""The previous run kept aside, and what a killed run left behind: the crash-consistency protocol.

A run is complete only once its ``run.json`` says ``"status": "complete"``; that write (fsync,
then rename) is the commit point. Until then the last complete run is kept in
``OUT/.attn-export-previous/``, and every step is ordered so that a SIGKILL anywhere leaves a
state the next run can read back:

1. *move aside*: the aside folder is created with ``mkdir`` (an existing one, or a link, is
   refused), the marker ``.attn-export-moved`` is created inside it first (this run's id and
   the files it moves: the record that makes the folder ours, ``outdir.bookkeeping``), then the
   earlier run's files are renamed into it with ``run.json`` last.
2. ``run.json`` "running" is written, with the claim's snapshot of ``--out`` (what was there
   before this run wrote anything), then the run writes its files.
3. *commit*: ``run.json`` "complete", with the run's id; then the aside folder is renamed to a
   ``.attn-export-discard-*`` name and deleted, its marker last.
4. *abort* (a failure or an interrupt): this run's files are removed, then its ``run.json``,
   then the earlier files the marker lists are renamed back (``run.json`` last), then the marker.

``recover()`` (the next run, holding the lock, so the run it cleans up is dead) reads that
state: a marker whose run id a complete ``run.json`` carries means the commit happened (the
aside is dropped); otherwise the run never completed: a ``run.json`` still "running" has its
files removed (the names a run writes, found new or changed against its recorded snapshot and
changed after its ``run.json`` was written, by inode change time, which no file owner can set
back), and the files the marker lists are renamed back. ``--out`` then holds the last complete
run again, which the new run keeps aside until it completes itself. A ``.attn-export*`` entry
without our marker is not ours: ``foreign_bookkeeping`` finds it, and it is refused or, with
``--force``, moved aside like the user's files below; recovery never touches it.

Only files are moved: those a complete ``run.json`` lists whose bytes still match the sha256
it recorded, all reached through ``run_dir_fs.OutDir``, which follows no link. A file with a
name a run writes that no complete ``run.json`` lists with a matching sha256 (the user's own
``model.onnx``, a listed file edited since, any such file in a folder without ``run.json``)
is not ours: ``foreign_files`` finds it, and the run refuses the folder unless ``--force``
moves it into a new sibling folder first (``run_dir_fs.move_to_sibling``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attn_export.errors import ConfigError
from attn_export.outdir.bookkeeping import MARKER_NAME, PREVIOUS_FORMAT, Marker, marker_bytes, parse_marker, shown
from attn_export.outdir.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, parse_manifest
from attn_export.outdir.fs import SIBLING_INFIX, OutDir, stat_key

__all__ = [
    "ARTIFACT_PATTERNS", "NESTED_PATTERNS", "REPORT_FILES", "LOCK_NAME", "MARKER_NAME", "PREVIOUS_NAME", "TRASH_PREFIX",
    "check_owned", "conflict_error", "discard_aside", "bookkeeping_error", "earlier_files", "foreign_bookkeeping", "foreign_files", "is_manifest", "is_reserved", "move_aside", "read_manifest", "recover", "refuse_links", "restore",
]  # fmt: skip

log = logging.getLogger(__name__)

LOCK_NAME = ".attn-export.lock"
PREVIOUS_NAME = ".attn-export-previous"
TRASH_PREFIX = ".attn-export-discard-"
# Every name a command writes into --out (the main command and ``encoder``, ``sweep``, ``bench``,
# ``report``): such a file that no complete run.json of ours lists is the user's (see the module doc).
REPORT_FILES = ("report.md", "report.html", "latency.png", "pareto.png", "error_histograms.png", "sensitivity.png", "seq_scaling.png",
                "attention_maps.png")  # fmt: skip  # validate.render.write_reports
ARTIFACT_PATTERNS = ("model*.onnx", "model*.onnx.data", "model*.engine", "model*.engine.*", "report.json", *REPORT_FILES,
                     "bench.json", "bench.md", "sweep.json", "pareto.md", "run.log", MANIFEST_NAME)  # fmt: skip
NESTED_PATTERNS = ("models/*.onnx",)  # sweep --save-models
_LEFTOVERS = (".*.tmp",)  # an atomic write cut short by a kill (attn_export.outdir.atomic names)


def is_reserved(name: str) -> bool:
    """The tool's own bookkeeping names in --out (never an artifact)."""
    return name.startswith(".attn-export")


def _named_like_ours(name: str, leftovers: bool = False) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in ARTIFACT_PATTERNS + (_LEFTOVERS if leftovers else ()))


def named_like_ours(rel: str) -> bool:
    """``rel`` (relative to --out) is a name a run writes: at the top level, or in a folder a run fills."""
    if rel.count("/") == 1:
        return any(fnmatch.fnmatchcase(rel, p) for p in NESTED_PATTERNS)
    return "/" not in rel and _named_like_ours(rel)


def inside(rel: object) -> bool:
    """A manifest entry names a file inside --out (relative, no '..', not our bookkeeping)."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        return False
    p = PurePosixPath(rel)
    return not p.is_absolute() and ".." not in p.parts and "." not in rel.split("/") and not is_reserved(p.parts[0])


def refuse_links(od: OutDir, out: Path, deployed: Iterable[Path]) -> None:
    """A link (or a FIFO, a device) at a name in --out the run uses is refused before anything moves:
    the bookkeeping names, the names a run writes, and the folders of ``deployed`` inside --out."""
    for name, st in od.entries("").items():
        if not (is_reserved(name) or _named_like_ours(name)):
            continue
        if stat.S_ISLNK(st.st_mode):
            raise od.link_error(name)
        if name != LOCK_NAME and not stat.S_ISREG(st.st_mode) and not (is_reserved(name) and stat.S_ISDIR(st.st_mode)):
            raise od.kind_error(name, st)
    root = os.path.abspath(out)
    for folder in deployed:
        rel = os.path.relpath(os.path.abspath(folder), root)
        if rel == "." or rel.startswith(".."):
            continue
        parts = PurePosixPath(rel).parts
        for i in range(len(parts)):
            st = od.lstat("/".join(parts[: i + 1]))
            if st is None:
                break
            if stat.S_ISLNK(st.st_mode):
                raise od.link_error("/".join(parts[: i + 1]))


# -- run.json ----------------------------------------------------------------------------------
def read_manifest(od: OutDir) -> tuple[dict[str, Any] | None, int]:
    """(``OUT/run.json`` validated, its inode change time in ns), or (None, 0) when there is none."""
    fix = f"it is not an attn-export run manifest: move it away, pass another {od.flag}, or --force to move it aside"
    raw = od.read(MANIFEST_NAME, MAX_MANIFEST_BYTES + 1)
    if raw is None:
        return None, 0
    data = parse_manifest(raw, f"{od.path / MANIFEST_NAME}", fix)
    st = od.lstat(MANIFEST_NAME)
    return data, (st.st_ctime_ns if st is not None else 0)


def is_manifest(od: OutDir) -> bool:
    """Whether ``OUT/run.json`` is missing or an attn-export run manifest (not a file of the user's)."""
    try:
        read_manifest(od)
    except ConfigError:
        return False
    return True


class _Claim(BaseModel):
    """The snapshot a running ``run.json`` records: what --out held before the run wrote anything."""

    model_config = ConfigDict(extra="ignore")
    top: dict[str, list[int]] = Field(default_factory=dict)
    inside: dict[str, list[int]] = Field(default_factory=dict)
    touched: list[str] = Field(default_factory=list)
    dirs: list[str] = Field(default_factory=list)


def _claim_of(manifest: dict[str, Any]) -> _Claim | None:
    try:
        return _Claim.model_validate(manifest["claim"]) if isinstance(manifest.get("claim"), dict) else None
    except ValidationError:
        return None  # an unreadable snapshot: fall back to the names a run writes


# -- the earlier run's files, and the user's ------------------------------------------------------
def _owned(od: OutDir, manifest: dict[str, Any] | None) -> set[str]:
    """The files a complete ``manifest`` lists whose bytes still match the sha256 it recorded."""
    owned: set[str] = set()
    if manifest is None or manifest.get("status") != "complete":
        return owned
    for rel, entry in (manifest.get("artifacts") or {}).items():
        if not inside(rel) or rel == MANIFEST_NAME or not isinstance(entry, dict):
            continue
        st = od.lstat(rel)  # a link on the way is refused: a path the run uses
        if st is None:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise od.link_error(rel)
        if not stat.S_ISREG(st.st_mode):
            continue
        if st.st_size == entry.get("size_bytes") and od.sha256(rel) == entry.get("sha256"):
            owned.add(rel)
        elif not named_like_ours(rel):
            log.warning("left %s in place: run.json lists it, but it is not the file that run wrote (sha256 differs)", rel)
    return owned


def earlier_files(od: OutDir, manifest: dict[str, Any] | None) -> list[str]:
    """The files of the complete earlier run in --out, ``run.json`` last (none without a manifest)."""
    if manifest is None:
        return []
    return sorted(_owned(od, manifest)) + [MANIFEST_NAME]


def foreign_files(od: OutDir, manifest: dict[str, Any] | None, names: Iterable[str] | None = None) -> list[str]:
    """Files in --out with a name a run writes (only ``names``, when given) that no complete
    ``run.json`` lists with a matching sha256: the user's (see the module doc), sorted."""
    owned = _owned(od, manifest)
    wanted = None if names is None else set(names)
    found: list[str] = []
    for name, st in od.entries("").items():
        if is_reserved(name) or name == MANIFEST_NAME:
            continue
        if stat.S_ISREG(st.st_mode):
            candidates = [name]
        elif stat.S_ISDIR(st.st_mode) and any(p.startswith(name + "/") for p in NESTED_PATTERNS):
            candidates = list(od.files(name))
        else:
            continue
        found += [rel for rel in candidates if named_like_ours(rel) and rel not in owned and (wanted is None or rel in wanted)]
    return sorted(found)


def conflict_error(out: Path, flag: str, rel: str) -> ConfigError:
    """The one line that refuses a --out holding a file attn-export did not write."""
    return ConfigError(f"{flag} {out} holds {out / rel}, which attn-export did not write (no run.json of its own lists it with these bytes); "
                       f"pass another {flag}, or --force to move such files aside into {out}{SIBLING_INFIX}<UTC time>/ first")  # fmt: skip


def move_aside(od: OutDir, files: list[str], run: str) -> list[str]:
    """Step 1 of the protocol (the marker first: the folder is ours before it holds anything); returns the moved files."""
    if not files:
        return []
    od.mkdir_new(PREVIOUS_NAME)
    od.write_new(f"{PREVIOUS_NAME}/{MARKER_NAME}", marker_bytes(PREVIOUS_FORMAT, run, files))
    for rel in files:
        od.rename(rel, f"{PREVIOUS_NAME}/{rel}")
    log.info("moved %d files of an earlier run aside: %s", len(files), shown(files))
    return files


def _marker(od: OutDir, folder: str) -> Marker | None:
    """The marker of ``folder`` (a ``bookkeeping.Marker``) when it is a real folder of ours, else None."""
    st = od.lstat(folder)
    if st is None or not stat.S_ISDIR(st.st_mode):
        return None
    try:
        return parse_marker(od.read(f"{folder}/{MARKER_NAME}", MAX_MANIFEST_BYTES), PREVIOUS_FORMAT)
    except (OSError, ConfigError):  # a link or a FIFO at the marker's name: not ours
        return None


def restore(od: OutDir, strict: bool) -> bool:
    """Rename the files the aside folder's marker lists back into --out (``run.json`` last), then the
    marker, then the folder. A file that cannot go back, or one the marker does not list, keeps the
    folder (nothing is lost, nothing of someone else's is moved); ``strict`` raises."""
    marker = _marker(od, PREVIOUS_NAME)
    if marker is None:
        return od.lstat(PREVIOUS_NAME) is None  # none, or not ours (refused before, never touched)
    prefix = PREVIOUS_NAME + "/"
    present = od.files(PREVIOUS_NAME)
    listed = [prefix + rel for rel in marker.files if inside(rel)]
    files = sorted((r for r in listed if r in present), key=lambda r: (r == prefix + MANIFEST_NAME, r))
    left = []
    for rel in files:
        try:
            od.rename(rel, rel[len(prefix) :])
        except (OSError, ConfigError) as err:
            if strict and isinstance(err, ConfigError):
                raise
            left.append(rel)
            log.warning("could not put %s back (%s); it stays in %s", rel, err, PREVIOUS_NAME)
    if left:
        return False
    return _remove_marked(od, PREVIOUS_NAME)


def _remove_marked(od: OutDir, folder: str) -> bool:
    """Delete our bookkeeping ``folder``: what it holds, then its marker (last: until then it is known as ours)."""
    for name, st in od.entries(folder).items():
        if name != MARKER_NAME:
            od.rmtree(f"{folder}/{name}") if stat.S_ISDIR(st.st_mode) else od.unlink(f"{folder}/{name}")
    with contextlib.suppress(FileNotFoundError):
        od.unlink(f"{folder}/{MARKER_NAME}")
    od.rmdir(folder)
    return True


def discard_aside(od: OutDir) -> None:
    """Step 3 after the commit: rename the aside folder away (one atomic step), then delete it."""
    if _marker(od, PREVIOUS_NAME) is None:
        return
    trash = TRASH_PREFIX + secrets.token_hex(4)
    od.rename(PREVIOUS_NAME, trash)
    _remove_marked(od, trash)


def foreign_bookkeeping(od: OutDir) -> list[str]:
    """Entries directly in --out named like the tool's bookkeeping (``.attn-export*``) that carry no record
    of a run of ours (``outdir.bookkeeping``): the user's, sorted."""
    found = []
    for name in od.entries(""):
        if not is_reserved(name) or name == LOCK_NAME:  # the lock is checked as it is taken (``fs.take_lock``)
            continue
        if not ((name == PREVIOUS_NAME or name.startswith(TRASH_PREFIX)) and _marker(od, name)):
            found.append(name)
    return sorted(found)


def bookkeeping_error(out: Path, flag: str, names: list[str]) -> ConfigError:
    """The one line that refuses a --out holding a ``.attn-export*`` entry attn-export did not make."""
    more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
    return ConfigError(f"{flag} {out} holds {out / names[0]}{more}, which attn-export did not make (a name like its bookkeeping, "
                       f"without the record a run of attn-export leaves in it); pass another {flag}, "
                       f"or --force to move it aside into {out}{SIBLING_INFIX}<UTC time>/ first")


# -- what a killed run left behind -------------------------------------------------------------
def _discard_incomplete(od: OutDir, manifest: dict[str, Any], since_ns: int) -> list[str]:
    """Remove the files of the run whose ``run.json`` still says "running" (see the module doc)."""
    claim = _claim_of(manifest)
    removed: list[str] = []

    def drop(rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            od.unlink(rel)
            removed.append(rel)

    for name, st in od.entries("").items():
        if is_reserved(name) or name == MANIFEST_NAME:
            continue
        before = None if claim is None else claim.top.get(name)
        if stat.S_ISREG(st.st_mode):  # unchanged since that run began (a folder's ctime says nothing of its subfolders): not its
            if _named_like_ours(name, leftovers=True) and st.st_ctime_ns >= since_ns and before != list(stat_key(st)):
                drop(name)
        elif stat.S_ISDIR(st.st_mode) and claim is not None and (before is None or name in claim.touched):
            for rel, fst in od.files(name).items():
                cur = od.lstat(rel)
                if cur is not None and cur.st_ctime_ns >= since_ns and claim.inside.get(rel) != list(fst):
                    drop(rel)
            for rel in sorted(od.dirs(name), key=len, reverse=True):
                if before is None or rel not in claim.dirs:
                    with contextlib.suppress(OSError):
                        od.rmdir(rel)
    drop(MANIFEST_NAME)  # last: until it is gone, a later run can still tell these files apart
    if removed:
        log.info("removed %d files of an incomplete run (pid %s): %s", len(removed), manifest.get("pid"), ", ".join(removed))
    return removed


def recover(od: OutDir) -> None:
    """Bring --out back to its last complete run after a run was killed (see the module doc). Only
    bookkeeping with our marker is touched; the caller has refused (or moved aside) the rest."""
    for name in od.entries(""):
        if name.startswith(TRASH_PREFIX) and _marker(od, name) is not None:
            _remove_marked(od, name)
    aside = od.lstat(PREVIOUS_NAME)
    if aside is not None and stat.S_ISLNK(aside.st_mode):
        raise od.link_error(PREVIOUS_NAME)
    marker = _marker(od, PREVIOUS_NAME)
    manifest, since = read_manifest(od)
    status = (manifest or {}).get("status")
    if marker is None:
        if status == "running":
            _discard_incomplete(od, manifest or {}, since)
        return
    if status == "complete" and (manifest or {}).get("run") == marker.run:
        discard_aside(od)  # the run committed and was killed before it dropped the earlier one
        return
    if status == "running":
        _discard_incomplete(od, manifest or {}, since)
    restore(od, strict=True)
    log.info("put the last complete run back from %s", PREVIOUS_NAME)


def check_owned(out: str | os.PathLike[str], flag: str = "--out", force: bool = False, names: Iterable[str] | None = None) -> None:
    """Refuse, before any work, a ``out`` holding a file with a name a run writes that attn-export
    did not write (``run_dir_aside.foreign_files``); read-only. ``claim`` checks again under its lock."""
    from attn_export.host.paths import given_empty

    path = Path(out)
    if force or given_empty(flag) or os.path.islink(path) or not os.path.isdir(path):
        return  # moved aside by the claim, or refused there (a link), or nothing there yet
    od = OutDir(path, flag)
    try:
        refuse_links(od, path, ())
        theirs = foreign_bookkeeping(od)
        if theirs:
            raise bookkeeping_error(path, flag, theirs)
        if od.lstat(PREVIOUS_NAME) is not None:
            return  # a run was cut short here: the claim decides once it has put the last complete run back
        manifest, _ = read_manifest(od)
        if manifest is not None and manifest.get("status") != "complete":
            return  # a run still running (the lock refuses) or killed (the claim cleans it up)
        foreign = foreign_files(od, manifest, names)
        if foreign:
            raise conflict_error(path, flag, foreign[0])
    finally:
        od.close()
