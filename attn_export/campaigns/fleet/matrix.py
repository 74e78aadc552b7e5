"""The matrix: models x recipes x targets -> one ``FleetPoint`` (a validated ``RunConfig``) each.

Each point is exactly the main command with the model's, the recipe's, the target's and the shared
options; the options are parsed by the main command's own parser (passed in by the CLI, which owns
it), so an unknown option or value is refused as ``attn-export`` would refuse it.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attn_export.campaigns.fleet.inputs import InputDigests
from attn_export.campaigns.fleet.schema import FleetSpec, ModelSpec, RecipeSpec, TargetSpec, resolve_path
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
    inputs: str = ""  # sha256 of the content of every file it reads (inputs.InputDigests)

    @property
    def key(self) -> str:
        return f"{self.model}/{self.recipe}/{self.target}"

    @property
    def cache_key(self) -> str:
        """The key of its cache entry: its canonical RunConfig, the content of its inputs, the versions, its GPU."""
        from attn_export.campaigns.fleet.cache import point_key

        return point_key(self.config.to_dict(), self.inputs, self.labels.get("sm"))

    @property
    def command(self) -> str:
        return shlex.join(["attn-export", *self.args])


# Options that name an input: a relative path in the fleet file is relative to the file, as everywhere in it.
_INPUT_FLAGS = ("--checkpoint", "--calib", "--triton-config")
# Options a point cannot take: a point writes its folder into the cache and fleet-out, and a cache hit runs nothing,
# so a path of its own would be written by every point of the recipe, or (on a hit) not at all.
_REFUSED_FLAGS = ("--out", "--bundle", "--triton")


def _split(text: str, where: str, base: Path) -> list[str]:
    try:
        args = shlex.split(text)
    except ValueError as e:
        raise ConfigError(f"{where}: options {text!r} do not parse as a command line ({e}); quote them as a shell would") from None
    for i, arg in enumerate(args):
        flag = arg.split("=", 1)[0]
        if flag in _REFUSED_FLAGS:
            raise ConfigError(f"{where}: {flag} is not a fleet option (every point writes fleet-out/points/<model>/"
                              f"<recipe>/<target>/, and a cached point runs nothing); drop it, and run the point's "
                              f"command from fleet.json with {flag} DIR")  # fmt: skip
        if flag in _INPUT_FLAGS:
            if "=" in arg:
                args[i] = f"{flag}={_input_path(flag, arg.split('=', 1)[1], base)}"
            elif i + 1 < len(args):
                args[i + 1] = _input_path(flag, args[i + 1], base)
    return args


def _input_path(flag: str, value: str, base: Path) -> str:
    bare = "/" not in value and not value.startswith(".")
    if flag == "--checkpoint" and bare and not Path(resolve_path(value, base)).exists():
        return value  # a shipped name (minilm)
    return resolve_path(value, base)


def _target_args(t: TargetSpec) -> list[str]:
    args = ["--target", t.target]
    if t.trt:
        args += ["--trt-version", t.trt]
    if t.gpu_arch:
        args += ["--gpu-arch", t.gpu_arch]
    return args


def _point(spec: FleetSpec, m: ModelSpec, r: RecipeSpec, t: TargetSpec, parse: OptionParser,
           digests: InputDigests) -> FleetPoint:  # fmt: skip
    args = (["--checkpoint", m.checkpoint] if m.checkpoint else []) + _split(m.options, f"model {m.name}", spec.base)
    args += _split(r.options, f"recipe {r.name}", spec.base) + _target_args(t)
    args += _split(spec.fleet.options, "fleet.options", spec.base)
    where = f"point {m.name}/{r.name}/{t.name}"
    try:
        cfg = parse(args)
        if spec.fleet.texts is not None and cfg.compresses:  # the user's texts calibrate what compresses (the main command refuses --calib elsewhere)
            args += ["--calib", str(spec.fleet.texts)]
            cfg = parse(args)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    return FleetPoint(m.name, r.name, t.name, tuple(args), cfg, dict(t.labels), digests.point(cfg, where))


def build_points(spec: FleetSpec, parse: OptionParser) -> list[FleetPoint]:
    """Every point of the matrix, each validated and its inputs checked and hashed; a duplicate point is refused."""
    if spec.fleet.texts is not None:  # named, so checked, even where no point compresses (a typo shows now, not later)
        from attn_export.host.paths import check_input_file

        check_input_file(spec.fleet.texts, "fleet.texts", allow_dir=True)
    digests = InputDigests()
    points = [_point(spec, m, r, t, parse, digests) for m in spec.models for r in spec.recipes for t in spec.targets]
    seen: dict[str, str] = {}
    for p in points:
        canon = repr(sorted((k, v) for k, v in p.config.to_dict().items() if k != "out"))
        if canon in seen:
            raise ConfigError(f"points {seen[canon]} and {p.key} are the same run (duplicate point); drop one recipe, model or target")
        seen[canon] = p.key
    return points
