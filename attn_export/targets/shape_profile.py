"""A TensorRT optimization profile over (batch, seq), parsed from the CLI and bounded, without TensorRT.

Why here, below both ``checks/`` and ``runtime/``: the compatibility checks read the profile an
engine will cover before ``runtime/tensorrt/build.py`` runs them, so the profile is a fact of the
deployment target, not of the runtime that builds it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from attn_export.errors import ConfigError

__all__ = ["MAX_PROFILE_BATCH", "MAX_PROFILE_SEQ", "ShapeProfile", "parse_shape"]

# Bounds of a profile's batch and sequence length. TensorRT's dims are int64 (nvinfer1::Dims64),
# but a builder sizes every activation for the max shape, so far less is sensible: these are
# 16x the main command's own largest profile (4 x --batch 4096, 4 x --seq-len 65536).
MAX_PROFILE_BATCH = 262_144
MAX_PROFILE_SEQ = 4_194_304


def parse_shape(text: str, what: str = "--opt-shape") -> tuple[int, int]:
    """'8x128' -> (8, 128): batch x sequence length, both positive and within the profile bounds."""
    m = re.fullmatch(r"\s*(\d{1,30})\s*[xX,]\s*(\d{1,30})\s*", str(text))  # 30 digits: past int64, short of int()'s limit
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ConfigError(f"expected {what} as BATCHxSEQ with positive numbers (e.g. 8x128), got {text!r}")
    shape = int(m.group(1)), int(m.group(2))
    _check_bounds(shape, what)
    return shape


def _check_bounds(shape: tuple[int, int], what: str) -> None:
    batch, seq = shape
    if batch > MAX_PROFILE_BATCH or seq > MAX_PROFILE_SEQ:
        beyond = " (beyond int64, TensorRT's dimension type)" if max(batch, seq) > 2**63 - 1 else ""
        raise ConfigError(
            f"expected {what} with batch <= {MAX_PROFILE_BATCH} and sequence length <= {MAX_PROFILE_SEQ}, got "
            f"{batch}x{seq}{beyond}; TensorRT sizes the engine's buffers for the max shape"
        )


@dataclass(frozen=True)
class ShapeProfile:
    """One optimization profile over (batch, seq); other dims come from the model."""

    min: tuple[int, int]
    opt: tuple[int, int]
    max: tuple[int, int]

    def __post_init__(self) -> None:
        for which, shape in (("min", self.min), ("opt", self.opt), ("max", self.max)):
            if len(shape) != 2 or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
                raise ConfigError(f"expected the {which} shape as two positive integers (batch, seq), got {shape!r}")
            _check_bounds(shape, f"the {which} shape")
        for lo, hi, axis in ((self.min, self.opt, 0), (self.opt, self.max, 0), (self.min, self.opt, 1), (self.opt, self.max, 1)):
            if lo[axis] > hi[axis]:
                raise ConfigError(
                    f"expected --min-shape <= --opt-shape <= --max-shape, got min {_fmt(self.min)}, "
                    f"opt {_fmt(self.opt)}, max {_fmt(self.max)}"
                )

    @classmethod
    def parse(cls, min_shape: str | None, opt_shape: str | None, max_shape: str | None) -> "ShapeProfile | None":
        """From CLI strings; any missing one takes the opt shape (all missing -> None)."""
        given = [s for s in (min_shape, opt_shape, max_shape) if s]
        if not given:
            return None
        parsed = {flag: parse_shape(text, flag) for flag, text in (("--min-shape", min_shape), ("--opt-shape", opt_shape), ("--max-shape", max_shape)) if text}
        opt = parsed.get("--opt-shape") or parsed.get("--max-shape") or parsed["--min-shape"]
        return cls(parsed.get("--min-shape", opt), opt, parsed.get("--max-shape", opt))

    @property
    def is_static(self) -> bool:
        return self.min == self.opt == self.max

    def shapes_for(self, name: str, dims: Sequence[int | str | None]) -> tuple[tuple[int, ...], ...]:
        """(min, opt, max) full shapes for an input whose dims 0/1 are batch/seq.

        Static dims are kept; a static batch or seq that the profile contradicts is an error.
        """
        out: list[tuple[int, ...]] = []
        for which, bs in (("min", self.min), ("opt", self.opt), ("max", self.max)):
            shape: list[int] = []
            for axis, d in enumerate(dims):
                if axis < 2:
                    want = bs[axis]
                    if isinstance(d, int) and d > 0 and d != want:
                        raise ConfigError(
                            f"input {name!r} has a static {('batch', 'seq')[axis]} of {d}, but the {which} "
                            f"shape asks for {want}; export with dynamic axes or use {d} in the profile"
                        )
                    shape.append(want)
                elif isinstance(d, int) and d > 0:
                    shape.append(d)
                else:
                    raise ConfigError(
                        f"input {name!r} has a dynamic dim {axis} ({d!r}); a (batch, seq) profile can only "
                        f"set dims 0 and 1; export with that dim static"
                    )
            out.append(tuple(shape))
        return tuple(out)

    def to_dict(self) -> dict[str, list[int]]:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}

    def __str__(self) -> str:
        return f"min {_fmt(self.min)}, opt {_fmt(self.opt)}, max {_fmt(self.max)}"


def _fmt(bs: tuple[int, int]) -> str:
    return f"{bs[0]}x{bs[1]}"
