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

Everything the pipeline does differently per target reads a column of the row (its runtime, the
ONNX Runtime providers that run its graphs, the TensorRT releases and GPU architectures it covers,
its deploy steps, its route policy): no module branches on a target's name. Adding a target is a
row here, plus at most one runtime module its ``session_options`` names (docs/architecture.md).

``docs/targets.md`` renders this table for the README.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from attn_export.errors import ConfigError
from attn_export.export.spec import DEFAULT_OPSET, MIN_OPSET, ExportSpec
from attn_export.targets.gpu_arch import ARCHS
from attn_export.targets.trt_releases import PACKED_ATTENTION, RELEASES, Release, TrtVersion, release_for_target
from attn_export.vocab.precisions import get_precision

__all__ = ["FP16_MODES", "INT8_MODES", "Target", "TARGETS", "DEFAULT_TARGET", "get_target", "export_spec_for", "targets_with"]

log = logging.getLogger(__name__)

FP16_MODES: tuple[str, ...] = ("graph", "builder-flag")
INT8_MODES: tuple[str, ...] = ("qdq-strong", "qdq+flag")
DEPLOY_STEPS: tuple[str, ...] = ("trt-check", "engine", "bundle", "session-options")
SELECT_BY: tuple[str, ...] = ("latency", "accuracy")
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
    trt_version: the TensorRT release the target is held to by default (None: no TensorRT inside).
    route_preference: the route policy, see the field's comment (enforced: ``route_refusal``).
    The other columns say how the pipeline treats the target, each with its comment.
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
    # Routes built in the padded encoder form only (their packed twin is planned as skipped, with this reason): on this
    # runtime their graph runs unfused around the packed form's ops, so the packed twin cannot win (measured).
    padded_only_routes: Mapping[str, str] = field(default_factory=dict)
    # Export residual Add + LayerNorm on 2-D rows (export/row_layernorm.py): ONNX Runtime CPU's
    # SkipLayerNormalization fusion cannot match them, so the graph is fast in a plain session.
    layernorm_rows: bool = False
    # The packed form's MultiHeadAttention without key_padding_mask (export/mask_free_attention.py):
    # ONNX Runtime's CPU kernel runs flash attention only then; CUDA's kernels take the mask.
    mask_free_attention: bool = False
    # The target runs on a Jetson: only the TensorRT releases a JetPack ships (targets/trt_releases.py) can be deployed,
    # and the GPU follows the JetPack table when --gpu-arch is not given (targets/gpu_arch.py default_arch).
    needs_jetpack: bool = False
    # What runs the deployed artifact: a ``Precision.runtimes`` name ("onnxruntime" | "tensorrt"; vocabulary.py).
    runtime: str = "onnxruntime"
    # The ONNX Runtime execution providers that run (and judge) the target's ONNX artifacts, its own first and its
    # fall-backs after; a provider this onnxruntime build lacks is dropped, and dropping the first is a named stand-in.
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    # Set when ONNX Runtime only emulates the target's runtime (TensorRT): why, written into the report beside the
    # artifact's runtime, so a judgement made on the emulation is never mistaken for one made on the target.
    emulation: str = ""
    # The TensorRT releases (targets/trt_releases.py) the target has a build of (empty: none; --trt-version is refused).
    trt_releases: tuple[TrtVersion, ...] = ()
    # The GPU architectures (targets/gpu_arch.py) --gpu-arch may name for it (empty: it takes no --gpu-arch).
    gpu_archs: tuple[str, ...] = ()
    # The deploy steps it can run after selection (DEPLOY_STEPS): the static TensorRT check, an engine (--build-engine),
    # a Jetson bundle (--bundle), the session options a deployment must set (``session_options``).
    deploys: tuple[str, ...] = ()
    # How selection ranks the routes that meet their tolerance: by latency measured here, or, where this machine
    # cannot time the target's runtime (TensorRT), by accuracy on the select split.
    select_by: str = "latency"
    # The attention form of the packed encoder (its runtime's packed-attention op, or the decomposed math TensorRT parses).
    packed_attention: str = "ort-contrib"
    # --attention auto may pick the long-seq form (ONNX Runtime CPU's flash kernels: measured there only, bench/long_seq.py).
    long_seq: bool = False
    # 8-bit Q/DQ graphs are explicit quantization for the runtime (TensorRT): full-range symmetric int8 and judged by
    # the reference Q/DQ arithmetic, never by ONNX Runtime CPU's int8 kernels (compress/methods/int8_static.py).
    explicit_quantization: bool = False
    # "module:function" that returns the session/provider options a deployment of this target must set, written
    # into the report (deploy.session_options); "" when the runtime needs none beyond its defaults.
    session_options: str = ""

    def __post_init__(self) -> None:
        if self.fp16_mode not in FP16_MODES:
            raise ConfigError(f"expected fp16_mode in {FP16_MODES}, got {self.fp16_mode!r}")
        if self.int8_mode not in INT8_MODES:
            raise ConfigError(f"expected int8_mode in {INT8_MODES}, got {self.int8_mode!r}")
        if (self.trt_version is None) != (not self.trt_releases):
            raise ConfigError(f"{self.name}: expected a trt_version with its trt_releases (or neither), got {self.trt_version!r} and {self.trt_releases}")
        if unknown := set(self.deploys) - set(DEPLOY_STEPS):
            raise ConfigError(f"{self.name}: expected deploy steps from {DEPLOY_STEPS}, got {sorted(unknown)}")
        if self.select_by not in SELECT_BY:
            raise ConfigError(f"{self.name}: expected select_by in {SELECT_BY}, got {self.select_by!r}")
        if ("session-options" in self.deploys) != bool(self.session_options):
            raise ConfigError(f"{self.name}: expected the session-options deploy step with a session_options function (or neither)")
        if not self.providers:
            raise ConfigError(f"{self.name}: expected at least one ONNX Runtime provider to run its graphs")

    def release(self, trt_version: str | None = None, flag: str = "--trt-version") -> Release:
        """The TensorRT release this target is held to (``trt_version`` or its own): one the toolkit knows and the target has a build of."""
        if not self.trt_releases:
            raise ConfigError(f"{flag} applies to targets with TensorRT inside; use --target {' or '.join(targets_with('trt_releases'))} "
                              f"(got {self.name})")  # fmt: skip
        return release_for_target(self.name, self.trt_releases, trt_version or str(self.trt_version), flag)

    def routes(self, precision: str) -> tuple[str, ...]:
        """The routes the target ships ``precision`` by, most preferred first (its route policy)."""
        return tuple(self.route_preference.get(precision, ()))

    def route_refusal(self, precision: str, route: str, why: str = "") -> str | None:
        """Why ``route`` to ``precision`` is never shipped on this target (None: its route policy lists it); ``why``: the route's own reason."""
        listed = self.routes(precision)
        if route in listed:
            return None
        reason = f"; {why}" if why else ""
        if not listed:
            others = [t for t in TARGETS.values() if route in t.routes(precision)]
            alt = f"use --target {' or '.join(t.name for t in others)}" if others else "drop it"
            return f"the {self.name} target's route policy ships no {precision}{reason}; {alt}, or --quantize {self._other_8bit(precision)}"
        return f"the {self.name} target's route policy ships {precision} by {', '.join(listed)} only{reason}; use --int8-mode {listed[0]}"

    def packed_refusal(self, trt_version: str | None = None, quantize: str | None = None) -> str | None:
        """Why the packed encoder form never ships on this target at ``trt_version`` (None: it may).

        The packed form needs attention over ragged sequences: ONNX Runtime's kernels, or on TensorRT the
        packed ``IAttention`` its ONNX parser imports from 11.1 (``trt_releases.PACKED_ATTENTION``). TensorRT 10.x has no
        packed attention, and the BERT demo's variable-length plugins were removed in 11.0, so a 10.x
        engine stays padded, with length-bucketed optimization profiles limiting what the padding costs.
        ``quantize``: the run's ``--quantize``; the packed TensorRT graph is built in float only (see the message).
        """
        if not self.trt_releases:
            return None
        row = self.release(trt_version)
        if row.version >= PACKED_ATTENTION:
            if quantize not in (None, "none"):  # the Q/DQ calibrator runs the graph in ONNX Runtime, which has no TRT_Attention
                return (f"--quantize {quantize} with --encoder-form packed on TensorRT: ONNX Runtime's calibrator cannot run the packed "
                        "IAttention (trt.TRT_Attention); use --encoder-form padded for an 8-bit engine, or drop --quantize")  # fmt: skip
            return None
        newer = [str(v) for v in self.trt_releases if v >= PACKED_ATTENTION]
        alt = f", or --trt-version {newer[-1]}" if newer else ""
        return (f"--encoder-form packed needs TensorRT >= {PACKED_ATTENTION} (packed IAttention from ONNX), but TensorRT {row.version} has no "
                f"packed attention; use --encoder-form padded, whose engine gets length-bucketed profiles{alt}")  # fmt: skip

    def _other_8bit(self, precision: str) -> str:
        return next((p for p in self.route_preference if p != precision), "auto")

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


# What the TensorRT targets share: ONNX Runtime CPU emulates TensorRT here, by the Q/DQ reference arithmetic.
_TENSORRT: dict[str, object] = {
    "runtime": "tensorrt",
    "emulation": "runs on TensorRT; ONNX Runtime CPU checks the exported graph's numerics here, and --build-engine "
                 "validates the engine itself on a GPU",
    "select_by": "accuracy",
    "packed_attention": "trt-packed",  # TensorRT 11's packed IAttention (packed_refusal: none on 10.x); source: trt_releases.SOURCES["packed-11.1"]
    "explicit_quantization": True,
}

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
        # per-token takes one activation range per token: batch-invariant, no calibration data, and
        # ORT CPU's most accurate all-int8 route (docs/quantization.md); dynamic (opt-in) moves a text
        # with its batch mates; weight-only (opt-in) keeps activations float: not the fastest
        route_preference={"int8": ("per-token", "static", "dynamic", "weight-only")},
        padded_only_routes={"static": "static Q/DQ around the packed form's MultiHeadAttention runs unfused on ONNX Runtime CPU: "
                                      "MiniLM's int8-static-packed took 3.46x int8-per-token-packed's time on real texts (clearly "
                                      "slower, 5 paired rounds) and 1.6x the padded int8-static's"},
        layernorm_rows=True,
        mask_free_attention=True,
        long_seq=True,
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
        providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
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
        # TensorRT takes explicit Q/DQ only; FP8 on the GPUs that have it (targets/gpu_arch.py)
        route_preference={"int8": ("static",), "fp8": ("static",)},
        **_TENSORRT,
        trt_releases=tuple(RELEASES),
        gpu_archs=tuple(a for a in ARCHS if not ARCHS[a].releases),  # the server GPUs: every release from its first
        deploys=("trt-check", "engine"),
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
        route_preference={"int8": ("static",), "fp8": ("static",)},  # FP8 on Jetson Thor (sm110)
        needs_jetpack=True,
        **_TENSORRT,
        trt_releases=tuple(v for v, r in RELEASES.items() if r.jetpack),
        gpu_archs=tuple(a for a in ARCHS if ARCHS[a].releases),  # the GPUs the JetPacks ship for
        deploys=("trt-check", "engine", "bundle"),
    ),
    "ort-tensorrt": Target(
        name="ort-tensorrt",
        opset=18,
        attention="decomposed",
        fp16_mode="builder-flag",
        int8_mode="qdq+flag",
        trt_version="10.9",
        quantize_attention_bmm=False,
        description="ONNX Runtime TensorRT EP (onnxruntime-gpu): TensorRT engines inside an ONNX Runtime session, CUDA/CPU for the rest",
        route_preference={"int8": ("static",)},  # explicit Q/DQ only; the EP has no FP8 option
        # what the EP's subgraphs fall back to; on a machine without it, ONNX Runtime CPU stands in (named in the report)
        providers=("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
        # onnxruntime-gpu 1.18-1.22 are built against TensorRT 10.0-10.9 (ONNX Runtime's TensorRT EP requirements table)
        trt_releases=tuple(v for v in RELEASES if v.major == 10 and v <= TrtVersion(10, 9)),
        gpu_archs=tuple(a for a in ARCHS if not ARCHS[a].releases),
        deploys=("trt-check", "session-options"),
        select_by="accuracy",
        packed_attention="decomposed",
        explicit_quantization=True,
        session_options="attn_export.runtime.ort_tensorrt:deployment_options",
    ),
}
DEFAULT_TARGET = "ort-cpu"


def targets_with(column: str) -> list[str]:
    """The names of the targets whose ``column`` is set (e.g. ``trt_releases``): what a refusal offers instead."""
    return [t.name for t in TARGETS.values() if getattr(t, column)]


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
    if tgt.trt_releases:  # TensorRT's parser reads the graph: held to the release's opset ceiling
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
