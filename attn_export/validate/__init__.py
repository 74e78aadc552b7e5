"""Validation against eager: accuracy metrics, tolerances, latency and the report schema."""

from attn_export.validate.compare import (
    ComparisonResult,
    OutputComparison,
    compare_outputs,
)
from attn_export.validate.latency import (
    latency_from_samples,
    set_threads,
    time_callable,
    time_runners,
)
from attn_export.validate.metrics import accuracy, cosine, sqnr_db
from attn_export.validate.report import (
    Accuracy,
    Latency,
    Report,
    Stage,
    atomic_write_text,
    load_report,
)
from attn_export.validate.tolerances import DEFAULT_TOLERANCES, Tolerance, tolerance_for

__all__ = [
    "Accuracy",
    "ComparisonResult",
    "DEFAULT_TOLERANCES",
    "Latency",
    "OutputComparison",
    "Report",
    "Stage",
    "Tolerance",
    "accuracy",
    "atomic_write_text",
    "compare_outputs",
    "cosine",
    "latency_from_samples",
    "load_report",
    "set_threads",
    "sqnr_db",
    "time_callable",
    "time_runners",
    "tolerance_for",
]
