"""Default accuracy tolerances per precision, overridable per output (Polygraphy-style).

fp32: ONNX Runtime and PyTorch differ only by summation order (~1e-6); 1e-4 max abs leaves
room for long sequences. fp16: a 10-bit mantissa gives ~1e-3 relative error per op; with the
softmax and LayerNorm in fp32 a whole layer stays under 1e-2 relative L2. int8: measured by
direction (cosine) and relative L2, as absolute errors scale with activation range.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from attn_export.errors import ConfigError
from attn_export.validate.report import Accuracy

__all__ = ["Tolerance", "DEFAULT_TOLERANCES", "tolerance_for", "parse_tolerance_overrides"]


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
}


def tolerance_for(precision: str) -> Tolerance:
    if precision not in DEFAULT_TOLERANCES:
        raise ConfigError(f"no default tolerance for precision {precision!r}; expected {sorted(DEFAULT_TOLERANCES)}")
    return DEFAULT_TOLERANCES[precision]


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
