"""Engine build options and how each TensorRT version expresses them, without TensorRT.

Everything here is pure Python so it can be tested on machines without a GPU: parsing
``--min-shape 1x16`` into a ``ShapeProfile``, validating an ``EngineSpec``, and mapping a
spec to builder flags for a TensorRT version (flags on 10.x, strong typing on 11, where
``BuilderFlag.FP16/INT8`` no longer exist).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Sequence

from attn_export.errors import ConfigError
from attn_export.targets.trt_releases import TrtVersion, parse_trt_version  # re-exported: the data lives in targets/
from attn_export.vocabulary import PRECISIONS, get_precision

__all__ = [
    "DLA_RELEASES",
    "dla_supported",
    "EngineSpec",
    "HARDWARE_COMPATIBILITY",
    "ShapeProfile",
    "TrtVersion",
    "parse_shape",
    "parse_trt_version",
]

log = logging.getLogger(__name__)

# our spelling -> (trt.HardwareCompatibilityLevel member, trtexec spelling)
HARDWARE_COMPATIBILITY: dict[str, tuple[str, str]] = {
    "none": ("NONE", "none"),
    "ampere+": ("AMPERE_PLUS", "ampere+"),
    "same-compute-capability": ("SAME_COMPUTE_CAPABILITY", "sameComputeCapability"),
}
ENGINE_PRECISIONS: tuple[str, ...] = tuple(PRECISIONS)  # every precision of the vocabulary builds an engine


def dla_supported(version: TrtVersion) -> bool:
    """Whether TensorRT ``version`` ships DLA at all.

    NVIDIA's 10.x -> 11.x Jetson migration guide (11.3.0 and 11.4.1 editions): "TensorRT 10.7
    was the last release that supported DLA", "DLA was unavailable in TensorRT 11.0 through
    11.3", and 11.4.1 restores it on Jetson AGX Orin with JetPack 7.2.2 or later (11.4.0 only
    on Windows on ARM).
    """
    return version <= TrtVersion(10, 7) or version >= TrtVersion(11, 4)


DLA_RELEASES = "TensorRT 10.0-10.7 (JetPack 6 ships 10.3) or 11.4+ (JetPack 7.2.2 on Jetson AGX Orin)"


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


@dataclass(frozen=True)
class EngineSpec:
    """How to build a TensorRT engine (``build_engine(onnx, engine, EngineSpec(...))``).

    ``strongly_typed=None`` decides by version and graph: always on TensorRT 11, and on
    10.x when the precision already lives in the graph (fp16 weights).
    """

    precision: str = "fp16"
    profiles: ShapeProfile | None = None
    workspace_bytes: int | None = None
    timing_cache: str | None = None
    hardware_compatibility: str = "none"
    version_compatible: bool = False
    optimization_level: int = 3
    dla_core: int | None = None
    gpu_fallback: bool = True
    strongly_typed: bool | None = None
    gpu_arch: str | None = None  # the GPU the engine is built for (targets/gpu_arch.py): a precision it lacks is refused

    def __post_init__(self) -> None:
        get_precision(self.precision, what="engine precision", choices=ENGINE_PRECISIONS)
        if self.hardware_compatibility not in HARDWARE_COMPATIBILITY:
            raise ConfigError(
                f"expected --hardware-compatibility in {', '.join(HARDWARE_COMPATIBILITY)}, got {self.hardware_compatibility!r}"
            )
        if not 0 <= self.optimization_level <= 5:
            raise ConfigError(f"expected --builder-optimization-level between 0 and 5, got {self.optimization_level}")
        if self.workspace_bytes is not None and self.workspace_bytes < 1 << 20:
            raise ConfigError(f"expected --workspace of at least 1 MiB, got {self.workspace_bytes} bytes")
        if self.dla_core is not None:
            if self.dla_core < 0:
                raise ConfigError(f"expected --dla-core >= 0, got {self.dla_core}")
            if not self.gpu_fallback:
                raise ConfigError("DLA cannot run attention (MatMul/Softmax on activations); keep --gpu-fallback with --dla-core")
            if self.precision == "fp32":
                raise ConfigError("DLA runs fp16 or int8 only, got --precision fp32; use --precision fp16 with --dla-core")
            if self.profiles is not None and not self.profiles.is_static:
                raise ConfigError(f"DLA needs static shapes, got {self.profiles}; pass one shape as min = opt = max")
            if self.hardware_compatibility != "none":
                raise ConfigError("hardware compatibility levels are not supported with DLA (Jetson); use --hardware-compatibility none")
