"""The FLEET.toml schema: parsed with tomllib, validated with pydantic before any work starts.

Why pydantic: unknown keys (``extra="forbid"``), types and required fields give one-line errors for
free; what only the main command knows (its options, its targets) is checked by ``matrix``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attn_export.errors import ConfigError

__all__ = ["FleetSettings", "FleetSpec", "ModelSpec", "RecipeSpec", "TargetSpec", "load_fleet"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """A subject: ``checkpoint`` (a folder or a shipped name like ``minilm``), or reference-layer options."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    checkpoint: str | None = None
    options: str = ""  # main-command subject options (``--d-model 64 --heads 4``)


class RecipeSpec(_Strict):
    """Main-command options that compress or export (``--quantize int8``, ``--low-rank 0.5 --distill 200``)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    options: str = ""


class TargetSpec(_Strict):
    """Where a point deploys: the main command's ``--target``, TensorRT release, GPU arch, and the node labels that run it."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
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


def _one_line(err: ValidationError, path: Path) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{path}: {where}: {first['msg']}; fix it and rerun"


def load_fleet(path: str | Path) -> FleetSpec:
    """Parse and validate ``path``; a ConfigError (one line) on any problem. Relative paths are relative to the file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"no fleet file at {path}; pass a FLEET.toml (see docs/fleet.md)") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from None
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
    resolved = {k: (v if v is None or v.is_absolute() else base / v) for k, v in (("texts", fleet.texts), ("out", fleet.out), ("cache", fleet.cache))}
    return spec.model_copy(update={"fleet": fleet.model_copy(update=resolved)})
