"""Compare runner outputs against a reference: results are objects with ``__bool__`` and ``__str__``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from attn_export.errors import ToleranceError
from attn_export.validate.metrics import accuracy
from attn_export.validate.report import Accuracy
from attn_export.validate.tolerances import Tolerance

__all__ = ["OutputComparison", "ComparisonResult", "compare_outputs"]


@dataclass
class OutputComparison:
    name: str
    accuracy: Accuracy
    tolerance: Tolerance
    violations: list[str]
    worst_index: tuple[int, ...] = ()
    worst_values: tuple[float, float] = (0.0, 0.0)  # (reference, candidate) at worst_index

    def __bool__(self) -> bool:
        return not self.violations

    def __str__(self) -> str:
        a = self.accuracy
        status = "PASS" if self else "FAIL (" + "; ".join(self.violations) + ")"
        where = ""
        if self.worst_index:
            where = f", worst at {list(self.worst_index)}: ref={self.worst_values[0]:.6g} got={self.worst_values[1]:.6g}"
        return (
            f"{self.name}: {status} max_abs={a.max_abs:.3g} mean_abs={a.mean_abs:.3g} rel_l2={a.rel_l2:.3g} "
            f"cosine={a.cosine:.6f} sqnr={a.sqnr_db:.1f}dB{where}"
        )


@dataclass
class ComparisonResult:
    outputs: list[OutputComparison] = field(default_factory=list)

    def __bool__(self) -> bool:
        return all(bool(o) for o in self.outputs)

    def __str__(self) -> str:
        return "\n".join(str(o) for o in self.outputs)

    def __getitem__(self, name: str) -> OutputComparison:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(name)

    def raise_if_failed(self) -> None:
        if not self:
            failed = [o for o in self.outputs if not o]
            raise ToleranceError("; ".join(str(o) for o in failed))


def compare_outputs(
    reference: Mapping[str, np.ndarray],
    candidate: Mapping[str, np.ndarray],
    tolerance: Tolerance | Mapping[str, Tolerance],
) -> ComparisonResult:
    """Compare every reference output present in ``candidate`` (matched by name, else by order)."""
    result = ComparisonResult()
    cand_items = list(candidate.items())
    for i, (name, ref) in enumerate(reference.items()):
        out = candidate[name] if name in candidate else cand_items[i][1]
        tol = tolerance if isinstance(tolerance, Tolerance) else tolerance.get(name, tolerance.get("", Tolerance()))
        ref64 = np.asarray(ref, dtype=np.float64)
        out64 = np.asarray(out, dtype=np.float64)
        acc = accuracy(ref64, out64)
        worst: tuple[int, ...] = ()
        values = (0.0, 0.0)
        if ref64.shape == out64.shape and ref64.size:
            diff = np.abs(ref64 - out64)
            diff = np.where(np.isfinite(diff), diff, np.inf)
            worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
            values = (float(ref64[worst]), float(out64[worst]))
        result.outputs.append(OutputComparison(name, acc, tol, tol.violations(acc), worst, values))
    return result
