"""Deployment targets: what ONNX each runtime should receive, decided in one table.

A target fixes the opset, the attention form and how reduced precision is expressed, so a
user picks ``--target jetson`` instead of re-deriving which TensorRT parses which opset.
The choices (checked against the ONNX-TensorRT operator matrix and release notes):

* TensorRT 11 removed weak typing (``BuilderFlag.FP16/INT8``, calibrators): precision must
  live in the graph (fp16 weights with fp32 Cast islands, symmetric Q/DQ).
* The ONNX ``Attention`` op is parsed from TensorRT 10.14 (``IAttention``); JetPack 6 ships
  TensorRT 10.3, which parses opsets 9-20, so Jetson gets the decomposed form at opset 18.
* On 10.3 a fp32 graph built with ``--fp16`` lets TensorRT pick its fused fp16 MHA kernel
  (which accumulates the softmax in fp32 itself); fp32 Cast islands written into a fp16
  graph would pin the softmax between the two BMMs and keep that fusion from happening.

``docs/targets.md`` renders this table for the README.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from attn_export.errors import ConfigError
from attn_export.export.spec import DEFAULT_OPSET, MIN_OPSET, ExportSpec
from attn_export.targets.trt_releases import Release, release_for_target
from attn_export.vocab.precisions import get_precision

__all__ = ["FP16_MODES", "INT8_MODES", "Target", "TARGETS", "DEFAULT_TARGET", "get_target", "export_spec_for"]

log = logging.getLogger(__name__)

FP16_MODES: tuple[str, ...] = ("graph", "builder-flag")
INT8_MODES: tuple[str, ...] = ("qdq-strong", "qdq+flag")
# The attention form every TensorRT release parses and builds (MatMul/Softmax/MatMul, opset 17+): what a
# TensorRT target exports when its own form needs a newer opset than the release's parser reads.
ANY_RELEASE_FORM = "decomposed"


@dataclass(frozen=True)
class Target:
    """One deployment target.

    fp16_mode: ``graph`` = fp16 weights/activations with fp32 Cast islands, built strongly
    typed; ``builder-flag`` = fp32 graph, fp16 enabled at build time (``--fp16``).
    int8_mode: ``qdq-strong`` = symmetric Q/DQ in the graph, nothing set at build time;
    ``qdq+flag`` = Q/DQ graph built with ``--int8 --fp16`` (weakly typed TensorRT 10.x).
    trt_version: the TensorRT the target is checked against (None: not a TensorRT target).
    route_preference: see the field's comment (the plan's selection reads it).
    """

    name: str
    opset: int
    attention: str
    fp16_mode: str
    int8_mode: str
    trt_version: str | None
    quantize_attention_bmm: bool
    description: str
    # 8-bit routes, most preferred first, per precision: when two routes that meet the tolerance
    # are within the timing noise of each other, the earlier one wins, so the same command ships
    # the same route run after run. A route not listed here is never shipped for this target.
    route_preference: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Export residual Add + LayerNorm on 2-D rows (export/row_layernorm.py): ONNX Runtime CPU's
    # SkipLayerNormalization fusion cannot match them, so the graph is fast in a plain session.
    layernorm_rows: bool = False
    # The packed form's MultiHeadAttention without key_padding_mask (export/mask_free_attention.py):
    # ONNX Runtime's CPU kernel runs flash attention only then; CUDA's kernels take the mask.
    mask_free_attention: bool = False
    # The target runs on a Jetson: only the TensorRT releases a JetPack ships (targets/trt_releases.py) can be deployed.
    needs_jetpack: bool = False

    def __post_init__(self) -> None:
        if self.fp16_mode not in FP16_MODES:
            raise ConfigError(f"expected fp16_mode in {FP16_MODES}, got {self.fp16_mode!r}")
        if self.int8_mode not in INT8_MODES:
            raise ConfigError(f"expected int8_mode in {INT8_MODES}, got {self.int8_mode!r}")

    @property
    def is_tensorrt(self) -> bool:
        return self.trt_version is not None

    def release(self, trt_version: str | None = None, flag: str = "--trt-version") -> Release:
        """The TensorRT release this target is held to (``trt_version`` or its own): one the toolkit knows and the target has a build of."""
        if not self.is_tensorrt:
            raise ConfigError(f"{flag} applies to TensorRT targets; use --target tensorrt or jetson (got {self.name})")
        return release_for_target(self.name, self.needs_jetpack, trt_version or str(self.trt_version), flag)

    @property
    def strongly_typed(self) -> bool:
        """Build strongly typed: the precision is in the graph (always so on TensorRT 11)."""
        return self.fp16_mode == "graph"

    def graph_precision(self, precision: str) -> str:
        """The float precision of the exported graph for a requested ``precision``."""
        p = get_precision(precision, what="--precision")
        if p.export_float and self.fp16_mode == "graph":
            return p.name  # a reduced float (fp16, bf16) lives in the graph's own types
        # builder-flag reduced floats and every 8-bit graph start from fp32 (the quantizer calibrates in fp32).
        return "fp32"


TARGETS: dict[str, Target] = {
    "ort-cpu": Target(
        name="ort-cpu",
        opset=18,
        attention="decomposed",
        fp16_mode="graph",
        int8_mode="qdq-strong",
        trt_version=None,
        quantize_attention_bmm=False,
        description="ONNX Runtime on CPU (default): plain ONNX ops, fp32 softmax/LayerNorm islands",
        # dynamic needs no calibration data and is ORT CPU's fastest int8 (docs/quantization.md);
        # weight-only (opt-in) keeps activations float: smallest accuracy cost, not the fastest
        route_preference={"int8": ("dynamic", "static", "weight-only")},
        layernorm_rows=True,
        mask_free_attention=True,
    ),
    "ort-cuda": Target(
        name="ort-cuda",
        opset=18,
        attention="ort-contrib",
        fp16_mode="graph",
        int8_mode="qdq-strong",
        trt_version=None,
        quantize_attention_bmm=False,
        description="ONNX Runtime CUDA EP: com.microsoft.MultiHeadAttention (fused kernel)",
        route_preference={"int8": ("static", "dynamic", "weight-only")},
    ),
    "tensorrt": Target(
        name="tensorrt",
        opset=23,
        attention="onnx-attention",
        fp16_mode="graph",
        int8_mode="qdq-strong",
        trt_version="10.14",
        quantize_attention_bmm=False,
        description="TensorRT >= 10.14 or 11 on server GPUs: ONNX Attention -> IAttention, strongly typed",
        route_preference={"int8": ("static",)},  # TensorRT takes explicit Q/DQ only
    ),
    "jetson": Target(
        name="jetson",
        opset=18,
        attention="decomposed",
        fp16_mode="builder-flag",
        int8_mode="qdq+flag",
        trt_version="10.3",
        quantize_attention_bmm=False,
        description="JetPack 6.x (TensorRT 10.3): decomposed attention at opset 18, --fp16/--int8 flags",
        route_preference={"int8": ("static",)},
        needs_jetpack=True,
    ),
}
DEFAULT_TARGET = "ort-cpu"


def get_target(name: str) -> Target:
    """Look a target up by name; unknown names are a ConfigError listing the choices."""
    if name not in TARGETS:
        raise ConfigError(f"unknown --target {name!r}; choose one of {', '.join(TARGETS)}")
    return TARGETS[name]


def export_spec_for(target: Target | str, precision: str = "fp32", *, trt_version: str | None = None, **overrides: object) -> ExportSpec:
    """The ``ExportSpec`` that produces the right ONNX for ``target`` at ``precision``.

    int8 returns the float graph the Q/DQ quantizer starts from; ``overrides`` (e.g.
    ``dynamic_batch=False``) pass through to ``ExportSpec``. On a TensorRT target the opset is
    decided by the release (``trt_version``, else the target's) before anything is exported: the
    default follows the release's parser (the target's opset, lowered to the release's maximum),
    and an explicit ``opset`` or ``attention`` the release's parser cannot read is refused.
    """
    tgt = get_target(target) if isinstance(target, str) else target
    graph_precision = tgt.graph_precision(precision)
    fields: dict[str, object] = {"attention": tgt.attention, "opset": tgt.opset, "precision": graph_precision, "layernorm_rows": tgt.layernorm_rows,
                                 "mask_free_attention": tgt.mask_free_attention}
    fields.update(overrides)  # an explicit --attention/--opset wins over the target's choice
    if tgt.is_tensorrt:
        fields.update(_fit_release(tgt.release(trt_version), fields, overrides))
    spec = ExportSpec(**fields)  # type: ignore[arg-type]
    log.debug("target %s, %s -> %s", tgt.name, precision, spec)
    return spec


def _fit_release(row: Release, fields: dict[str, object], overrides: dict[str, object]) -> dict[str, object]:
    """The attention form and opset of ``fields`` that release ``row``'s ONNX parser reads (its ``max_opset`` column)."""
    attention, opset = str(fields["attention"]), fields["opset"]
    if attention in MIN_OPSET and MIN_OPSET[attention] > row.max_opset:
        if "attention" in overrides:
            raise ConfigError(f"--attention {attention} needs opset >= {MIN_OPSET[attention]}, but TensorRT {row.version}'s ONNX parser takes at "
                              f"most opset {row.max_opset}; use --attention {ANY_RELEASE_FORM} or a newer --trt-version")  # fmt: skip
        attention = ANY_RELEASE_FORM  # the target's own form is newer than this release's parser
    if opset is None:
        opset = min(DEFAULT_OPSET.get(attention, row.max_opset), row.max_opset)
    elif isinstance(opset, int) and opset > row.max_opset:
        if overrides.get("opset") is not None:
            raise ConfigError(f"expected --opset <= {row.max_opset} for TensorRT {row.version} (its ONNX parser takes at most opset "
                              f"{row.max_opset}), got --opset {opset}; use --opset {row.max_opset} or a newer --trt-version")  # fmt: skip
        opset = row.max_opset
    return {"attention": attention, "opset": opset}
