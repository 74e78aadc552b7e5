"""``ExportSpec``: what an ONNX export should produce, validated up front."""

from __future__ import annotations

from dataclasses import dataclass

from attn_export.errors import ConfigError
from attn_export.vocab.choices import ATTENTION_FORMS, ENCODER_FORMS, PACKED_ATTENTION_FORMS
from attn_export.vocab.precisions import precision_names

__all__ = ["ENCODER_FORMS", "ExportSpec", "PRECISIONS", "MIN_OPSET", "DEFAULT_OPSET"]

PRECISIONS: tuple[str, ...] = precision_names(export_float=True)  # the float types a graph is exported in (the vocabulary's export floats)
# "auto": the flash kernel each mask allows; "chunked": the query-block Loop for every mask.
LONG_SEQ_STRATEGIES: tuple[str, ...] = ("auto", "chunked")
# The ONNX Attention op exists from opset 23; the decomposed form runs from opset 17
# (LayerNormalization) and JetPack 6's TensorRT 10.3 parses up to opset 20.
# long-seq lowers to com.microsoft kernels plus Loop/Gather/Slice, all in opset 17.
# trt-packed's attention is the parser's own trt.TRT_Attention custom op: the rest of the graph is opset 17+.
MIN_OPSET: dict[str, int] = {"decomposed": 17, "onnx-attention": 23, "ort-contrib": 17, "long-seq": 17, "trt-packed": 17}
DEFAULT_OPSET: dict[str, int] = {"decomposed": 18, "onnx-attention": 23, "ort-contrib": 18, "long-seq": 18, "trt-packed": 18}
MAX_OPSET = 24


@dataclass(frozen=True)
class ExportSpec:
    """How to export: attention form, opset, precision, QKV fusion and dynamic axes.

    ``opset=None`` picks the form's default (18, or 23 for ``onnx-attention``).
    ``long_seq_block`` / ``long_seq_strategy`` tune the ``long-seq`` form only: the query
    rows per Loop iteration of its chunked fallback (window masks), and ``"chunked"`` to
    force that fallback for every mask instead of the flash kernels (for measurements).
    ``linear_gemm`` writes row-wise Linears as 2-D Gemm with the bias fused
    (``export.linear_gemm``); ``None`` = on for ``long-seq`` only. Turn it off for a graph
    that ONNX Runtime's dynamic int8 quantizer will process (it quantizes MatMul, not Gemm);
    off, 2-D Linears are written as MatMul + Add too (``export.linear_gemm.gemm_to_linear``).
    ``encoder_form`` applies to whole encoders (``checkpoint.export``): ``"padded"`` runs the
    (B, S) grid, ``"packed"`` only the real tokens (``layers.packed``), with the attention
    form ``decomposed`` or ``ort-contrib``. ``mask_free_attention`` moves the packed form's
    key-length mask of ``ort-contrib`` into one Q/K channel per head, so ONNX Runtime's CPU flash
    kernel runs it (``export.mask_free_attention``).
    """

    attention: str = "decomposed"
    opset: int | None = None
    precision: str = "fp32"
    fuse_qkv: bool = True
    dynamic_batch: bool = True
    dynamic_seq: bool = True
    example_batch: int = 2
    example_seq: int = 16
    long_seq_block: int = 256
    long_seq_strategy: str = "auto"
    linear_gemm: bool | None = None
    encoder_form: str = "padded"
    layernorm_rows: bool = False  # residual Add + LayerNorm on 2-D rows: no SkipLayerNormalization in a plain ORT CPU session
    mask_free_attention: bool = False  # the packed form's MultiHeadAttention masked through Q/K channels: ORT CPU's flash kernel

    def __post_init__(self) -> None:
        if self.attention not in (*ATTENTION_FORMS, *PACKED_ATTENTION_FORMS):
            raise ConfigError(f"expected --attention in {', '.join(ATTENTION_FORMS)}, got {self.attention!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"expected --precision in {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.opset is not None:
            lo = MIN_OPSET[self.attention]
            if not lo <= self.opset <= MAX_OPSET:
                raise ConfigError(
                    f"expected --opset between {lo} and {MAX_OPSET} for attention form {self.attention!r}, "
                    f"got {self.opset}; use --opset {DEFAULT_OPSET[self.attention]}"
                )
        if self.long_seq_block < 1:
            raise ConfigError(f"expected a positive long_seq_block, got {self.long_seq_block}; use 256")
        if self.long_seq_strategy not in LONG_SEQ_STRATEGIES:
            raise ConfigError(
                f"expected long_seq_strategy in {', '.join(LONG_SEQ_STRATEGIES)}, got {self.long_seq_strategy!r}"
            )
        if self.encoder_form not in ENCODER_FORMS:
            raise ConfigError(f"expected encoder form in {', '.join(ENCODER_FORMS)}, got {self.encoder_form!r}; use padded")
        if self.encoder_form == "packed" and self.attention not in PACKED_ATTENTION_FORMS:
            raise ConfigError(
                f"expected --attention {', '.join(PACKED_ATTENTION_FORMS)} for the packed encoder form, got {self.attention!r}; "
                "use ort-contrib on ONNX Runtime, trt-packed on TensorRT 11, decomposed elsewhere"
            )
        if self.attention == "trt-packed" and self.encoder_form != "packed":
            raise ConfigError("--attention trt-packed attends the packed encoder's real tokens only; add --encoder-form packed "
                              "(a --checkpoint run) or pick another --attention")  # fmt: skip
        if self.example_batch < 1 or self.example_seq < 1:
            raise ConfigError(
                f"expected positive example shapes, got batch={self.example_batch}, seq={self.example_seq}"
            )

    @property
    def resolved_linear_gemm(self) -> bool:
        return self.linear_gemm if self.linear_gemm is not None else self.attention == "long-seq"

    @property
    def resolved_opset(self) -> int:
        return self.opset if self.opset is not None else DEFAULT_OPSET[self.attention]
