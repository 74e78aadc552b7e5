"""Which entries named ``.attn-export*`` are ours: only those that carry a record a run of ours wrote.

Why: a name alone proved nothing. A user's folder ``out/.attn-export-previous/keep.txt`` was
taken for an interrupted run (removed, ``keep.txt`` moved into ``out/``), and a user's
``bundle/.attn-export-staging-mine/`` was deleted as a staging leftover. So every bookkeeping
folder a run makes gets a marker file first, before anything is put in it:

* ``OUT/.attn-export-previous/.attn-export-moved`` (``PREVIOUS_FORMAT``): the run id, pid and
  start time of the run that made it, and the files it moves there. The same run id is written
  into that run's ``run.json`` (``"run"``), so recovery tells "that run committed" (the ids
  match and ``run.json`` says complete) from "that run was cut short" (they differ);
* ``DIR/.attn-export-staging-*/.attn-export-staging.json`` (``STAGING_FORMAT``) for
  ``--bundle``, ``--triton``, ``--golden`` and fleet-out: the run's pid and start time.

A bookkeeping name without its marker (or with one that does not parse) is the user's: the run
refuses the folder in one line naming it and ``--force``, or ``--force`` moves it aside like any
other file of the user's (``fs.make_sibling``); it is never deleted or emptied. The lock file is
ours when it is empty or holds what ``fs.take_lock`` writes (a JSON object with a ``pid``); whether a
live run holds it (``lock_is_held``) tells a run still under way from one that was killed.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["MARKER_NAME", "Marker", "PREVIOUS_FORMAT", "STAGING_FORMAT", "STAGING_MARKER", "is_our_lock", "lock_is_held", "marker_bytes", "new_run_id", "parse_record",
           "parse_marker", "shown"]  # fmt: skip

MARKER_NAME = ".attn-export-moved"  # inside OUT/.attn-export-previous (and a discard folder renamed from it)
STAGING_MARKER = ".attn-export-staging.json"  # inside a deployment folder's staging folder
PREVIOUS_FORMAT = "attn-export-previous/1"
STAGING_FORMAT = "attn-export-staging/1"
_R = TypeVar("_R", bound=BaseModel)
MAX_MARKER_BYTES = 16 << 20  # a marker lists the files moved: bounded, read once


class Marker(BaseModel):
    """The record inside a bookkeeping folder that says which run made it."""

    model_config = ConfigDict(strict=True, extra="ignore")
    format: Literal["attn-export-previous/1", "attn-export-staging/1"]
    run: str
    pid: int
    started: str
    files: list[str] = []


def new_run_id() -> str:
    """A run's id: random, so no other run (nor a user's folder) carries the same one."""
    return secrets.token_hex(8)


def marker_bytes(fmt: str, run: str, files: list[str] | None = None) -> bytes:
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    record = {"format": fmt, "run": run, "pid": os.getpid(), "started": started, "files": files or []}
    return json.dumps(record).encode()


def parse_record(raw: bytes | None, model: type[_R], fmt: str, max_bytes: int) -> _R | None:
    """``raw`` read as ``model`` (a pydantic record with a ``format`` field) when it is one of ours of format ``fmt``;
    None when it is missing, too large, not UTF-8 JSON, off the schema or of another format: then it is not ours."""
    if raw is None or len(raw) > max_bytes:
        return None
    try:
        record = model.model_validate(json.loads(raw.decode("utf-8")))
    except (UnicodeDecodeError, ValueError, RecursionError, ValidationError):
        return None
    return record if getattr(record, "format", None) == fmt else None


def parse_marker(raw: bytes | None, fmt: str) -> Marker | None:
    """The marker in ``raw`` when it is one of ours of format ``fmt``; None otherwise (the folder is not ours)."""
    return parse_record(raw, Marker, fmt, MAX_MARKER_BYTES)


def is_our_lock(st: os.stat_result, raw: bytes | None) -> bool:
    """A regular lock file that is empty (being taken) or holds ``take_lock``'s record."""
    if not stat.S_ISREG(st.st_mode) or raw is None:
        return False
    if not raw.strip():
        return True
    try:
        holder = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(holder, dict) and isinstance(holder.get("pid"), int)


def shown(names: list[str], limit: int = 5) -> str:
    """At most ``limit`` names and the count of the rest: a message stays one short line for 10,000 files."""
    head = ", ".join(names[:limit])
    return head if len(names) <= limit else f"{head} and {len(names) - limit} more ({len(names)} in all)"


def lock_is_held(path: Path) -> bool | None:
    """Whether a live process holds the ``flock`` on the file at ``path`` (None: cannot tell; False: no file or no holder).

    Read from ``/proc/locks``, not by taking the lock: a probe that took it, even shared and for a
    moment, could make a run starting at that moment refuse its own folder. (No library reads
    ``/proc/locks``; its format is the kernel's: ``N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE ...``.)"""
    try:
        st = os.stat(path, follow_symlinks=False)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return False if not os.path.lexists(path) else None
    except OSError:
        return None
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[2] != "->":  # "->": a waiter, not the holder
            with contextlib.suppress(ValueError):
                major, minor, inode = parts[5].split(":")
                if (int(major, 16), int(minor, 16), int(inode)) == want:
                    return True
    return False
