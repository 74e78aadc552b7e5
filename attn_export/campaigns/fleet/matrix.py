"""The matrix: models x recipes x targets -> one ``FleetPoint`` (a validated ``RunConfig``) each.

Each point is exactly the main command with the model's, the recipe's, the target's and the shared
options; the options are parsed by the main command's own parser (passed in by the CLI, which owns
it), so an unknown option or value is refused as ``attn-export`` would refuse it.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attn_export.campaigns.fleet.schema import FleetSpec, ModelSpec, RecipeSpec, TargetSpec
from attn_export.errors import ConfigError

__all__ = ["FleetPoint", "OptionParser", "build_points"]

# The main command's parser: a list of arguments -> its validated RunConfig (ConfigError when refused).
OptionParser = Callable[[list[str]], Any]


@dataclass(frozen=True)
class FleetPoint:
    """One cell of the matrix: its names, the main-command arguments that rebuild it, its RunConfig and labels."""

    model: str
    recipe: str
    target: str
    args: tuple[str, ...]
    config: Any  # config.run.RunConfig
    labels: dict[str, str] = field(default_factory=dict)
    checkpoint: str | None = None

    @property
    def key(self) -> str:
        return f"{self.model}/{self.recipe}/{self.target}"

    @property
    def command(self) -> str:
        return shlex.join(["attn-export", *self.args])


def _split(text: str, where: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as e:
        raise ConfigError(f"{where}: options {text!r} do not parse as a command line ({e}); quote them as a shell would") from None


def _target_args(t: TargetSpec) -> list[str]:
    args = ["--target", t.target]
    if t.trt:
        args += ["--trt-version", t.trt]
    if t.gpu_arch:
        args += ["--gpu-arch", t.gpu_arch]
    return args


def _point(spec: FleetSpec, m: ModelSpec, r: RecipeSpec, t: TargetSpec, parse: OptionParser) -> FleetPoint:
    args = (["--checkpoint", m.checkpoint] if m.checkpoint else []) + _split(m.options, f"model {m.name}")
    args += _split(r.options, f"recipe {r.name}") + _target_args(t) + _split(spec.fleet.options, "fleet.options")
    where = f"point {m.name}/{r.name}/{t.name}"
    try:
        cfg = parse(args)
        if spec.fleet.texts is not None and cfg.compresses:  # the user's texts calibrate what compresses (the main command refuses --calib elsewhere)
            args += ["--calib", str(spec.fleet.texts)]
            cfg = parse(args)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    return FleetPoint(m.name, r.name, t.name, tuple(args), cfg, dict(t.labels), m.checkpoint)


def build_points(spec: FleetSpec, parse: OptionParser) -> list[FleetPoint]:
    """Every point of the matrix, each validated; a duplicate point (same RunConfig twice) is refused."""
    points = [_point(spec, m, r, t, parse) for m in spec.models for r in spec.recipes for t in spec.targets]
    seen: dict[str, str] = {}
    for p in points:
        canon = repr(sorted((k, v) for k, v in p.config.to_dict().items() if k != "out"))
        if canon in seen:
            raise ConfigError(f"points {seen[canon]} and {p.key} are the same run (duplicate point); drop one recipe, model or target")
        seen[canon] = p.key
    return points
