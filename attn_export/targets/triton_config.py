"""What a Triton ``config.pbtxt`` for a TensorRT plan may promise, read from the engine's optimization profiles.

Why: Triton's TensorRT backend sends a request batch to a profile that holds it, and fails the
request at run time when none does; a ``max_batch_size`` above the engine's, or a fixed dim the
engine does not have, is a config that loads and then fails under load. So the limits come from
the profiles the engine was built with (its sidecar: ``runtime/tensorrt/sidecar.py``), and a
hand-written config is checked against them before anything is built or written.

* ``max_batch_size``: the largest batch every profile holds (the smallest max batch), since a
  full batch of long texts must still find a profile; each profile must take batch 1 too;
* dims (without the batch dim): a dim equal at min and max in every profile is that number,
  any other is -1;
* ``instance_group.profile``: every profile's index when there are several, so the backend
  chooses among all of them (Triton's model_config.proto: ``ModelInstanceGroup.profile`` lists
  the TensorRT optimization profiles an instance may use; triton-inference-server/server#919).

No TensorRT here, and tritonclient's protos are imported only where a config is parsed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attn_export.errors import ConfigError

__all__ = ["EngineLimits", "check_hand_config", "engine_limits", "read_hand_config"]

Profile = Mapping[str, Mapping[str, Sequence[int]]]  # input -> {"min": [...], "opt": [...], "max": [...]}


@dataclass(frozen=True)
class EngineLimits:
    """What the engine's profiles allow a Triton config to say."""

    max_batch: int
    dims: dict[str, tuple[int, ...]]  # input -> dims without the batch dim (-1: varies)
    profiles: int

    def describe(self) -> str:
        dims = ", ".join(f"{n} {list(d)}" for n, d in self.dims.items())
        return f"max batch {self.max_batch}, dims {dims}, {self.profiles} profile(s)"


def engine_limits(profiles: Sequence[Profile]) -> EngineLimits:
    """The Triton limits of an engine built with ``profiles`` (its sidecar's ``all_profiles()``)."""
    if not profiles:
        raise ConfigError("the engine has no optimization profile (all inputs static); Triton cannot batch it: use max_batch_size 0")
    names = list(profiles[0])
    if any(list(p) != names for p in profiles):
        raise ConfigError("the engine's optimization profiles name different inputs; rebuild it with attn-export")
    min_batch = max(int(p[n]["min"][0]) for p in profiles for n in names)
    if min_batch > 1:
        raise ConfigError(f"Triton sends batches from 1 up, but a profile's min batch is {min_batch}; rebuild with --min-shape 1xL")
    dims: dict[str, tuple[int, ...]] = {}
    for n in names:
        rank = len(profiles[0][n]["max"])
        fixed = [all(p[n]["min"][a] == p[n]["max"][a] == profiles[0][n]["max"][a] for p in profiles) for a in range(rank)]
        dims[n] = tuple(int(profiles[0][n]["max"][a]) if fixed[a] else -1 for a in range(1, rank))
    return EngineLimits(min(int(p[n]["max"][0]) for p in profiles for n in names), dims, len(profiles))


def read_hand_config(path: str | os.PathLike[str], flag: str = "--triton-config") -> Any:
    """A hand-written ``config.pbtxt`` parsed with tritonclient's ``ModelConfig`` (ConfigError in one line)."""
    from google.protobuf import text_format

    from attn_export.host.lazy import require

    mc = require("tritonclient.grpc.model_config_pb2", "tritonclient[grpc]", what="tritonclient (Triton config protos)")
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{flag} {p} does not exist; pass a Triton config.pbtxt")
    try:
        return text_format.Parse(p.read_text(encoding="utf-8"), mc.ModelConfig())
    except (text_format.ParseError, UnicodeDecodeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"{flag} {p} is not a Triton model config ({first}); write it in protobuf text format") from None


def check_hand_config(cfg: Any, limits: EngineLimits, flag: str = "--triton-config") -> None:
    """Refuse a hand config the engine cannot serve: a larger max batch, an input it lacks, a fixed dim it does not have."""
    if cfg.max_batch_size > limits.max_batch:
        raise ConfigError(
            f"{flag}: max_batch_size {cfg.max_batch_size} exceeds the engine's {limits.max_batch} (the largest batch its "
            f"optimization profiles hold); lower it or rebuild with a larger --max-shape"
        )
    for entry in cfg.input:
        if entry.name not in limits.dims:
            raise ConfigError(f"{flag}: input {entry.name!r} is not an engine input ({', '.join(limits.dims)}); use the engine's names")
        want = limits.dims[entry.name] if cfg.max_batch_size > 0 else None
        got = tuple(int(d) for d in entry.dims)
        if want is not None and (len(got) != len(want) or any(g != w and not (w == -1 and g == -1) for g, w in zip(got, want))):
            raise ConfigError(f"{flag}: input {entry.name!r} dims {list(got)} differ from the engine's {list(want)} (-1: varies); use the engine's")
