"""Schemas (pydantic v2) for every JSON file the toolkit reads: report.json, baselines, bench
results, and sweep.json (run.json: ``attn_export.outdir.manifest``; a checkpoint's own files: ``checkpoint_schema``).

Why a schema library and not ``dict.get``: each of these files is user-supplied, and hand-written
checks had gaps that turned into tracebacks ("high" where a number belongs) or silent wrong
results (``cosine: Infinity`` passing the gate, ``num_attention_heads: true`` running a 1-head
model, ``hidden_size: 1.2e9`` growing until the OS stopped it). Here every known key is
type-checked in strict mode (no "1" -> 1, no true -> 1), numbers must be finite where a number
is required, sizes are bounded *before* anything is allocated, and unknown keys are ignored so
that older readers tolerate newer writers. A failure is one line,
``"<file>: <field>: expected X, got Y; <fix>"``, raised as the caller's error class.

Non-finite accuracy metrics: a stage whose output went NaN is *reported* with NaN metrics (so
the report and its render show it), but the gate refuses such a report (``finite=True``);
+-inf and negative error magnitudes are never valid.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo
from pydantic_core import PydanticCustomError

from attn_export.errors import AttnExportError, DataError
from attn_export.outdir.manifest import Sha256  # one pattern for a sha256, in reports and in run.json
from attn_export.validate.schema_messages import one_line, show

__all__ = [
    "BASELINE_FORMAT_V1",
    "BASELINE_FORMAT_V2",
    "METRIC_DIRECTIONS",
    "BaselineV1",
    "BaselineV2",
    "BenchSchema",
    "ReportSchema",
    "SCHEMA_VERSIONS",
    "SweepSchema",
    "read_json",
    "validate",
    "validate_baseline",
    "validate_report",
    "validate_sweep",
]

# The one convention of every file attn-export writes: an integer ``schema_version`` per kind of
# file, bumped only on an incompatible change (readers ignore keys they do not know).
SCHEMA_VERSIONS: dict[str, int] = {"report": 1, "sweep": 1, "bench": 1}
REPORT_SCHEMA_VERSION = SCHEMA_VERSIONS["report"]
BASELINE_FORMAT_V1 = "attn-export-baseline/1"
BASELINE_FORMAT_V2 = "attn-export-baseline/2"
# "higher": bigger is better, may drop by the slack; "lower": smaller is better, may grow by it.
METRIC_DIRECTIONS: dict[str, str] = {
    "cosine": "higher", "sqnr_db": "higher", "rel_l2": "lower", "max_abs": "lower", "mean_abs": "lower",
}  # fmt: skip

M = TypeVar("M", bound=BaseModel)


def expected_error(what: str, got: str | None = None) -> PydanticCustomError:
    """A validation failure whose message is the "expected X" part (``got`` overrides the input shown)."""
    return PydanticCustomError("expected", "{what}", {"what": what} if got is None else {"what": what, "got": got})


# --- number types -------------------------------------------------------------------------------
def finite_number(v: float) -> float:
    if not math.isfinite(v):
        raise expected_error("a finite number")
    return v


Finite = Annotated[float, AfterValidator(finite_number)]
NonNegFinite = Annotated[float, AfterValidator(finite_number), Field(ge=0.0)]
PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]


def _metric(lo: float, hi: float) -> AfterValidator:
    """A reported accuracy figure: NaN allowed unless validating for the gate; +-inf never."""

    def check(v: float, info: ValidationInfo) -> float:
        if math.isnan(v):
            if (info.context or {}).get("finite"):
                raise expected_error("a finite number (the stage's output was not finite)")
            return v
        if math.isinf(v):
            raise expected_error("a finite number")
        if not lo <= v <= hi:
            raise expected_error(f"a number >= {lo:g}" if math.isinf(hi) else f"a number in [{lo:g}, {hi:g}]")
        return v

    return AfterValidator(check)


_COSINE_EPS = 1e-6  # float64 rounding can put identical outputs at 1.0000000000000002


class StrictSchema(BaseModel):
    """Strict types; unknown keys ignored (readers must tolerate keys added by newer writers)."""

    model_config = ConfigDict(strict=True, extra="ignore")


class _Closed(StrictSchema):
    """Small hand-edited objects: an unknown key is a typo, so it is refused."""

    model_config = ConfigDict(strict=True, extra="forbid")


# --- report.json ----------------------------------------------------------------------------------
class AccuracySchema(StrictSchema):
    max_abs: Annotated[float, _metric(0.0, math.inf)] | None = None
    mean_abs: Annotated[float, _metric(0.0, math.inf)] | None = None
    rel_l2: Annotated[float, _metric(0.0, math.inf)] | None = None
    cosine: Annotated[float, _metric(-1.0 - _COSINE_EPS, 1.0 + _COSINE_EPS)] | None = None
    sqnr_db: Annotated[float, _metric(-math.inf, math.inf)] | None = None


class LatencySchema(StrictSchema):
    p50: NonNegFinite | None = None
    p90: NonNegFinite | None = None
    p99: NonNegFinite | None = None
    mean: NonNegFinite | None = None
    repeats: NonNegInt | None = None
    throughput_per_s: NonNegFinite | None = None
    cpu_p50: NonNegFinite | None = None




class _ArtifactHash(StrictSchema):
    """The part of ``details`` (or of a selection entry) the gate reads: the artifact's sha256."""

    sha256: Sha256 | None = None


def _artifact_hash(value: dict[str, Any]) -> dict[str, Any]:
    if "sha256" in value:  # attn_export.outdir.claim stamps it; ``check`` compares it with the file
        _ArtifactHash.model_validate({"sha256": value["sha256"]}, strict=True)
    return value


class StageSchema(StrictSchema):
    name: Annotated[str, Field(min_length=1)]
    artifact: str | None = None
    precision: str = "fp32"
    accuracy: AccuracySchema | None = None
    latency_ms: dict[str, LatencySchema] = Field(default_factory=dict)
    speedup_vs_eager: NonNegFinite | None = None
    size_bytes: NonNegInt | None = None
    params: NonNegInt | None = None
    passed: bool | None = None
    tolerance: dict[str, Finite | None] | None = None
    details: Annotated[dict[str, Any], AfterValidator(_artifact_hash)] = Field(default_factory=dict)


def _unique_names(stages: list[StageSchema]) -> list[StageSchema]:
    seen: set[str] = set()
    for s in stages:
        if s.name in seen:
            raise expected_error("unique stage names", got=f"{s.name!r} twice")
        seen.add(s.name)
    return stages


class ModelSchema(StrictSchema):
    """What was run; a reference layer's shape is bounded because ``report`` rebuilds it."""

    layer: str | None = None
    d_model: Annotated[int, Field(ge=1, le=65536)] | None = None
    heads: Annotated[int, Field(ge=1, le=1024)] | None = None
    mask: str | None = None
    params: NonNegInt | None = None


class TimedOnSchema(StrictSchema):
    """One input every stage was timed on (``inputs.timed_on``; the first decides the selections)."""

    label: Annotated[str, Field(min_length=1, max_length=64)]
    batch: PosInt
    padding_fraction: Annotated[float, Field(ge=0.0, le=1.0)] | None = None


class InputsSchema(StrictSchema):
    batch: PosInt | None = None
    seq_len: PosInt | None = None
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    timed_on: Annotated[list[TimedOnSchema], Field(max_length=64)] | None = None


class CpuSchema(StrictSchema):
    """``environment["cpu"]``: the instruction-set class int8 accuracy depends on."""

    isa_class: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_.-]*$")] | None = None
    u8s8_saturates: bool | None = None
    flags: list[str] = Field(default_factory=list)


class EnvironmentSchema(StrictSchema):
    cpu: CpuSchema | None = None


class PhaseTimeSchema(StrictSchema):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    kind: Literal["subject", "build", "timing", "judging", "deploy", "render"]
    wall_s: NonNegFinite
    cpu_s: NonNegFinite


class TimeToShipSchema(StrictSchema):
    """pipeline.stage_clock: where a run's time went, phase by phase."""

    phases: list[PhaseTimeSchema] = Field(default_factory=list)
    wall_s: NonNegFinite = 0.0
    cpu_s: NonNegFinite = 0.0


class ReportSchema(StrictSchema):
    schema_version: Annotated[int, Field(ge=1, le=REPORT_SCHEMA_VERSION)] = REPORT_SCHEMA_VERSION
    model: ModelSchema = Field(default_factory=ModelSchema)
    inputs: InputsSchema = Field(default_factory=InputsSchema)
    environment: EnvironmentSchema = Field(default_factory=EnvironmentSchema)
    stages: Annotated[list[StageSchema], AfterValidator(_unique_names)]
    notes: list[str] = Field(default_factory=list)
    selection: dict[str, Any] = Field(default_factory=dict)
    time_to_ship: TimeToShipSchema | None = None


# --- baselines ------------------------------------------------------------------------------------
MetricName = Literal["cosine", "sqnr_db", "rel_l2", "max_abs", "mean_abs"]


class SlackSchema(_Closed):
    """slack = abs + rel * |baseline value|; finite and >= 0 (an infinite slack checks nothing)."""

    abs: NonNegFinite = 0.0
    rel: NonNegFinite = 0.0


class MetricSpecSchema(SlackSchema):
    value: Finite
    direction: Literal["higher", "lower"] | None = None


def _directions(metrics: Mapping[str, MetricSpecSchema]) -> Mapping[str, MetricSpecSchema]:
    for name, spec in metrics.items():
        if spec.direction is None:
            spec.direction = METRIC_DIRECTIONS[name]  # type: ignore[assignment]
        elif spec.direction != METRIC_DIRECTIONS[name]:
            raise expected_error(f"direction {METRIC_DIRECTIONS[name]!r} for {name}", got=repr(spec.direction))
    return metrics


class BaselineStageSchema(StrictSchema):
    precision: str = "fp32"
    metrics: Annotated[dict[MetricName, MetricSpecSchema], AfterValidator(_directions)] = Field(default_factory=dict)
    speedup_vs_eager: NonNegFinite | None = None
    passed: bool | None = None


LatencyMargin = Annotated[float, AfterValidator(finite_number), Field(ge=0.0, lt=1.0)]
ClassName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_.-]*$")]


class BaselineV1(StrictSchema):
    format: Literal["attn-export-baseline/1"]
    model: dict[str, Any] = Field(default_factory=dict)
    latency_margin: LatencyMargin | None = None
    stages: dict[str, BaselineStageSchema]


class ClassEntrySchema(StrictSchema):
    recorded: dict[str, Any] = Field(default_factory=dict)  # the CPU it was recorded on (informational)
    stages: dict[str, BaselineStageSchema]


class BaselineV2(StrictSchema):
    format: Literal["attn-export-baseline/2"]
    model: dict[str, Any] = Field(default_factory=dict)
    latency_margin: LatencyMargin | None = None
    cross_class_slack: dict[str, dict[MetricName, SlackSchema]] = Field(default_factory=dict)
    classes: dict[ClassName, ClassEntrySchema]


# --- bench.json (for ``report --bench``) ---------------------------------------------------------
class BenchRowSchema(StrictSchema):
    variant: str
    batch: PosInt
    seq: PosInt
    latency_ms: LatencySchema | None = None
    peak_mem_bytes: NonNegInt | None = None


class BenchSchema(StrictSchema):
    schema_version: Annotated[int, Field(ge=1, le=SCHEMA_VERSIONS["bench"])] = SCHEMA_VERSIONS["bench"]
    results: list[BenchRowSchema]


# --- sweep.json (attn_export.campaigns.sweep) -------------------------------------------------------------
class SweepPointSchema(StrictSchema):
    key: str
    stage: str
    accuracy: AccuracySchema
    passed: bool | None = None
    latency_ms: dict[str, LatencySchema]
    speedup_vs_eager: NonNegFinite | None = None
    relative_latency: NonNegFinite
    size_bytes: NonNegInt | None = None
    params: NonNegInt | None = None
    recipe: str
    pareto: bool


class SweepSchema(StrictSchema):
    schema_version: Annotated[int, Field(ge=1, le=SCHEMA_VERSIONS["sweep"])]
    kind: Literal["sweep"]
    points: list[SweepPointSchema]
    pareto: list[str]


def validate(
    schema: type[M],
    data: Any,
    source: str,
    fix: str,
    error: type[AttnExportError] = DataError,
    context: Mapping[str, Any] | None = None,
) -> M:
    """``schema.model_validate(data)`` with a one-line ``error`` on failure."""
    if not isinstance(data, dict):
        kind = {list: "a list", str: "a string"}.get(type(data), type(data).__name__)
        raise error(f"{source}: expected a JSON object, got {kind}; {fix}")
    try:
        return schema.model_validate(data, strict=True, context=dict(context or {}))
    except ValidationError as err:
        raise error(one_line(source, err, data, fix)) from None


def read_json(path: str | os.PathLike[str], what: str, fix: str, error: type[AttnExportError] = DataError, max_bytes: int = 64 * 2**20) -> Any:
    """Parse a JSON file; a missing, unreadable, non-UTF-8, malformed or oversized file (``fstat``, before reading) is one line."""
    from attn_export.host.paths import file_kind

    p = Path(path)
    if not p.is_file():  # stat only: a FIFO or a device is named, never opened (opening a FIFO blocks)
        got = file_kind(p.stat().st_mode) if p.exists() else "no such file"
        raise error(f"{p}: expected {what}, got {got}; {fix}")
    try:
        with p.open("rb") as handle:
            if (size := os.fstat(handle.fileno()).st_size) > max_bytes:
                raise error(f"{p}: expected {what} of at most {max_bytes:,} bytes, got {size:,}; {fix}")
            return json.loads(handle.read(max_bytes + 1).decode("utf-8"))
    except UnicodeDecodeError:
        raise error(f"{p}: expected {what} in UTF-8 JSON, got undecodable bytes; {fix}") from None
    except json.JSONDecodeError as err:
        raise error(f"{p}: expected {what}, got invalid JSON ({err.msg} at line {err.lineno}); {fix}") from None
    except (OSError, RecursionError) as err:
        raise error(f"{p}: expected {what}, got an unreadable file ({err.strerror if isinstance(err, OSError) else 'nested too deeply'}); {fix}") from None


REPORT_FIX = "regenerate it with attn-export (or fix that field)"
BASELINE_FIX = "fix that field, or re-record it with attn-export check REPORT --baseline FILE --update-baseline"


def validate_report(data: Any, source: str = "report.json", *, finite: bool = False) -> ReportSchema:
    """Type-check a report; ``finite=True`` (the gate) also refuses NaN accuracy figures."""
    version = data.get("schema_version") if isinstance(data, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > REPORT_SCHEMA_VERSION:
        raise DataError(
            f"{source}: schema_version: expected {REPORT_SCHEMA_VERSION} or older, got {version}; "
            "the report was written by a newer attn-export: upgrade attn-export to read it"
        )
    return validate(ReportSchema, data, source, REPORT_FIX, context={"finite": finite})


def validate_sweep(data: Any, source: str = "sweep.json") -> SweepSchema:
    """Type-check a sweep result (what ``write_sweep`` writes is validated before it is written)."""
    return validate(SweepSchema, data, source, "regenerate it with attn-export sweep")


def validate_baseline(data: Any, source: str = "baseline") -> BaselineV1 | BaselineV2:
    """A version-1 or version-2 baseline, by its ``format`` key."""
    fmt = data.get("format") if isinstance(data, dict) else None
    if isinstance(data, dict) and fmt not in (BASELINE_FORMAT_V1, BASELINE_FORMAT_V2):
        raise DataError(
            f"{source}: format: expected {BASELINE_FORMAT_V2!r} or {BASELINE_FORMAT_V1!r}, got {show(fmt)}; "
            "create one with attn-export check REPORT --baseline FILE --update-baseline"
        )
    schema: type[BaselineV1 | BaselineV2] = BaselineV1 if fmt == BASELINE_FORMAT_V1 else BaselineV2
    return validate(schema, data, source, BASELINE_FIX)
