"""check-trt's FP8 rules: will TensorRT build this FP8 Q/DQ graph for this release and GPU architecture?

``fp8_findings(model, version, arch)`` adds to ``check_trt_compat``'s findings for a graph whose
Q/DQ are ``float8e4m3fn``; each finding names its source:

* the release must parse FP8 Q/DQ (ONNX-TensorRT since 9.0: every release the table covers);
* the GPU must have FP8 tensor cores (``gpu_arch.supports``: SM 8.9 Ada, 9.0 Hopper,
  Blackwell from TensorRT 10.8); Jetson Orin (sm87), Ampere and Turing are errors, an
  unknown architecture a warning;
* opset >= 19 (float8 QuantizeLinear);
* ``saturate=0`` is a warning: TensorRT always clips to +-448 (castToFp8(clip(x/s, -448, 448)),
  TensorRT "Quantization Schemes"), ONNX Runtime with saturate=0 overflows to NaN;
* int8 and FP8 Q/DQ in one graph cannot be built weakly typed on 10.x (trtexec refuses
  ``--fp8`` with ``--int8``);
* FP8 attention BMMs (FP8 MHA) fuse only for head sizes 9-256 (ModelOpt's FP8 fMHA v2 rule,
  ``modelopt/onnx/quantization/quantize.py``), else the attention runs unfused: a warning.
"""

from __future__ import annotations

import logging

import onnx_ir as ir

from attn_export.checks.trt_support import Finding
from attn_export.targets.trt_releases import TrtVersion

__all__ = ["FP8_MHA_HEAD_SIZES", "FP8_PARSER_SINCE", "fp8_findings", "qdq_kinds"]

log = logging.getLogger(__name__)

FP8_PARSER_SINCE = TrtVersion(9, 0)  # onnx-tensorrt docs/Changelog.md, 9.0 GA: 'Added support for FP8 and BF16 datatypes'
FP8_MHA_HEAD_SIZES = range(9, 257)  # ModelOpt: no FP8 MHA Q/DQ 'if head_size > 256 or head_size <= 8'
_FP8 = "FLOAT8E4M3FN"


def _kind(node: ir.Node) -> str | None:
    zp = node.inputs[2] if len(node.inputs) > 2 else None
    if zp is not None and zp.dtype is not None:
        return zp.dtype.name
    data = node.outputs[0] if node.op_type == "QuantizeLinear" else node.inputs[0]
    return data.dtype.name if data is not None and data.dtype is not None else None


def qdq_kinds(model: ir.Model) -> dict[str, int]:
    """Quantized type -> number of QuantizeLinear/DequantizeLinear nodes of it (e.g. {"FLOAT8E4M3FN": 12})."""
    out: dict[str, int] = {}
    for node in model.graph.all_nodes():
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and not node.domain:
            k = _kind(node) or "UNKNOWN"
            out[k] = out.get(k, 0) + 1
    return out


def fp8_findings(model: ir.Model, version: TrtVersion, arch: str | None = None) -> list[Finding]:
    """The FP8-specific findings for ``model`` on TensorRT ``version`` and GPU ``arch`` (None: not known)."""
    from attn_export.targets.gpu_arch import archs_with, parse_gpu_arch, supports

    kinds = qdq_kinds(model)
    if _FP8 not in kinds:
        return []
    out: list[Finding] = []
    if version < FP8_PARSER_SINCE:
        out.append(Finding("error", "", "QuantizeLinear", f"TensorRT {version} cannot parse float8 Q/DQ (the ONNX parser reads FP8 from 9.0)"))
    opset = int(model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0)))
    if opset < 19:
        out.append(Finding("error", "", "QuantizeLinear", f"float8 QuantizeLinear needs opset >= 19, the graph is opset {opset}; re-export with --opset 19 or higher"))
    have = ", ".join(archs_with("fp8"))
    if arch is None:
        out.append(Finding("warning", "", "QuantizeLinear", f"FP8 engines build only for GPUs with FP8 tensor cores ({have}); pass --gpu-arch to check against yours"))
    else:
        s = supports(parse_gpu_arch(arch), "fp8", version)
        if s.status != "yes":
            severity = "error" if s.status == "no" else "warning"
            out.append(Finding(severity, "", "QuantizeLinear", f"FP8 graph for --gpu-arch {arch}, TensorRT {version}: {s.reason} [{', '.join(s.sources)}]; quantize with --quantize int8 for this GPU"))
        else:
            out.append(Finding("info", "", "QuantizeLinear", f"FP8 on {arch}: {s.reason} [{', '.join(s.sources)}]"))
    ints = {k: n for k, n in kinds.items() if k in ("INT8", "UINT8")}
    if ints and version.major < 11:
        out.append(Finding("warning", "", "QuantizeLinear", f"int8 and FP8 Q/DQ in one graph ({ints} and {kinds[_FP8]}): TensorRT {version} cannot build both weakly typed "
                                                          "(trtexec refuses --fp8 with --int8); build strongly typed"))  # fmt: skip
    for node in model.graph.all_nodes():
        if node.op_type == "QuantizeLinear" and _kind(node) == _FP8:
            sat = node.attributes.get("saturate")
            if sat is not None and sat.as_int() == 0:
                out.append(Finding("warning", node.name or "", "QuantizeLinear", "saturate=0: TensorRT always clips FP8 to +-448, ONNX Runtime overflows to NaN; "
                                                                                 "the CPU judgement differs from the engine beyond 448 (set saturate=1)"))  # fmt: skip
    out.extend(_mha_findings(model))
    return out


def _mha_findings(model: ir.Model) -> list[Finding]:
    from attn_export.checks.trt_attention import find_attention_blocks

    out = []
    for blk in find_attention_blocks(model):
        if blk.quantized and blk.head_size is not None and blk.head_size not in FP8_MHA_HEAD_SIZES:
            out.append(Finding("warning", blk.node, "Softmax", f"head size {blk.head_size}: FP8 fused MHA covers head sizes 9-256; this attention will run unfused "
                                                               "(leave the BMMs float: quantize_attention_bmm=False)"))  # fmt: skip
    return out
