"""``OUT/run.json``, the run manifest, in one place: its names and schema, how it is parsed and
serialised, the sha256 of the files it lists, and the versions it records.

Why one module: the manifest was spread over the claim (``run_dir``, which writes it), the
recovery (``run_dir_aside``, which reads it), the gate (``validate.gate_hashes``, which checks a
report against it) and ``validate.schema`` (its pydantic model), so the claim, below
``validate``, imported ``validate`` to read its own file. This module sits below all of them and
imports nothing of theirs: the claim and the gate read one schema and hash with one function.

Hashing: ``sha256_fd`` is the one sha256 of the package. ``sha256_regular`` opens a path without
following a link and refuses what is not a regular file (a FIFO planted under an artifact's name
never blocks a reader); ``sha256_file`` is for paths the user named (an engine given through a
link is hashed as the file it points to).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attn_export.errors import AttnExportError, ConfigError

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "MAX_MANIFEST_BYTES",
    "ManifestFileSchema",
    "RunManifestSchema",
    "Sha256",
    "manifest_bytes",
    "manifest_record",
    "parse_manifest",
    "sha256_fd",
    "sha256_file",
    "sha256_regular",
]

MANIFEST_NAME = "run.json"
MANIFEST_FORMAT = "attn-export-run/1"
MAX_MANIFEST_BYTES = 64 << 20

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


# -- the schema ------------------------------------------------------------------------------------
class ManifestFileSchema(BaseModel):
    """One file a run wrote: its bytes' sha256 and its size."""

    model_config = ConfigDict(strict=True, extra="ignore")  # readers ignore keys a newer writer added
    sha256: Sha256
    size_bytes: Annotated[int, Field(ge=0)]


class RunManifestSchema(BaseModel):
    """``OUT/run.json``: which run wrote the folder, and the sha256 of every file it wrote."""

    model_config = ConfigDict(strict=True, extra="ignore")
    format: Literal["attn-export-run/1"]
    status: Literal["running", "complete"]
    pid: Annotated[int, Field(ge=0)] | None = None
    run: str | None = None  # the run's id, also in its aside folder's marker (outdir.bookkeeping)
    command: list[str] | None = None
    seed: int | None = None
    versions: dict[str, str | None] = Field(default_factory=dict)
    started: str | None = None
    finished: str | None = None
    artifacts: dict[str, ManifestFileSchema] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)


# -- reading and writing ------------------------------------------------------------------------------
def parse_manifest(raw: bytes, where: str, fix: str, error: type[AttnExportError] = ConfigError) -> dict[str, Any]:
    """The manifest in ``raw`` (at most ``MAX_MANIFEST_BYTES``), checked against ``RunManifestSchema``; else one line of ``error``."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise error(f"{where}: expected an attn-export {MANIFEST_NAME}, got a file over {MAX_MANIFEST_BYTES >> 20} MiB; {fix}")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise error(f"{where}: expected an attn-export {MANIFEST_NAME} in UTF-8 JSON, got undecodable bytes; {fix}") from None
    except (json.JSONDecodeError, RecursionError) as err:
        why = f"{err.msg} at line {err.lineno}" if isinstance(err, json.JSONDecodeError) else "nested too deeply"
        raise error(f"{where}: expected an attn-export {MANIFEST_NAME}, got invalid JSON ({why}); {fix}") from None
    if not isinstance(data, dict):
        kind = {list: "a list", str: "a string"}.get(type(data), type(data).__name__)
        raise error(f"{where}: expected a JSON object, got {kind}; {fix}")
    try:
        RunManifestSchema.model_validate(data, strict=True)
    except ValidationError as err:
        raise error(_one_line(err, where, fix)) from None
    return data


def _one_line(err: ValidationError, where: str, fix: str) -> str:
    """The first problem as ``<file>: <field>: expected X, got Y; <fix>``, in pydantic's own words for X
    (the gate reads run.json through ``validate.schema``, whose messages name every kind of problem)."""
    first = err.errors(include_url=False)[0]
    field = ".".join(str(p) for p in first["loc"]) or "(top level)"
    if first["type"] == "missing":
        want, got = "a value", "nothing (the key is missing)"
    else:
        pattern = (first.get("ctx") or {}).get("pattern")
        want = f"a string matching {pattern}" if first["type"] == "string_pattern_mismatch" else re.sub(r"^\w+ should (be )?", "", first["msg"])
        got = json.dumps(first.get("input"), default=str)[:60]
    return " ".join(f"{where}: {field}: expected {want}, got {got}; {fix}".split())


def manifest_record(status: str, *, command: list[str] | None, seed: int | None, started: str, config: dict[str, Any],
                    **fields: Any) -> dict[str, Any]:  # fmt: skip
    """A ``run.json`` of this process, ``fields`` (``finished``, ``artifacts``, ...) between its header and its config."""
    from attn_export.host.environment import package_versions

    return {"format": MANIFEST_FORMAT, "status": status, "pid": os.getpid(), "command": command, "seed": seed,
            "versions": package_versions(), "started": started, **fields, "config": config}  # fmt: skip


def manifest_bytes(data: dict[str, Any]) -> bytes:
    """How ``run.json`` is written: indented UTF-8 JSON, one trailing newline."""
    return (json.dumps(data, indent=2, default=str) + "\n").encode("utf-8")


# -- hashing --------------------------------------------------------------------------------------------
def sha256_fd(fd: int) -> str:
    """The sha256 of what is left to read from ``fd`` (1 MiB at a time)."""
    h = hashlib.sha256()
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    return h.hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The sha256 of the file at ``path`` (a path the user named: a link is followed)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


def sha256_regular(path: Path) -> tuple[str | None, str | None]:
    """(sha256, None) for a regular file, else (None, what it is): opened O_NOFOLLOW | O_NONBLOCK."""
    from attn_export.host.paths import file_kind

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, "missing"
    except OSError as err:
        return None, "a symbolic link" if err.errno == errno.ELOOP else f"unreadable ({err.strerror or err})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, file_kind(st.st_mode)
        return sha256_fd(fd), None
    finally:
        os.close(fd)
