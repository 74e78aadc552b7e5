"""The one table of accuracy tolerances, for both kinds of subject, overridable per output.

Keys are what a stage is held to: ``fp32``, ``fp16``, ``int8``, ``lowrank`` (low-rank and
distilled students) and ``lowrank-int8`` (a low-rank student quantized: both errors add).

Layers (tensor outputs vs eager fp32): fp32: ONNX Runtime and PyTorch differ only by
summation order (~1e-6); 1e-4 max abs leaves room for long sequences. fp16: a 10-bit
mantissa gives ~1e-3 relative error per op; with the softmax and LayerNorm in fp32 a whole
layer stays under 1e-2 relative L2. int8: measured by direction (cosine) and relative L2, as
absolute errors scale with activation range. Low-rank is lossy by design: a layer whose
outputs keep cosine >= 0.99 is still usable.

Encoders (sentence embeddings vs eager fp32 on held-out text): mean cosine and top-1
nearest-neighbour agreement, the figures a retrieval user depends on (docs/encoder.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from attn_export.errors import ConfigError
from attn_export.validate.report import Accuracy

__all__ = ["DEFAULT_TOLERANCES", "ENCODER_TOLERANCES", "EncoderTolerance", "Tolerance", "encoder_tolerance_for", "parse_tolerance_overrides", "tolerance_for"]


@dataclass(frozen=True)
class Tolerance:
    """Bounds an ``Accuracy`` must meet; None = not checked."""

    max_abs: float | None = None
    rel_l2: float | None = None
    cosine_min: float | None = None

    def violations(self, acc: Accuracy) -> list[str]:
        """Human-readable reasons the accuracy fails this tolerance (empty = pass)."""
        out: list[str] = []
        if any(math.isnan(v) for v in (acc.max_abs, acc.rel_l2, acc.cosine)):
            return ["output contains NaN/Inf"]
        if self.max_abs is not None and acc.max_abs > self.max_abs:
            out.append(f"max_abs {acc.max_abs:.3g} > {self.max_abs:.3g}")
        if self.rel_l2 is not None and acc.rel_l2 > self.rel_l2:
            out.append(f"rel_l2 {acc.rel_l2:.3g} > {self.rel_l2:.3g}")
        if self.cosine_min is not None and acc.cosine < self.cosine_min:
            out.append(f"cosine {acc.cosine:.6f} < {self.cosine_min:.6f}")
        return out

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v is not None}


DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(max_abs=1e-4, rel_l2=1e-5),
    "fp16": Tolerance(rel_l2=1e-2, cosine_min=0.9995),
    "int8": Tolerance(rel_l2=5e-2, cosine_min=0.999),
    "lowrank": Tolerance(cosine_min=0.99),
    "lowrank-int8": Tolerance(cosine_min=0.99),
}


def tolerance_for(key: str) -> Tolerance:
    """The layer tolerance for ``key`` (a precision, ``lowrank`` or ``lowrank-int8``)."""
    if key not in DEFAULT_TOLERANCES:
        raise ConfigError(f"no default tolerance for {key!r}; expected one of {sorted(DEFAULT_TOLERANCES)}")
    return DEFAULT_TOLERANCES[key]


@dataclass(frozen=True)
class EncoderTolerance:
    """What an artifact's sentence embeddings must keep, vs eager fp32 on held-out texts."""

    min_mean_cosine: float
    min_top1_agreement: float = 0.95
    max_abs: float | None = None  # on the embedding values, for exact routes (fp32)

    def violations(self, agreement: dict[str, float], max_abs: float) -> list[str]:
        out = []
        if not agreement["mean_cosine"] >= self.min_mean_cosine:  # NaN fails too
            out.append(f"mean cosine {agreement['mean_cosine']:.6f} < {self.min_mean_cosine}")
        if not agreement["top1_neighbor_agreement"] >= self.min_top1_agreement:
            out.append(f"top-1 neighbour agreement {agreement['top1_neighbor_agreement']:.3f} < {self.min_top1_agreement}")
        if self.max_abs is not None and not max_abs <= self.max_abs:
            out.append(f"max_abs {max_abs:.3g} > {self.max_abs:.3g}")
        return out

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v is not None}


# fp32: summation order only. fp16 with fp32 islands: ~1e-3 relative per op. int8 and
# low-rank at 50% of Q/K: the acceptance bar of docs/encoder.md. Low-rank then int8: the two
# errors add, so the bar is their product (0.99 * 0.99).
ENCODER_TOLERANCES: dict[str, EncoderTolerance] = {
    "fp32": EncoderTolerance(0.99999, 0.95, max_abs=1e-4),
    "fp16": EncoderTolerance(0.999, 0.95),
    "int8": EncoderTolerance(0.99, 0.95),
    "lowrank": EncoderTolerance(0.99, 0.95),
    "lowrank-int8": EncoderTolerance(0.98, 0.9),
}


def encoder_tolerance_for(key: str) -> EncoderTolerance:
    """The sentence-embedding tolerance for ``key`` (same keys as ``tolerance_for``)."""
    if key not in ENCODER_TOLERANCES:
        raise ConfigError(f"no encoder tolerance for {key!r}; expected one of {sorted(ENCODER_TOLERANCES)}")
    return ENCODER_TOLERANCES[key]


def parse_tolerance_overrides(specs: list[str] | None, field: str = "max_abs") -> dict[str, float]:
    """Parse ``["1e-4", "y:1e-3"]`` into {"": 1e-4, "y": 1e-3} (empty key = every output)."""
    out: dict[str, float] = {}
    for spec in specs or []:
        name, _, value = spec.rpartition(":")
        try:
            out[name] = float(value)
        except ValueError:
            raise ConfigError(f"expected --{field.replace('_', '-')} VALUE or OUTPUT:VALUE, got {spec!r}") from None
    return out
