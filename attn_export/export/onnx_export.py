"""Export a layer to ONNX with torch.onnx (dynamo exporter) and report what landed in the graph.

The exporter works on a copy: Q/K/V are fused into one GEMM, the attention form is chosen
(see ``attn_export.layers.attention``), and for a reduced float (fp16, bf16: the precision's own dtype) the weights are cast while the
layers' own code keeps the masked softmax and LayerNorm in float32 islands. The written
file is checked with ``onnx.checker(full_check=True)`` before it is moved into place.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from attn_export.outdir.atomic import atomic_path
from attn_export.host.quiet import EXPORT_NOISE, quieted
from attn_export.errors import ExportError
from attn_export.export.inspect import GraphSummary, summarize_graph
from attn_export.export.passes.linear_gemm import gemm_to_linear, linear_to_gemm
from attn_export.export.forms.long_seq import LongSeqLowering, lower_long_seq
from attn_export.export.forms.trt_packed import FORM_PASSES
from attn_export.export.passes.mask_free_attention import mask_free_attention
from attn_export.export.passes.row_layernorm import layernorm_on_rows
from attn_export.export.spec import ExportSpec
from attn_export.layers.disentangled import DisentangledSelfAttention
from attn_export.layers.position_bias import RelativePositionBias
from attn_export.layers.projections import fuse_qkv_, set_attention_form_
from attn_export.layers.registry import MaskedLayer
from attn_export.vocab.precisions import PRECISIONS

__all__ = ["ExportResult", "export_onnx", "export_module", "example_inputs_for"]

log = logging.getLogger(__name__)


@dataclass
class ExportResult:
    """What the exporter produced, for the report and for humans."""

    path: str
    attention: str
    opset: int
    precision: str
    qkv_fused: int
    attention_blocks: int
    fused_attention: int
    fp32_islands: list[dict[str, str]] = field(default_factory=list)
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    size_bytes: int = 0
    attention_kernels: dict[str, int] = field(default_factory=dict)  # long-seq: kernel -> blocks
    linear_gemms: int = 0  # row-wise Linears written as 2-D Gemm (export.linear_gemm)
    layernorm_rows: int = 0  # residual Add + LayerNorm pairs run on 2-D rows (export.row_layernorm)
    mask_free_attention: int = 0  # MultiHeadAttentions masked through Q/K channels (export.mask_free_attention)
    summary: GraphSummary | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("summary", None)
        return d

    def describe(self) -> str:
        islands = ", ".join(f"{i['op']}[{i['input_dtype']}->{i['output_dtype']}]" for i in self.fp32_islands[:4])
        more = f" (+{len(self.fp32_islands) - 4})" if len(self.fp32_islands) > 4 else ""
        kernels = ", ".join(f"{n} x {k}" for k, n in sorted(self.attention_kernels.items()))
        return (
            f"{self.attention} attention, opset {self.opset}, {self.precision}: "
            f"{self.fused_attention}/{self.attention_blocks} attention blocks fused, "
            + (f"lowered to {kernels}, " if kernels else "")
            + (f"{self.linear_gemms} Linears as Gemm, " if self.linear_gemms else "")
            + (f"{self.layernorm_rows} Add+LayerNorm on rows, " if self.layernorm_rows else "")
            + (f"{self.mask_free_attention} attentions mask-free (flash), " if self.mask_free_attention else "")
            + f"QKV fused in {self.qkv_fused}, islands: {islands or 'none'}{more}"
        )


def example_inputs_for(layer: MaskedLayer, batch: int, seq: int, d_model: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random x (B, L, D) and, for padding masks, a key_padding_mask (B, L) int32 with padded tails."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, d_model, generator=g).to(dtype)
    if layer.mask != "padding":
        return (x,)
    lengths = torch.randint(max(1, seq // 2), seq + 1, (batch,), generator=g)
    kpm = (torch.arange(seq)[None, :] < lengths[:, None]).to(torch.int32)  # (B, L), 1 = keep
    return (x, kpm)


def export_onnx(layer: MaskedLayer, path: str | os.PathLike[str], spec: ExportSpec | None = None) -> ExportResult:
    """Export a reference layer (wrapped in ``MaskedLayer``) with dynamic batch and sequence."""
    spec = spec or ExportSpec()
    d_model = _d_model_of(layer)
    example = example_inputs_for(layer, spec.example_batch, spec.example_seq, d_model, io_dtype(spec.precision))
    names = layer.input_names
    axes = {n: {0: "batch", 1: "seq"} for n in names}
    return export_module(layer, path, spec, example, names, ["y"], axes)


def io_dtype(precision: str) -> torch.dtype:
    """The float type of a graph's inputs and outputs: the precision's own where numpy holds it (fp16),
    else float32 cast to it at the graph's edges (bf16), so every runner (ONNX Runtime, the TensorRT
    runner, the on-device validator) feeds and reads it with numpy."""
    name = PRECISIONS[precision].torch_dtype
    return getattr(torch, name if hasattr(np, name) else "float32")


class _CastAtEdges(nn.Module):
    """``inner`` with its float inputs cast to ``dtype`` and its float outputs back to float32."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.inner, self.dtype = inner, dtype

    def forward(self, *args: Any) -> Any:
        out = self.inner(*(a.to(self.dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args))
        return _to_float32(out)


def _to_float32(out: Any) -> Any:
    if torch.is_tensor(out):
        return out.float() if out.is_floating_point() else out
    if isinstance(out, dict):
        return {k: _to_float32(v) for k, v in out.items()}
    if isinstance(out, (tuple, list)):
        return type(out)(_to_float32(v) for v in out)
    return out


def _d_model_of(layer: nn.Module) -> int:
    for mod in layer.modules():
        if hasattr(mod, "d_model"):
            return int(mod.d_model)
    raise ExportError("cannot find d_model on the layer; pass a reference layer from attn_export.layers")


def _has_score_bias(module: torch.nn.Module) -> bool:
    """A relative position bias (MPNet) or disentangled terms (DeBERTa): scores the long-seq kernels cannot take."""
    return isinstance(module, RelativePositionBias) or (isinstance(module, DisentangledSelfAttention) and module.relative is not None)


def export_module(
    model: nn.Module,
    path: str | os.PathLike[str],
    spec: ExportSpec,
    example_inputs: tuple[torch.Tensor, ...],
    input_names: list[str],
    output_names: list[str],
    dynamic_axes: dict[str, dict[int, str]],
) -> ExportResult:
    """Export any module built from the reference layers; the generic core of ``export_onnx``."""
    path = Path(path)
    if spec.attention == "long-seq" and any(_has_score_bias(m) for m in model.modules()):
        raise ExportError("expected attention without a score bias for --attention long-seq (its kernels take none), "
                          "got a relative position bias (MPNet, DeBERTa); use --attention decomposed or ort-contrib")
    work = copy.deepcopy(model).eval()
    qkv_fused = fuse_qkv_(work) if spec.fuse_qkv else 0
    set_attention_form_(work, spec.attention)
    if spec.precision != "fp32":  # weights and activations in the export float; the layers keep their float32 islands
        dtype = getattr(torch, PRECISIONS[spec.precision].torch_dtype)
        work = work.to(dtype)
        if io_dtype(spec.precision) != dtype:
            work = _CastAtEdges(work, dtype)
    dims: dict[str, torch.export.Dim] = {}

    def dim(name: str) -> Any:
        if name == "batch" and not spec.dynamic_batch or name == "seq" and not spec.dynamic_seq:
            return None
        if name not in dims:
            dims[name] = torch.export.Dim(name, min=1, max=65536)
        return dims[name]

    dynamic_shapes = tuple({ax: dim(n) for ax, n in dynamic_axes.get(name, {}).items() if dim(n) is not None} or None for name in input_names)
    if isinstance(work, _CastAtEdges):  # its forward takes *args: torch.export sees them as one input
        dynamic_shapes = (dynamic_shapes,)
    opset = spec.resolved_opset
    try:
        with atomic_path(path) as tmp, quieted(EXPORT_NOISE):  # the exporter's and onnxscript's own logs, restored after
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                program = torch.onnx.export(
                    work,
                    example_inputs,
                    dynamo=True,
                    opset_version=opset,
                    input_names=input_names,
                    output_names=output_names,
                    dynamic_shapes=dynamic_shapes,
                    optimize=True,
                    verbose=False,
                )
            if program is None:
                raise ExportError("torch.onnx.export returned no program")
            lowering = None
            if spec.attention == "long-seq":  # placeholders -> ONNX Runtime kernels (export/long_seq.py)
                lowering = lower_long_seq(program.model, query_block=spec.long_seq_block, strategy=spec.long_seq_strategy)
            if (form_pass := FORM_PASSES.get(spec.attention)) is not None:  # the form's own last touch (export/forms/)
                form_pass(program.model)
            linear_gemms = linear_to_gemm(program.model) if spec.resolved_linear_gemm else 0
            if not spec.resolved_linear_gemm:
                gemm_to_linear(program.model)  # 2-D Linears (packed rows) as MatMul + Add: what the int8 quantizer reads
            rows = layernorm_on_rows(program.model) if spec.layernorm_rows else 0  # no SkipLayerNormalization in a plain ORT CPU session
            mask_free = mask_free_attention(program.model) if spec.mask_free_attention and spec.attention == "ort-contrib" else 0
            program.save(str(tmp), external_data=False)
            proto = onnx.load(str(tmp))
            proto.producer_name = "attn-export"
            _set_metadata(proto, {"attn_export.attention": spec.attention, "attn_export.precision": spec.precision})
            try:
                onnx.checker.check_model(proto, full_check=True)
            except onnx.checker.ValidationError as err:
                raise ExportError(f"exported graph fails onnx.checker: {str(err).splitlines()[0]}") from err
            summary = summarize_graph(proto)
            if lowering is not None:
                _check_all_lowered(summary, lowering)
            onnx.save(proto, str(tmp))
    except ExportError:
        raise
    except Exception as err:
        _reraise_outside_export(err, path)
        # torch.export / onnx errors are long and may carry terminal colour codes; keep the first line
        text = _ANSI.sub("", str(err)).strip()
        first = text.splitlines()[0] if text else type(err).__name__
        hint = "; try --attention decomposed" if spec.attention != "decomposed" else "; this is a bug in attn-export or torch.onnx: please report it with the command line"
        raise ExportError(f"ONNX export failed ({type(err).__name__}: {first}){hint}") from err
    blocks, fused = summary.attention_blocks, summary.fused_attention
    if lowering is not None and lowering.replaced:
        # One block may lower to several kernel nodes (If branches, Loop bodies): count blocks.
        blocks, fused = lowering.replaced, lowering.fused
    result = ExportResult(
        path=str(path),
        attention=spec.attention,
        opset=summary.opset,
        precision=spec.precision,
        qkv_fused=qkv_fused,
        attention_blocks=blocks,
        fused_attention=fused,
        fp32_islands=[asdict(i) for i in summary.islands],
        input_names=[i.name for i in proto.graph.input],
        output_names=[o.name for o in proto.graph.output],
        size_bytes=path.stat().st_size,
        attention_kernels=dict(lowering.kernels) if lowering is not None else {},
        linear_gemms=linear_gemms,
        layernorm_rows=rows,
        mask_free_attention=mask_free,
        summary=summary,
    )
    if spec.attention not in ("decomposed", "long-seq") and result.fused_attention == 0 and result.attention_blocks:
        log.warning("attention form %s requested but no fused attention op was emitted", spec.attention)
    log.info("exported %s: %s", path, result.describe())
    return result


def _check_all_lowered(summary: GraphSummary, lowering: LongSeqLowering) -> None:
    """Every attention block must have become a long-seq kernel: none left decomposed.

    A mask the layer cannot split into key padding / causal / window parts makes ``attend``
    refuse the placeholder, and torch.onnx then retries with a capture strategy that runs the
    eager math path: the graph comes back decomposed, O(L^2), with the error swallowed.
    """
    chunked = lowering.replaced - lowering.fused  # their Loop bodies hold a Softmax block each
    left = summary.attention_blocks - summary.fused_attention - chunked
    if left > 0:
        raise ExportError(
            f"expected every attention block lowered to long-seq kernels, got {left} left as O(L^2) MatMul-Softmax; "
            "a dense (Lq, Lk) mask cannot be split into key padding / causal / window parts; use --attention decomposed"
        )


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def _reraise_outside_export(err: BaseException, path: Path) -> None:
    """Failures that are not the exporter's: never blamed on the attention form.

    torch.onnx wraps whatever happens while it traces, including a Ctrl-C / SIGTERM (a
    ``TorchExportError`` whose cause is the ``KeyboardInterrupt``) and a full disk. An
    interrupt is re-raised as itself; an ``OSError`` (no space, no permission, read-only
    disk) and a ``MemoryError`` are re-raised as what they are, naming the file.
    """
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if not isinstance(cause, Exception):  # KeyboardInterrupt, SIGTERM's exception, SystemExit
            raise cause
        if isinstance(cause, OSError):
            what = cause.strerror or type(cause).__name__
            raise ExportError(f"writing {path} failed: {what}; free disk space or pass a writable --out") from err
        if isinstance(cause, MemoryError):
            raise ExportError(f"out of memory while exporting {path.name}; lower --batch/--seq-len or --d-model") from err
        cause = cause.__cause__ or cause.__context__


def _set_metadata(proto: onnx.ModelProto, props: dict[str, str]) -> None:
    existing = {p.key: p for p in proto.metadata_props}
    for k, v in props.items():
        if k in existing:
            existing[k].value = v
        else:
            proto.metadata_props.add(key=k, value=v)
