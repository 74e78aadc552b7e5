"""What the built engine really runs, read back from TensorRT's engine inspector: the attestation.

An engine that silently runs another precision still passes a loose tolerance (TensorRT 10.13
built FP8/FP4 requests into FP32 engines without an error, NVIDIA/TensorRT#4590), and whether
attention became one fused kernel is only visible in the engine (TensorRT#3575: "check with
--dumpLayerInfo"). So every engine is built with detailed profiling verbosity and its layer list
is read back here: per layer its precision and tactic, per GEMM group of the plan the precision
requested and the one the engine runs, the fused attention kernels against the attention blocks,
and the count of layers in each precision. A requested 8-bit or 16-bit GEMM that runs wider
(FP32, or fp16 where int8/FP8 was asked for) and an attention left unfused where the static
check's kernel table says it fuses are violations, one line each naming the layer.

The format is the detailed JSON of ``IEngineInspector.get_engine_information(JSON)`` (and of
``trtexec --profilingVerbosity=detailed --exportLayerInfo``, which writes the same): ``{"Layers":
[{"Name", "LayerType", "Inputs": [{"Name", "Dimensions", "Format/Datatype"}], "Outputs": [...],
"TacticName" | "TacticValue", "StreamId", "Metadata": "[ONNX Layer: <node>]..."}], "Bindings"}``.
Sources: TensorRT docs, "Engine Inspector" (inference-library/engine-tools.html); trtexec's
detailed sample in NVIDIA/TensorRT#4020 (10.x); Myelin ``gemm``/``kgen`` layers of an int8 BERT
with ``TacticName`` and ``Metadata`` in NVIDIA/TensorRT#4397 (10.10). TensorRT 11 ("Migrating
IEngineInspector Usage from TensorRT 10.x to 11.x") replaces ``Bindings`` with ``I/O Tensors`` and
splits ``Format/Datatype`` into ``Format`` and ``DataType``: both spellings are read.

Standard library only, on purpose: the Jetson bundle ships this file beside
``validate_on_device.py`` (as ``engine_attest.py``), which attests the engine on the device.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ATTEST_BITS", "Attestation", "EngineExpectation", "FUSED_ATTENTION", "GroupCheck", "InspectorFormatError", "PlannedGemm", "attest_engine",
           "attest_bundle", "attest_file", "layer_precision", "read_layers"]

# vocab.precisions' bits, repeated here because this module runs on the device without attn-export
# (tests/runtime/tensorrt/test_attest.py holds the two equal); tf32 is fp32 storage.
ATTEST_BITS = {"fp4": 4, "int8": 8, "fp8": 8, "fp16": 16, "bf16": 16, "fp32": 32}
# Kernel/tactic names of TensorRT's fused attention: Myelin's "_gemm_mha_v2", "fmha"/"flash"
# tactics and IAttention kernels, matched on layer name, type and tactic.
FUSED_ATTENTION = re.compile(r"(_mha_|mha_v\d|fmha|flash_?attn|flash_?attention|fused_?mha|cask\w*attention)", re.I)
_SOFTMAX = re.compile(r"softmax", re.I)
_FOREIGN = re.compile(r"myelin|foreignnode", re.I)  # a Myelin region names the softmax it swallowed: not a standalone one
# Tensor type words of the inspector ("Half", "Float", "Int8", "BFloat16", "Row major linear FP32",
# "Channel major FP16 format ...", "FP8"): first match wins, so BFloat16 is read before Float.
_DTYPES = (("bf16", r"bfloat16|\bbf16\b"), ("fp8", r"\bfp8\b|e4m3"), ("fp4", r"\bfp4\b|e2m1"), ("int8", r"\bint8\b"),
           ("fp16", r"\bhalf\b|\bfp16\b"), ("fp32", r"\bfloat\b|\bfp32\b"), ("int32", r"\bint32\b"), ("int64", r"\bint64\b"),
           ("bool", r"\bbool\b"))  # fmt: skip
# GEMM kernels name their operand types ("sm80_xmma_gemm_i8i8_...", "..._f16f16_...", "..._bf16bf16_...", "..._tf32f32_...").
_TACTIC_TYPES = (("int8", r"i8i8"), ("fp8", r"e4m3|e5m2"), ("bf16", r"bf16bf16"), ("fp16", r"f16f16"), ("fp32", r"tf32|f32f32"))
_GEMM_TYPES = re.compile(r"gemm|matrixmultiply|matmul|fullyconnected", re.I)
_ONNX_LAYER = re.compile(r"\[ONNX Layer: ([^\]]+)\]")


class InspectorFormatError(ValueError):
    """The JSON is not the detailed inspector's layer list (built without detailed verbosity, or not an inspector file)."""


@dataclass(frozen=True)
class PlannedGemm:
    """One GEMM of the ONNX graph and the precision the plan placed it in."""

    node: str  # the ONNX node name (the engine's Metadata names it)
    group: str  # the plan's tuning unit, e.g. layers.0.ffn2
    precision: str  # int8 / fp8 / fp16 / bf16 / fp32


@dataclass(frozen=True)
class EngineExpectation:
    """What the engine should run: the plan's GEMMs (or, without a table, every GEMM in ``precision``) and its attention."""

    precision: str
    gemms: tuple[PlannedGemm, ...] = ()
    attention_blocks: int = 0
    fused_attention: bool = False  # the static check's kernel table says every block fuses

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineExpectation:
        gemms = tuple(PlannedGemm(str(g["node"]), str(g["group"]), str(g["precision"])) for g in data.get("gemms") or ())
        return cls(str(data["precision"]), gemms, int(data.get("attention_blocks") or 0), bool(data.get("fused_attention")))


@dataclass(frozen=True)
class EngineLayer:
    name: str
    layer_type: str
    precision: str  # the layer's compute type ("unknown" when the inspector gives none)
    tactic: str
    onnx_nodes: tuple[str, ...]

    @property
    def is_gemm(self) -> bool:
        return bool(_GEMM_TYPES.search(self.layer_type) or _GEMM_TYPES.search(self.tactic)) and not self.is_fused_attention

    @property
    def is_fused_attention(self) -> bool:
        return bool(FUSED_ATTENTION.search(f"{self.name} {self.layer_type} {self.tactic}"))

    @property
    def is_softmax(self) -> bool:
        """A softmax kernel of its own: by name, or (Myelin names kernels by their ops) by the ONNX nodes its metadata lists."""
        text = f"{self.name} {self.layer_type} {self.tactic} {' '.join(self.onnx_nodes)}"
        return bool(_SOFTMAX.search(text)) and not self.is_fused_attention and not _FOREIGN.search(text)


@dataclass
class GroupCheck:
    """One GEMM group: the precision requested, the precisions its engine layers run, and whether that is allowed."""

    group: str
    requested: str
    actual: list[str]
    layers: list[str]
    ok: bool


@dataclass
class Attestation:
    """The engine's layers read back: falsy when a GEMM runs wider than requested or attention is not fused as expected."""

    precision: str
    layers_by_precision: dict[str, int]
    groups: list[GroupCheck]
    attention_blocks: int
    fused_attention: int
    fused_attention_expected: bool
    standalone_softmax: list[str]
    unlocated_gemms: list[str]  # planned GEMMs no engine layer names (fused into a region the metadata does not list)
    violations: list[str]
    allowed_by: str | None = None  # the flag that accepted the violations, recorded in the report

    def __bool__(self) -> bool:
        return not self.violations

    @property
    def passed(self) -> bool:
        """The run's verdict: no violation, or violations the user accepted (``allowed_by``)."""
        return not self.violations or self.allowed_by is not None

    def describe(self) -> str:
        counts = ", ".join(f"{n} {p}" for p, n in sorted(self.layers_by_precision.items(), key=lambda kv: -kv[1]))
        bad = sum(1 for g in self.groups if not g.ok)
        fused = f"attention fused {self.fused_attention}/{self.attention_blocks}" + (" (expected fused)" if self.fused_attention_expected else "")
        verdict = "attested" if not self.violations else (f"{len(self.violations)} violation(s)" + (f", accepted by {self.allowed_by}" if self.allowed_by else ""))
        missing = f" ({len(self.unlocated_gemms)} planned GEMMs not in the layers' metadata)" if self.unlocated_gemms else ""
        return f"engine {self.precision}: {verdict}; {len(self.groups) - bad}/{len(self.groups)} GEMM groups as planned{missing}; {fused}; layers: {counts}"

    def report_lines(self) -> list[str]:
        """What a console shows: the summary, then each violation as FAIL (or accepted, and by which flag)."""
        how = f"accepted ({self.allowed_by})" if self.allowed_by else "FAIL"
        return [f"attestation: {self.describe()}"] + [f"{how}: {v}" for v in self.violations]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attestation:
        return cls(**{**data, "groups": [GroupCheck(**g) for g in data.get("groups") or ()]})


def _dtype(text: str) -> str:
    for name, pattern in _DTYPES:
        if re.search(pattern, text, re.I):
            return name
    return "unknown"


def _tensor_type(tensor: Any) -> str:
    if not isinstance(tensor, dict):
        return "unknown"
    return _dtype(str(tensor.get("DataType") or tensor.get("Format/Datatype") or ""))  # 11.x splits the field; 10.x joins it


def layer_precision(layer: dict[str, Any]) -> str:
    """A layer's compute precision: a GEMM kernel's operand types when its tactic names them, else its first input's type."""
    tactic = str(layer.get("TacticName") or "")
    for name, pattern in _TACTIC_TYPES:
        if re.search(pattern, tactic, re.I):
            return name
    inputs = layer.get("Inputs") or []
    return _tensor_type(inputs[0]) if inputs else "unknown"


def read_layers(info: Any) -> list[EngineLayer]:
    """The layers of a detailed inspector JSON (the parsed object); InspectorFormatError for anything else."""
    layers = info.get("Layers") if isinstance(info, dict) else None
    if not isinstance(layers, list):
        raise InspectorFormatError("expected the inspector's JSON object with a 'Layers' list")
    if layers and not all(isinstance(layer, dict) for layer in layers):
        raise InspectorFormatError("the inspector JSON lists layer names only: build the engine with detailed profiling verbosity "
                                   "(ProfilingVerbosity.DETAILED, trtexec --profilingVerbosity=detailed) to attest it")  # fmt: skip
    return [EngineLayer(str(layer.get("Name", "")), str(layer.get("LayerType", "")), layer_precision(layer),
                        str(layer.get("TacticName") or layer.get("TacticValue") or ""), tuple(_ONNX_LAYER.findall(str(layer.get("Metadata") or ""))))
            for layer in layers]  # fmt: skip


def _wider(actual: str, requested: str) -> bool:
    return actual in ATTEST_BITS and requested in ATTEST_BITS and ATTEST_BITS[actual] > ATTEST_BITS[requested]


def _check_group(group: str, requested: str, layers: list[EngineLayer], violations: list[str]) -> GroupCheck:
    actual = sorted({layer.precision for layer in layers})
    wide = [layer for layer in layers if requested != "fp32" and _wider(layer.precision, requested)]
    for layer in wide:
        violations.append(f"GEMM group {group}: {requested} requested, engine layer {layer.name!r} runs {layer.precision}")
    return GroupCheck(group, requested, actual, [layer.name for layer in layers], not wide)


def attest_engine(info: Any, expect: EngineExpectation) -> Attestation:
    """Attest the detailed inspector JSON ``info`` against ``expect`` (see the module docstring)."""
    layers = read_layers(info)
    counts: dict[str, int] = {}
    for layer in layers:
        counts[layer.precision] = counts.get(layer.precision, 0) + 1
    gemm_layers = [layer for layer in layers if layer.is_gemm]
    by_node = {node: layer for layer in gemm_layers for node in layer.onnx_nodes}
    violations: list[str] = []
    groups: list[GroupCheck] = []
    unlocated: list[str] = []
    if expect.gemms:
        planned: dict[tuple[str, str], list[EngineLayer]] = {}
        for gemm in expect.gemms:
            layer = by_node.get(gemm.node)
            if layer is None:
                unlocated.append(gemm.node)
            members = planned.setdefault((gemm.group, gemm.precision), [])
            if layer is not None and layer not in members:
                members.append(layer)
        groups = [_check_group(group, precision, members, violations) for (group, precision), members in planned.items() if members]
        if not groups and gemm_layers:  # nothing to compare is not a pass: the layers name no planned GEMM
            violations.append(f"none of the {len(expect.gemms)} planned GEMMs is named by the metadata of the engine's {len(gemm_layers)} "
                              f"GEMM layer(s) (first: {gemm_layers[0].name!r}); the precision they run cannot be attested")  # fmt: skip
    elif ATTEST_BITS.get(expect.precision, 32) == 16:  # a float engine without a table: every GEMM runs its precision
        groups = [_check_group(layer.name, expect.precision, [layer], violations) for layer in gemm_layers]
    fused = [layer.name for layer in layers if layer.is_fused_attention]
    softmax = [layer.name for layer in layers if layer.is_softmax]
    if expect.fused_attention and expect.attention_blocks and (len(fused) < expect.attention_blocks or softmax):
        where = f"standalone softmax layer {softmax[0]!r}" if softmax else "no standalone softmax"
        violations.append(f"attention not fused: {len(fused)} fused attention kernel(s) for {expect.attention_blocks} attention block(s), "
                          f"{where}; the target's kernel table says it fuses")  # fmt: skip
    return Attestation(expect.precision, counts, groups, expect.attention_blocks, len(fused), expect.fused_attention, softmax, unlocated, violations)


def attest_file(path: str, expect: EngineExpectation) -> Attestation:
    """``attest_engine`` on a saved inspector JSON (``model.engine.layers.json``)."""
    with open(path, encoding="utf-8") as f:
        return attest_engine(json.load(f), expect)


def attest_bundle(layers_json: str, expectation: dict[str, Any] | None, accepted_by: str | None = None) -> Attestation | None:
    """The Jetson bundle's device check: ``layers_json`` (build_engine.sh's ``--exportLayerInfo``) against bundle.json's
    ``expectation``; None when either is absent (no engine built yet, a bundle from before attestation). ``accepted_by``:
    the flag that accepts violations, recorded on the result."""
    if expectation is None or not os.path.isfile(layers_json):
        return None
    att = attest_file(layers_json, EngineExpectation.from_dict(expectation))
    att.allowed_by = accepted_by if att.violations else None
    return att
