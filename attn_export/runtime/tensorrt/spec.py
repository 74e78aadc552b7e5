"""Engine build options and how each TensorRT version expresses them, without TensorRT.

Everything here is pure Python so it can be tested on machines without a GPU: parsing
``--min-shape 1x16`` into a ``ShapeProfile``, validating an ``EngineSpec``, and mapping a
spec to builder flags for a TensorRT version (flags on 10.x, strong typing on 11, where
``BuilderFlag.FP16/INT8`` no longer exist).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from attn_export.errors import ConfigError
from attn_export.targets.length_buckets import bucket_profiles, check_sort_window
from attn_export.targets.shape_profile import ShapeProfile, parse_shape  # re-exported: checks/ read it too, from below runtime
from attn_export.targets.trt_releases import TrtVersion, parse_trt_version  # re-exported: the data lives in targets/
from attn_export.vocab.precisions import PRECISIONS, get_precision

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
    length_buckets: tuple[int, ...] | None = None  # one optimization profile per bucket (targets/length_buckets.py); None: one profile
    sort_window: int | None = None  # texts the runner may sort by length before cutting batches; None = the batch itself

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
        check_sort_window(self.sort_window)
        if self.length_buckets:
            self.optimization_profiles  # noqa: B018 - validates the buckets against the profile now, not at build time
        if self.dla_core is not None:
            if self.length_buckets:
                raise ConfigError("DLA needs one static shape, got --length-buckets; leave the buckets out with --dla-core")
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

    @property
    def optimization_profiles(self) -> tuple[ShapeProfile, ...]:
        """The profiles the builder adds, in order: one per length bucket, else ``profiles`` alone (none without one)."""
        if self.profiles is None:
            return ()
        return bucket_profiles(self.profiles, self.length_buckets)
