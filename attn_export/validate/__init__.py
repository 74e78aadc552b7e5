"""Validation against eager: accuracy metrics, tolerances, latency, the report schema and the gate.

Names are imported lazily (PEP 562): ``attn-export check`` needs the gate, the schema and
JUnit, not torch, which the latency helpers would pull in.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "ComparisonResult": "compare", "OutputComparison": "compare", "compare_outputs": "compare",
    "latency_from_samples": "latency", "set_threads": "latency", "time_runners": "latency",
    "accuracy": "metrics", "cosine": "metrics", "sqnr_db": "metrics",
    "Accuracy": "report", "Latency": "report", "Report": "report", "Stage": "report", "atomic_write_text": "report", "load_report": "report",
    "TOLERANCES": "tolerances", "Tolerance": "tolerances", "tolerance_for": "tolerances",
}  # fmt: skip
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"attn_export.validate.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'attn_export.validate' has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(__all__)
