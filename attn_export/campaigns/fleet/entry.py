"""A cache entry's record and its verification: what is served from the cache is what was written there.

Why: a hit used to check only that ``report.json`` existed, so a model replaced in the entry, a failing
report edited to PASS, a missing model or an entry linked to a folder elsewhere were served as PASS,
and a damaged report ended the fleet. Now the writer puts ``fleet-entry.json`` into the entry last
(before the rename that publishes it): the entry's key and the sha256 and size of every file in it.
A reader serves the entry only if it is a real folder (not a link), its record names this key, it holds
exactly the files the record lists, each a regular file with the recorded sha256, and its ``run.json``
(the run's own manifest, ``outdir.manifest``) is complete and lists the same sha256 for every file it
wrote. Anything else is a reason, in a few words, and the caller rebuilds the point.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attn_export.errors import ConfigError
from attn_export.outdir.atomic import atomic_write_bytes
from attn_export.outdir.manifest import MANIFEST_NAME, Sha256, parse_manifest, sha256_regular

__all__ = ["RECORD", "EntryRecord", "entry_check", "write_record"]

RECORD = "fleet-entry.json"
RECORD_FORMAT = "attn-export-fleet-entry/1"
MAX_RECORD_BYTES = 16 << 20


class EntryFile(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    sha256: Sha256
    size_bytes: Annotated[int, Field(ge=0)]


class EntryRecord(BaseModel):
    """``fleet-entry.json``: the key the entry was written under, and every file it holds."""

    model_config = ConfigDict(strict=True, extra="forbid")
    format: Literal["attn-export-fleet-entry/1"]
    key: str
    files: dict[str, EntryFile]


def _files(folder: Path, ignore: Iterable[str]) -> tuple[list[str], str | None]:
    """Every file under ``folder`` (relative, POSIX), except the record and ``ignore`` at its top; or a link's name."""
    skip = {RECORD, *ignore}
    found: list[str] = []
    for top, dirs, files in os.walk(folder, followlinks=False):
        rel_top = Path(top).relative_to(folder)
        for d in dirs:
            if (Path(top) / d).is_symlink():
                return [], f"{(rel_top / d).as_posix()} is a link"
        found += [(rel_top / f).as_posix() for f in files if not (rel_top == Path(".") and f in skip)]
    return sorted(found), None


def write_record(folder: Path, key: str, ignore: Iterable[str] = ()) -> None:
    """Hash every file of the finished entry into its record (the last file written before it is published)."""
    names, link = _files(folder, ignore)
    if link is not None:
        raise ConfigError(f"cache entry {key}: {link}; a point's folder holds no links")
    files = {}
    for rel in names:
        digest, kind = sha256_regular(folder / rel)
        if digest is None:
            raise ConfigError(f"cache entry {key}: {rel} is {kind}; a point's folder holds regular files only")
        files[rel] = {"sha256": digest, "size_bytes": (folder / rel).stat().st_size}
    record = {"format": RECORD_FORMAT, "key": key, "files": files}
    atomic_write_bytes(folder / RECORD, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())


def _read_record(entry: Path) -> tuple[EntryRecord | None, str | None]:
    try:
        fd = os.open(entry / RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, f"no {RECORD} (written by an older attn-export, or never finished)"
    except OSError as e:
        return None, f"{RECORD} cannot be read ({e.strerror or e})"
    try:
        raw = os.read(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return EntryRecord.model_validate(json.loads(raw.decode("utf-8")), strict=True), None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValidationError):
        return None, f"{RECORD} is damaged"


def _check_manifest(entry: Path, record: EntryRecord) -> str | None:
    """The run's own manifest agrees: complete, and every file it lists has the recorded sha256."""
    if MANIFEST_NAME not in record.files:
        return None  # an entry of something other than a run (the cache's own tests)
    try:
        manifest = parse_manifest((entry / MANIFEST_NAME).read_bytes(), str(entry / MANIFEST_NAME), "rebuild it")
    except (ConfigError, OSError) as e:
        return str(e).split(";")[0]
    if manifest["status"] != "complete":
        return f"{MANIFEST_NAME} says the run did not complete"
    for rel, listed in manifest["artifacts"].items():
        if rel not in record.files or record.files[rel].sha256 != listed["sha256"]:
            return f"{rel} is not the file {MANIFEST_NAME} lists"
    return None


def entry_check(entry: Path, key: str, ignore: Iterable[str] = ()) -> str | None:
    """None when ``entry`` may be served for ``key``; else why not, in a few words."""
    if entry.is_symlink():
        return f"the entry is a link to {os.readlink(entry)}, not a folder the cache wrote"
    if not entry.is_dir():
        return "the entry is not a folder"
    record, why = _read_record(entry)
    if record is None:
        return why
    if record.key != key:
        return f"its {RECORD} is for key {record.key[:32]!r}"
    names, link = _files(entry, ignore)
    if link is not None:
        return link
    missing = sorted(set(record.files) - set(names))
    if missing:
        return f"{missing[0]} is missing"
    extra = sorted(set(names) - set(record.files))
    if extra:
        return f"{extra[0]} was not written by the point"
    for rel in names:
        digest, kind = sha256_regular(entry / rel)
        if digest is None:
            return f"{rel} is {kind}"
        recorded = record.files[rel].sha256
        if digest != recorded:
            return f"{rel} changed since it was written (sha256 {digest[:12]}, {recorded[:12]} recorded)"
    return _check_manifest(entry, record)
