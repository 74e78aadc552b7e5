"""The FLEET.toml schema: parsed with tomllib, validated with pydantic before any work starts.

Why pydantic: unknown keys (``extra="forbid"``), types and required fields give one-line errors for
free; what only the main command knows (its options, its targets) is checked by ``matrix``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import tomllib
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from attn_export.errors import ConfigError

__all__ = ["MAX_FLEET_BYTES", "MAX_NAME_CHARS", "MAX_TOML_DEPTH", "FleetSettings", "FleetSpec", "ModelSpec",
           "RecipeSpec", "TargetSpec", "load_fleet", "resolve_path"]

MAX_FLEET_BYTES = 1 << 20  # a FLEET.toml is a page of settings: a megabyte is far beyond any real one
MAX_TOML_DEPTH = 16  # the schema nests three deep (targets.labels); deeper is not a fleet file
MAX_NAME_CHARS = 64  # a name is a folder of fleet-out (points/<model>/<recipe>/<target>) and part of a Triton model
_NAME = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=MAX_NAME_CHARS)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """A subject: ``checkpoint`` (a folder or a shipped name like ``minilm``), or reference-layer options."""

    name: str = _NAME
    checkpoint: str | None = None
    options: str = ""  # main-command subject options (``--d-model 64 --heads 4``)


class RecipeSpec(_Strict):
    """Main-command options that compress or export (``--quantize int8``, ``--low-rank 0.5 --distill 200``)."""

    name: str = _NAME
    options: str = ""


class TargetSpec(_Strict):
    """Where a point deploys: the main command's ``--target``, TensorRT release, GPU arch, and the node labels that run it."""

    name: str = _NAME
    target: str = "ort-cpu"
    trt: str | None = None
    gpu_arch: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class FleetSettings(_Strict):
    """What every point shares: the user's texts (calibration and judging), extra options, the cache and retries."""

    texts: Path | None = None
    options: str = ""  # main-command options every point gets (``--repeats 5``)
    out: Path = Path("fleet-out")
    cache: Path = Path(".attn-export-cache")
    cache_limit: str = "20GiB"
    max_retries: int = Field(default=2, ge=0, le=10)


class FleetSpec(_Strict):
    fleet: FleetSettings = Field(default_factory=FleetSettings)
    models: list[ModelSpec] = Field(min_length=1)
    recipes: list[RecipeSpec] = Field(min_length=1)
    targets: list[TargetSpec] = Field(min_length=1)
    _base: Path = PrivateAttr(default_factory=Path.cwd)  # the file's folder: relative paths in options resolve to it

    @property
    def base(self) -> Path:
        return self._base


def _one_line(err: ValidationError, path: Path) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{path}: {where}: {first['msg']}; fix it and rerun"


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _read(path: Path) -> dict[str, Any]:
    """The file's TOML: a regular UTF-8 file of at most MAX_FLEET_BYTES, nested at most MAX_TOML_DEPTH deep."""
    from attn_export.host.paths import check_regular_file

    st = check_regular_file(path, "fleet file")  # a folder, FIFO or device (/dev/zero) is refused by its stat, unread
    if st is None:
        raise ConfigError(f"no fleet file at {path}; pass a FLEET.toml (see docs/fleet.md)")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        raw = os.read(fd, MAX_FLEET_BYTES + 1)  # bounded even if the file grew since the stat
    finally:
        os.close(fd)
    if len(raw) > MAX_FLEET_BYTES:
        raise ConfigError(f"fleet file {path} is over {MAX_FLEET_BYTES >> 20} MiB; pass a FLEET.toml (a page)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"fleet file {path} is not UTF-8 (byte {e.start}); save it as UTF-8 (TOML)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from None
    except RecursionError:  # tomllib recurses once per level: thousands of nested arrays exhaust the stack
        data = None
    try:
        too_deep = data is None or _depth(data) > MAX_TOML_DEPTH
    except RecursionError:
        too_deep = True
    if too_deep:
        raise ConfigError(f"{path}: values nested more than {MAX_TOML_DEPTH} deep; a fleet file nests three deep")
    return data


def resolve_path(value: str, base: Path) -> str:
    """A relative path of the fleet file, relative to its folder (``base``); absolute and ``~`` paths as given."""
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else base / p)


def _checkpoint(value: str | None, base: Path) -> str | None:
    """A checkpoint folder relative to the file; a bare name with no such folder there stays a shipped name."""
    if value is None or Path(value).expanduser().is_absolute():
        return value
    beside = Path(resolve_path(value, base))
    return str(beside) if beside.exists() or "/" in value or value.startswith(".") else value


def load_fleet(path: str | Path) -> FleetSpec:
    """Parse and validate ``path``; a ConfigError (one line) on any problem. Relative paths are relative to the file."""
    path = Path(path)
    data = _read(path)
    try:
        spec = FleetSpec.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_one_line(e, path)) from None
    for kind in ("models", "recipes", "targets"):
        names = [item.name for item in getattr(spec, kind)]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ConfigError(f"{path}: {kind} name {dup!r} appears twice (a duplicate point); give each a distinct name")
    base = path.parent.resolve()  # absolute: a Ray worker runs in another folder
    fleet = spec.fleet
    paths = {"texts": fleet.texts, "out": fleet.out, "cache": fleet.cache}
    resolved = {k: (v if v is None else Path(resolve_path(str(v), base))) for k, v in paths.items()}
    models = [m.model_copy(update={"checkpoint": _checkpoint(m.checkpoint, base)}) for m in spec.models]
    spec = spec.model_copy(update={"fleet": fleet.model_copy(update=resolved), "models": models})
    spec._base = base
    return spec
