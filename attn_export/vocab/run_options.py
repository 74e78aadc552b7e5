"""``RunOptions``: what the readers of a run's options may rely on (``config.RunConfig`` provides it).

A Protocol, so the modules ``RunConfig`` itself consults while it validates (the subject kinds,
the resource estimate, the compression methods) can name the type without importing
``config`` back: no import cycle, and the contract between them is written down in one place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

__all__ = ["RunOptions"]


class RunOptions(Protocol):
    """The options, and the subject-resolved values, that kinds, resources and methods read."""

    # the subject
    checkpoint: str | None
    layers: str | None
    pooling: str | None
    prompt: str | None
    encoder_form: str | None
    calib: Path | None
    seq_len: int
    batch: int
    precision: str
    validation_batches: int
    # compression
    low_rank: float | None
    low_rank_method: str
    distill: int | None
    quantize: str | None
    int8_mode: str
    with_torchao: bool
    int8_fallback: str | int
    int8_qat: int | None
    int8_qat_scales: str
    calib_method: str | None
    smoothquant: float | str | None
    gpu_arch: str | None
    # judging
    tolerance_overrides: dict[str, dict[str, float]] | None

    @property
    def kind(self) -> Any: ...  # subjects.kinds.SubjectKind
    @property
    def compresses(self) -> bool: ...
    @property
    def resolved_layer(self) -> str: ...
    @property
    def resolved_mask(self) -> str: ...
    @property
    def resolved_d_model(self) -> int: ...
    @property
    def resolved_heads(self) -> int: ...
    @property
    def resolved_layers(self) -> str: ...
    @property
    def resolved_max_len(self) -> int: ...
    @property
    def resolved_low_rank_targets(self) -> tuple[str, ...]: ...
    @property
    def resolved_calib_method(self) -> str: ...
    @property
    def resolved_smoothquant(self) -> float | str | None: ...
    @property
    def resolved_trt_version(self) -> str | None: ...
    @property
    def resolved_gpu_arch(self) -> str | None: ...
