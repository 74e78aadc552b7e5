"""Static TensorRT compatibility check: will this ONNX parse and build, and will attention fuse?

No GPU and no TensorRT needed, so the ONNX a user hands to TensorRT can be trusted on any
machine. The checks: every op, opset and dtype against ``trt_support.OP_SUPPORT`` for the
target version; the ``Attention`` op's inputs, attributes and mask shape (IAttention wants
the mask as [B|1, H|1, Lq, Lk]); int64 tensors into ops that cannot take them; Q/DQ that
TensorRT cannot run (zero point != 0, uint8, per-channel activations); dynamic dims
against the (batch, seq) profile; and the head-size / sequence rules for fused MHA, which
are warnings, since an unfused attention still runs, only slower.

``check_trt_compat(path, "10.3")`` returns a ``CompatReport``: ``bool(report)`` is True
when there are no errors, ``str(report)`` has one finding per line with the node name.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir

from attn_export.checks.trt_attention import attention_findings, mha_fusion_findings
from attn_export.checks.trt_packed import trt_attention_rules
from attn_export.checks.trt_support import CUSTOM_OP_SUPPORT, MIN_OPSET, OP_SUPPORT, Finding, escape_text, max_opset
from attn_export.errors import CompatibilityError, ConfigError
from attn_export.targets.shape_profile import ShapeProfile
from attn_export.targets.trt_releases import TrtVersion, release
from attn_export.vocab.precisions import PRECISIONS, float_precision_of

__all__ = ["Finding", "CompatReport", "check_trt_compat", "const_array", "report_dict", "SEVERITIES"]

log = logging.getLogger(__name__)

SEVERITIES = ("error", "warning", "info")
_QUANT_OPS = ("QuantizeLinear", "DequantizeLinear")


@dataclass
class CompatReport:
    """All findings for one model and TensorRT version; truthy when nothing is an error."""

    trt_version: str
    model: str
    opset: int
    precision: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def __bool__(self) -> bool:
        return not self.errors

    def __str__(self) -> str:
        head = (
            f"{self.model}: TensorRT {self.trt_version}, opset {self.opset}, {self.precision}: "
            f"{len(self.errors)} error(s), {len(self.warnings)} warning(s)"
        )
        return "\n".join([head, *(str(f) for f in self.findings)])

    def raise_if_failed(self) -> None:
        if self.errors:
            first = self.errors[0]
            raise CompatibilityError(
                f"{self.model} cannot be built with TensorRT {self.trt_version}: {len(self.errors)} error(s), first: "
                f"{first.node} ({first.op}): {first.message}; run attn-export check-trt for the full list"
            )


def check_trt_compat(
    model_or_path: onnx.ModelProto | str | os.PathLike[str],
    trt_version: str,
    profiles: ShapeProfile | None = None,
    precision: str | None = None,
    gpu_arch: str | None = None,
) -> CompatReport:
    """Check an ONNX model against TensorRT ``trt_version`` (e.g. "10.3", "10.14", "11").

    precision: the engine precision ("fp32"|"fp16"|"int8"|"fp8"); None infers it from the graph
    (float8 Q/DQ -> fp8, other Q/DQ -> int8, fp16 MatMuls -> fp16, else fp32). gpu_arch
    (e.g. "sm90"): FP8 is checked against it (``trt_fp8``); None warns that it is unchecked.
    """
    version = release(trt_version, "--trt").version  # the tables below are written for the known releases only
    proto, name = _load(model_or_path)
    structural = _structural_findings(proto)
    if structural:  # nothing else can be trusted on a graph ONNX itself rejects: bad input, not a TensorRT verdict
        first = structural[0]
        more = f" (and {len(structural) - 1} more)" if len(structural) > 1 else ""
        raise ConfigError(f"{name} is not a valid ONNX model: {first.node or '<graph>'}: {first.message}{more}; re-export it")
    try:
        proto = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception as err:  # best effort: contrib ops have no schema in onnx
        log.debug("shape inference failed: %s", err)
    model = ir.serde.deserialize_model(proto)
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))
    precision = precision or _infer_precision(model)
    if precision not in PRECISIONS:
        raise ConfigError(f"expected precision {', '.join(tuple(PRECISIONS)[:-1])} or {tuple(PRECISIONS)[-1]}, got {precision!r}")
    report = CompatReport(str(trt_version).strip(), name, opset, precision)
    add = report.findings.append

    hi = max_opset(version)
    if not MIN_OPSET <= opset <= hi:
        add(Finding("error", "", "", f"opset {opset} is outside TensorRT {version}'s parser range {MIN_OPSET}-{hi}; re-export with --opset {min(max(opset, MIN_OPSET), hi)}"))
    max_ir = 13 if version.major >= 11 else (11 if version >= TrtVersion(10, 11) else 10)
    if proto.ir_version > max_ir:
        add(Finding("warning", "", "", f"IR version {proto.ir_version} is newer than TensorRT {version}'s ONNX ({max_ir}); re-save with an older onnx if parsing fails"))
    for value in model.graph.inputs:
        report.findings.extend(_check_io(value, profiles))
    for node in model.graph.all_nodes():
        report.findings.extend(_check_node(node, version))
    graph_fp16 = any(v.dtype == ir.DataType.FLOAT16 for v in [*model.graph.inputs, *model.graph.initializers.values()])
    strongly_typed = version.major >= 11 or graph_fp16  # plan_build's default: the precision lives in the graph
    # an FP8 graph's float parts are built as an int8 graph's are (Q/DQ + fp16 on 10.x); its MHA rules are trt_fp8's
    report.findings.extend(attention_findings(model, version, strongly_typed, "int8" if precision == "fp8" else precision))
    if precision == "fp8":
        from attn_export.checks.trt_fp8 import fp8_findings

        report.findings.extend(fp8_findings(model, version, gpu_arch))
    else:
        report.findings.extend(mha_fusion_findings(model, version, precision, profiles))
    report.findings.sort(key=lambda f: SEVERITIES.index(f.severity))
    log.info("check-trt %s for TensorRT %s: %d error(s), %d warning(s)", name, version, len(report.errors), len(report.warnings))
    return report


_MAX_VOLUME = 2**40  # elements: far beyond any tensor a GPU holds (TensorRT's own limits are lower)


def _elements(dims: list[int]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _stored_elements(t: onnx.TensorProto) -> int | None:
    """How many elements an initializer really holds (None when the data lives elsewhere)."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return None
    if t.HasField("raw_data"):
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize if t.data_type else 1
        return len(t.raw_data) // max(1, itemsize)
    for name in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        values = getattr(t, name)
        if len(values):
            return len(values) // (2 if t.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128) else 1)
    return 0


def _structural_findings(proto: onnx.ModelProto) -> list[Finding]:
    """What ONNX itself rejects, checked first: an empty graph, onnx.checker, impossible dims,
    initializers whose data does not match their dims, and Reshapes to impossible volumes.

    onnx.checker runs without ``full_check``: its strict shape inference refuses graphs whose
    value_info omits shapes, which TensorRT's parser accepts; the checks below cover what the
    full check would add for the graphs TensorRT could not build anyway."""
    out: list[Finding] = []
    if not proto.graph.node:
        out.append(Finding("error", "", "", "the graph has no nodes: there is nothing for TensorRT to build"))
    try:
        onnx.checker.check_model(proto)
    except Exception as err:  # onnx.checker.ValidationError and friends
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        if "Field 'shape' of 'type' is required" not in first:  # an input of unknown rank: TensorRT's parser takes it
            out.append(Finding("error", "", "", f"onnx.checker rejects the model: {first}"))
    for t in proto.graph.initializer:
        if any(d < 0 for d in t.dims):
            out.append(Finding("error", t.name, "initializer", f"negative dims {list(t.dims)}"))
            continue
        want, have = _elements(list(t.dims)), _stored_elements(t)
        if have is not None and want != have:
            out.append(Finding("error", t.name, "initializer", f"declares dims {list(t.dims)} ({want} elements) but holds {have}; the file is corrupt or truncated"))
    for value in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim if d.HasField("dim_value")]
        if any(d < 0 for d in dims):
            out.append(Finding("error", value.name, "value", f"negative dims {dims}"))
    constants = {t.name: t for t in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type == "Reshape" and len(node.input) > 1 and node.input[1] in constants:
            shape = onnx.numpy_helper.to_array(constants[node.input[1]]).astype("int64").ravel().tolist() if _stored_elements(constants[node.input[1]]) else []
            volume = _elements([d for d in shape if d > 0])
            if volume > _MAX_VOLUME or any(d < -1 for d in shape):
                out.append(Finding("error", node.name, "Reshape", f"reshapes to {shape}: an impossible tensor ({volume:.3g} elements)"))
    return out


def _load(model_or_path: onnx.ModelProto | str | os.PathLike[str]) -> tuple[onnx.ModelProto, str]:
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path, escape_text(model_or_path.graph.name) or "<model>"
    path = os.fspath(model_or_path)
    shown = escape_text(path)  # the name printed: one line whatever the file is called
    if not os.path.isfile(path):
        raise ConfigError(f"ONNX model {shown} does not exist; export it first or pass the right path")
    try:
        return onnx.load(path), shown
    except Exception as err:  # protobuf DecodeError and friends
        raise ConfigError(f"{shown} is not a readable ONNX model ({type(err).__name__}); re-export it") from err


def _infer_precision(model: ir.Model) -> str:
    ops = {n.op_type for n in model.graph.all_nodes()}
    if ops & set(_QUANT_OPS):
        from attn_export.checks.trt_fp8 import qdq_kinds

        return "fp8" if "FLOAT8E4M3FN" in qdq_kinds(model) else "int8"
    gemms = (n.outputs[0].dtype for n in model.graph.all_nodes() if n.op_type in ("MatMul", "Gemm", "Attention"))
    return float_precision_of(d.name for d in gemms if d is not None)


def _dtype(value: ir.Value | None) -> str | None:
    return None if value is None or value.dtype is None else value.dtype.name


def _check_io(value: ir.Value, profiles: ShapeProfile | None) -> list[Finding]:
    out: list[Finding] = []
    dt = _dtype(value)
    if dt in ("STRING", "COMPLEX64", "COMPLEX128", "UINT16", "UINT32", "UINT64", "INT16"):
        out.append(Finding("error", value.name, "input", f"graph input of type {dt} is not a TensorRT I/O type; use float, int32, int64, bool or uint8"))
    elif dt == "DOUBLE":
        out.append(Finding("warning", value.name, "input", "DOUBLE input is cast down to FLOAT by TensorRT (values clamped to +-FLT_MAX)"))
    dims = [d if isinstance(d, int) else (d.value if d is not None else None) for d in (value.shape or [])]
    if value.shape is not None and not all(isinstance(d, int) for d in dims):
        if profiles is None:
            out.append(Finding("warning", value.name, "input", f"dynamic dims {dims}: the build needs an optimization profile; pass --min-shape/--opt-shape/--max-shape"))
        else:
            try:
                mn, opt, mx = profiles.shapes_for(value.name, dims)
                out.append(Finding("info", value.name, "input", f"profile min {list(mn)} opt {list(opt)} max {list(mx)}"))
            except ConfigError as err:
                out.append(Finding("error", value.name, "input", str(err)))
    elif profiles is not None and value.shape is not None and len(dims) >= 2 and not profiles.is_static:
        out.append(Finding("warning", value.name, "input", f"static shape {dims} with a dynamic profile ({profiles}); the profile is ignored for this input"))
    return out


def _check_node(node: ir.Node, version: TrtVersion) -> list[Finding]:
    name, op, domain = node.name or "", node.op_type, node.domain or ""
    if domain not in ("", "ai.onnx"):
        sup = CUSTOM_OP_SUPPORT.get((domain, op))  # the parser's own custom ops (trt.TRT_Attention); others need a plugin
        if sup is None:
            hint = "export with --attention onnx-attention (TensorRT >= 10.14) or decomposed" if domain == "com.microsoft" else "TensorRT needs a plugin for it"
            return [Finding("error", name, f"{domain}.{op}", f"custom-domain op {domain}.{op} has no TensorRT importer; {hint}")]
        op = f"{domain}.{op}"
    else:
        sup = OP_SUPPORT.get(op)
    if sup is None:
        return [Finding("error", name, op, f"{op} is not in the TensorRT operator table; check onnx-tensorrt operators.md before building")]
    if sup.since is None:
        return [Finding("error", name, op, f"{op} is not supported by TensorRT's ONNX parser{_unsupported_hint(op)}")]
    if version < sup.since:
        return [Finding("error", name, op, f"{op} needs TensorRT >= {sup.since}, target is {version}; {_downgrade_hint(op)}")]
    out: list[Finding] = []
    if sup.types is not None:
        idx = range(len(node.inputs)) if sup.inputs == "all" else sup.inputs
        tensors = [(f"input {i}", i, node.inputs[i]) for i in idx if i < len(node.inputs)]
        if sup.outputs:
            tensors += [(f"output {i}", None, v) for i, v in enumerate(node.outputs[:1])]
        for where, index, v in tensors:
            allowed = sup.types_at(version, index if sup.inputs != "all" else 0) or frozenset()
            dt = _dtype(v)
            if dt is None or dt in allowed or (op == "DequantizeLinear" and index == 0 and _from_zero_point_free_q(v)):
                continue
            later = [f"{t} from TensorRT {since}" for since, types, inputs, _ in sup.later for t in sorted(types)
                     if since > version and dt == t and (index if index is not None else 0) in inputs]
            if later:
                out.append(Finding("error", name, op, f"{where} ({v.name}) is {dt}: {op} takes {', '.join(later)}, target is {version}"))
            elif dt == "DOUBLE":
                out.append(Finding("warning", name, op, f"{where} ({v.name}) is DOUBLE; TensorRT casts it to FLOAT"))
            elif dt == "INT64":
                out.append(Finding("error", name, op, f"int64 tensor {v.name!r} ({where}) into {op}, which TensorRT {version} runs on {', '.join(sorted(allowed))} only; Cast it to int32 or float first"))
            else:
                out.append(Finding("error", name, op, f"{where} ({v.name}) is {dt}; TensorRT {version}'s {op} takes {', '.join(sorted(allowed))}"))
    out.extend(_op_rules(node, op, name, version))
    return out


def _from_zero_point_free_q(value: ir.Value) -> bool:
    """Output of a QuantizeLinear without a zero point: uint8 by ONNX's rule, int8 in TensorRT's importer."""
    q = value.producer()
    return q is not None and q.op_type == "QuantizeLinear" and (len(q.inputs) < 3 or q.inputs[2] is None)


def _unsupported_hint(op: str) -> str:
    if op == "DynamicQuantizeLinear":
        return "; use static symmetric Q/DQ (calibrated scales) instead of dynamic quantization"
    if op in ("MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv"):
        return "; export QDQ format (QuantizeLinear/DequantizeLinear pairs) instead of QOperator format"
    return ""


def _downgrade_hint(op: str) -> str:
    if op == "Attention":
        return "export with --attention decomposed (or --target jetson) for this TensorRT"
    if op == "trt.TRT_Attention":
        return "TensorRT 10.x has no packed attention: export --encoder-form padded (length-bucketed profiles) for this TensorRT"
    return "re-export without it or target a newer TensorRT"


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The constant behind ``value`` (initializer or Constant node), else None."""
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value.numpy()
    prod = value.producer()
    if prod is not None and prod.op_type == "Constant" and "value" in prod.attributes:
        return prod.attributes["value"].as_tensor().numpy()
    return None


def _op_rules(node: ir.Node, op: str, name: str, version: TrtVersion) -> list[Finding]:
    out: list[Finding] = []
    if op == "trt.TRT_Attention":
        out.extend(trt_attention_rules(node, version))
    elif op in _QUANT_OPS:
        out.extend(_qdq_rules(node, op, name))
    elif op == "LayerNormalization" and any(o.uses() for o in node.outputs[1:]):
        out.append(Finding("error", name, op, "only LayerNormalization's first output Y is supported; drop Mean/InvStdDev outputs"))
    elif op in ("CumSum",) and const_array(node.inputs[1] if len(node.inputs) > 1 else None) is None:
        out.append(Finding("error", name, op, "CumSum axis must be a build-time constant"))
    elif op.startswith("Reduce") and len(node.inputs) > 1 and node.inputs[1] is not None and const_array(node.inputs[1]) is None:
        out.append(Finding("error", name, op, f"{op} axes must be an initializer; fold constants (onnxscript optimizer) first"))
    elif op in ("Squeeze", "Unsqueeze") and version < TrtVersion(10, 7) and len(node.inputs) > 1 and const_array(node.inputs[1]) is None:
        out.append(Finding("error", name, op, f"{op} with dynamic axes needs TensorRT >= 10.7; fold the axes to a constant"))
    return out


def _qdq_rules(node: ir.Node, op: str, name: str) -> list[Finding]:
    out: list[Finding] = []
    scale = node.inputs[1] if len(node.inputs) > 1 else None
    zp_value = node.inputs[2] if len(node.inputs) > 2 else None
    scale_arr = const_array(scale)  # a computed (non-constant) scale is accepted by TensorRT's Q/DQ importers
    if scale_arr is not None and np.any(scale_arr <= 0):
        out.append(Finding("error", name, op, "Q/DQ scale must be positive"))
    if zp_value is not None:
        zp = const_array(zp_value)
        zdt = _dtype(zp_value)
        if zdt == "UINT8":
            out.append(Finding("error", name, op, "uint8 (asymmetric) quantization is not supported by TensorRT on GPU; quantize to int8 with zero point 0"))
        if zp is None:
            out.append(Finding("error", name, op, "Q/DQ zero point must be a constant 0"))
        elif np.any(zp != 0):
            out.append(Finding("error", name, op, f"asymmetric quantization (zero point {int(np.max(np.abs(zp)))} != 0) is not supported by TensorRT; re-quantize symmetric (ActivationSymmetric=True, WeightSymmetric=True)"))
    x = node.inputs[0]
    if scale_arr is not None and scale_arr.size > 1 and const_array(x) is None:
        out.append(Finding("error", name, op, "per-channel Q/DQ on an activation; TensorRT quantizes activations per tensor (per-channel is for weights only)"))
    return out


def report_dict(report: CompatReport) -> dict[str, Any]:
    """JSON-friendly form for sidecars and bundles."""
    return {
        "trt_version": report.trt_version,
        "opset": report.opset,
        "precision": report.precision,
        "passed": bool(report),
        "findings": [asdict(f) for f in report.findings],
    }
