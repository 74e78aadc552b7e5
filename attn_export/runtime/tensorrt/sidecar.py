"""The JSON sidecar next to every engine, and the checks that read it (no TensorRT needed).

A TensorRT engine only runs on the GPU model and TensorRT version it was built with
(unless built hardware-/version-compatible). Deserialising a foreign engine fails with
an opaque error or, worse, runs slowly; so every ``.engine`` gets ``.engine.json`` with
the TensorRT version, GPU name, compute capability, precision, every optimization profile, the ONNX
sha256, the engine's own size and sha256, and the build flags. ``check_compatible``
compares it with the running machine and says "rebuild on the target" when they differ.

The sidecar is read back before an engine is trusted, so it is validated with a schema
(pydantic, strict types, no unknown keys): a hand-edited, truncated or non-UTF-8 sidecar is
one line saying which field is wrong, never a traceback.

The inspector's layer list is also read here, to tell whether attention became a fused
MHA kernel.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from attn_export.errors import ConfigError, EngineError
from attn_export.outdir.manifest import sha256_file  # one file hash for run manifests and engine sidecars
from attn_export.runtime.tensorrt.attest import FUSED_ATTENTION as _FUSED  # one list of fused attention kernel names
from attn_export.runtime.tensorrt.spec import ENGINE_PRECISIONS, HARDWARE_COMPATIBILITY, parse_trt_version

__all__ = [
    "SIDECAR_SCHEMA",
    "EngineSidecar",
    "AttentionFusion",
    "sidecar_path_for",
    "layers_path_for",
    "read_sidecar",
    "write_sidecar",
    "verify_engine_file",
    "check_compatible",
    "detect_fused_attention",
]

log = logging.getLogger(__name__)

SIDECAR_SCHEMA = 2  # 2: optimization_profiles (length buckets); a schema-1 sidecar still reads
_SOFTMAX = re.compile(r"softmax", re.I)


def sidecar_path_for(engine_path: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(engine_path)}.json")


def layers_path_for(engine_path: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(engine_path)}.layers.json")


_SHA256 = r"^[0-9a-f]{64}$"
Shape = list[int]


class EngineSidecar(BaseModel):
    """Everything needed to decide, without deserialising, whether an engine can run here."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    tensorrt_version: str
    gpu_name: str = Field(min_length=1)
    compute_capability: str = Field(pattern=r"^\d+\.\d+$")  # "9.0"
    precision: Literal[tuple(ENGINE_PRECISIONS)]  # type: ignore[valid-type]  # every precision an engine is built in
    strongly_typed: bool
    builder_flags: list[str]
    profiles: dict[str, dict[Literal["min", "opt", "max"], Shape]]  # input -> {"min": [...], "opt": [...], "max": [...]}: profile 0
    # every profile, in the engine's order, when there are several (length buckets); empty: ``profiles`` is the only one
    optimization_profiles: list[dict[str, dict[Literal["min", "opt", "max"], Shape]]] = Field(default_factory=list)
    onnx_sha256: str = Field(pattern=_SHA256)
    engine_sha256: str = Field(pattern=_SHA256)
    engine_size_bytes: int = Field(ge=0)
    hardware_compatibility: Literal[tuple(HARDWARE_COMPATIBILITY)] = "none"  # type: ignore[valid-type]
    version_compatible: bool = False
    dla_core: int | None = Field(default=None, ge=0)
    input_names: list[str] = Field(default_factory=list)
    output_names: list[str] = Field(default_factory=list)
    attention_fused: int | None = Field(default=None, ge=0)
    attention_blocks: int | None = Field(default=None, ge=0)
    schema_version: int = Field(default=SIDECAR_SCHEMA, alias="schema", ge=1)

    @field_validator("tensorrt_version")
    @classmethod
    def _version(cls, value: str) -> str:
        try:
            parse_trt_version(value)
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return value

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)

    def all_profiles(self) -> list[dict[str, dict[str, list[int]]]]:
        """Every optimization profile of the engine, in its order (what the runner and Triton's config read)."""
        if self.optimization_profiles:
            return [{n: dict(s) for n, s in p.items()} for p in self.optimization_profiles]
        return [{n: dict(s) for n, s in self.profiles.items()}] if self.profiles else []


def write_sidecar(engine_path: str | os.PathLike[str], sidecar: EngineSidecar) -> Path:
    from attn_export.outdir.atomic import atomic_path

    path = sidecar_path_for(engine_path)
    with atomic_path(path) as tmp:  # no half-written sidecar beside an engine
        tmp.write_text(json.dumps(sidecar.to_dict(), indent=2) + "\n", encoding="utf-8")
    return path


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "<top level>"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{where}: {first.get('msg', 'invalid')}{more}"


def read_sidecar(engine_path: str | os.PathLike[str]) -> EngineSidecar:
    """The engine's sidecar, validated; EngineError with one line when missing or malformed."""
    path = sidecar_path_for(engine_path)
    if not path.is_file():
        raise EngineError(
            f"no sidecar {path} next to engine {engine_path}; engines are tied to a GPU and TensorRT version, "
            f"so rebuild it with attn-export (which writes the sidecar) on the target"
        )
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise EngineError(
            f"sidecar {path} is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); "
            f"expected the JSON attn-export writes; rebuild the engine"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise EngineError(f"sidecar {path} is not valid JSON ({err.msg} at line {err.lineno}); rebuild the engine") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if isinstance(schema, int) and not isinstance(schema, bool) and schema > SIDECAR_SCHEMA:
        raise EngineError(f"sidecar {path} has schema {schema}, newer than this attn-export ({SIDECAR_SCHEMA}); upgrade attn-export")
    try:
        return EngineSidecar.model_validate(data)
    except ValidationError as err:
        raise EngineError(f"sidecar {path} is not a valid engine sidecar: {_first_error(err)}; rebuild the engine") from None


def verify_engine_file(engine_path: str | os.PathLike[str], sidecar: EngineSidecar) -> None:
    """Refuse a truncated or altered engine file before TensorRT sees it."""
    path = Path(engine_path)
    if not path.is_file():
        raise EngineError(f"engine {path} does not exist; build it with --build-engine or ./build_engine.sh")
    size = path.stat().st_size
    if size != sidecar.engine_size_bytes:
        raise EngineError(
            f"engine {path} is {size} bytes but its sidecar says {sidecar.engine_size_bytes}: the file is truncated or "
            f"was replaced; copy it again or rebuild it"
        )
    if sha256_file(path) != sidecar.engine_sha256:
        raise EngineError(f"engine {path} does not match its sidecar's sha256 (corrupted or replaced); rebuild it")


def check_compatible(sidecar: EngineSidecar, tensorrt_version: str, gpu_name: str, compute_capability: str) -> list[str]:
    """Reasons the engine cannot run on this machine (empty list = compatible)."""
    problems: list[str] = []
    built, here = sidecar.tensorrt_version, tensorrt_version
    if sidecar.version_compatible:
        if parse_trt_version(here) < parse_trt_version(built):
            problems.append(f"TensorRT {here} is older than the version-compatible engine's {built}")
    elif built != here:
        problems.append(f"built with TensorRT {built}, running {here}")
    cc_built, cc_here = _cc(sidecar.compute_capability), _cc(compute_capability)
    level = sidecar.hardware_compatibility
    if level == "ampere+":
        if cc_here < (8, 0):
            problems.append(f"ampere+ engine on sm {compute_capability} (needs 8.0 or newer)")
    elif cc_built != cc_here:
        problems.append(f"built for {sidecar.gpu_name} (sm {sidecar.compute_capability}), running on {gpu_name} (sm {compute_capability})")
    elif level == "none" and sidecar.gpu_name != gpu_name:
        problems.append(f"built on {sidecar.gpu_name}, running on {gpu_name} (same sm {compute_capability}, different GPU model)")
    return problems


def _cc(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", str(text))
    return (int(m.group(1)), int(m.group(2))) if m else (-1, -1)


@dataclass(frozen=True)
class AttentionFusion:
    """What the engine inspector shows for attention."""

    fused_layers: list[str]
    softmax_layers: list[str]
    expected_blocks: int

    @property
    def fused(self) -> int:
        return len(self.fused_layers)

    @property
    def all_fused(self) -> bool:
        return self.expected_blocks == 0 or (self.fused >= self.expected_blocks and not self.softmax_layers)


def _layer_text(layer: Any) -> tuple[str, str]:
    if isinstance(layer, str):
        return layer, layer
    if isinstance(layer, dict):
        name = str(layer.get("Name", ""))
        kernel = " ".join(str(layer.get(k, "")) for k in ("Name", "LayerType", "TacticName"))
        return name, kernel
    return str(layer), str(layer)


def detect_fused_attention(inspector: dict[str, Any] | list[Any], expected_blocks: int) -> AttentionFusion:
    """Find fused MHA kernels (and leftover Softmax layers) in ``get_engine_information`` JSON.

    Works with both inspector verbosities: ``layer_names_only`` lists strings, ``detailed``
    lists dicts with Name/LayerType/TacticName. A standalone Softmax layer left in the
    engine means at least one attention was not fused.
    """
    layers = inspector.get("Layers", []) if isinstance(inspector, dict) else inspector
    fused: list[str] = []
    softmax: list[str] = []
    for layer in layers:
        name, text = _layer_text(layer)
        if _FUSED.search(text):
            fused.append(name)
        elif _SOFTMAX.search(text) and not re.search(r"myelin|foreignnode", text, re.I):
            softmax.append(name)
    log.debug("inspector: %d fused attention layer(s), %d softmax layer(s)", len(fused), len(softmax))
    return AttentionFusion(fused, softmax, expected_blocks)
