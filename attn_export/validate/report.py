"""``report.json``: the schema every pipeline stage writes into.

The report is a list of *stages*, one per artifact (the fp32 ONNX model, an int8 model,
a TensorRT engine...). Each stage carries the same fields, so tools that read reports
(the CI gate, plots, the sweep) never special-case a stage. Fields that a later stage
needs beyond these go in ``details``; new top-level keys are allowed, and readers must
ignore keys they do not know (``SCHEMA_VERSION`` bumps only on incompatible changes).
``report.json`` is one model: ``Report.write`` validates what it writes with the pydantic
schema every reader uses (``attn_export.validate.schema``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attn_export.validate.schema import REPORT_SCHEMA_VERSION

__all__ = ["Accuracy", "Latency", "Stage", "Report", "atomic_write_text", "load_report"]


@dataclass
class Accuracy:
    """Error of an artifact's output against the eager fp32 reference on the same inputs."""

    max_abs: float
    mean_abs: float
    rel_l2: float
    cosine: float
    sqnr_db: float


@dataclass
class Latency:
    """Latency percentiles in milliseconds over timed repeats after warm-up."""

    p50: float
    p90: float
    p99: float
    mean: float = 0.0
    repeats: int = 0
    throughput_per_s: float = 0.0  # samples (batch items) per second at p50
    cpu_p50: float | None = None  # process CPU time per call, ms (p50): tells a slow variant from a starved one


@dataclass
class Stage:
    """One artifact compared against eager."""

    name: str
    artifact: str | None
    precision: str
    accuracy: Accuracy | None = None
    latency_ms: dict[str, Latency] = field(default_factory=dict)  # keys: "artifact", "eager"
    speedup_vs_eager: float | None = None
    size_bytes: int | None = None
    params: int | None = None
    passed: bool | None = None  # accuracy within the stage's tolerance
    tolerance: dict[str, float] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    """The whole run: what model, which inputs, and one ``Stage`` per artifact."""

    model: dict[str, Any]
    inputs: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    stages: list[Stage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    selection: dict[str, Any] = field(default_factory=dict)  # e.g. {"int8": {"route": ..., "tried": [...]}}
    verdict: dict[str, Any] = field(default_factory=dict)  # {"passed": bool, "failures": [why, ...]}
    time_to_ship: dict[str, Any] = field(default_factory=dict)  # pipeline.stage_clock: each phase's wall and CPU seconds
    schema_version: int = REPORT_SCHEMA_VERSION

    def add(self, stage: Stage) -> Stage:
        self.stages.append(stage)
        return stage

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage named {name!r}; stages: {[s.name for s in self.stages]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "model": self.model,
            "inputs": self.inputs,
            "environment": self.environment,
            "stages": [s.to_dict() for s in self.stages],
            "notes": self.notes,
            "selection": self.selection,
            "verdict": self.verdict,
            **({"time_to_ship": self.time_to_ship} if self.time_to_ship else {}),
        }

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write report.json atomically, after validating it with the same schema every reader uses."""
        from attn_export.validate.schema import validate_report

        text = json.dumps(self.to_dict(), indent=2, default=_json_default) + "\n"
        validate_report(json.loads(text), str(path))
        return atomic_write_text(path, text)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write via a temporary file in the same folder, then rename: no half-written files."""
    from attn_export.outdir.atomic import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a report.json as a plain dict, validated by ``attn_export.validate.schema.ReportSchema``.

    Known keys are type-checked (one-line ``DataError`` naming the file and field), unknown
    keys are kept and ignored. NaN accuracy figures (a stage whose output was not finite) are
    accepted here so the report can be rendered; the gate refuses them.
    """
    from attn_export.validate.schema import read_json, validate_report

    data = read_json(path, "an attn-export report.json", "run attn-export first or pass the right path")
    validate_report(data, str(path))
    return data
