"""What TensorRT's ONNX parser accepts, per version: the maintained table behind ``check-trt``.

Every row says which TensorRT version it was checked against and where the claim comes
from (``OpSupport.checked``/``source``): ONNX-TensorRT ``docs/operators.md`` of a release
branch (10.15: opset 9-24, supported types and restrictions per op), or the changelog line
of the release an importer or a type landed in (``Attention`` in 10.14, FP4
``DequantizeLinear`` and integer ``Pow`` exponents in 10.8, integer ``Pow`` bases in
10.12, ``RMSNormalization``/``RotaryEmbedding`` in 10.15, ``Swish`` in 11.0, ``DFT`` in
11.2). The table covers every op the toolkit emits plus the common ones; an op missing
from it is reported as unknown, never silently accepted.

Types are ONNX dtype names as onnx_ir spells them (FLOAT, FLOAT16, INT64...). ``inputs``
says which inputs carry the op's data type T (shape/axes/index/condition inputs are not
checked against T), ``outputs`` whether outputs must be in T as well.
"""

from __future__ import annotations

from dataclasses import dataclass

from attn_export.targets.trt_releases import RELEASES, TRT_ATTENTION_OP, TrtVersion
from attn_export.targets.trt_releases import SOURCES as RELEASE_SOURCES

__all__ = ["escape_text", "Finding", "OpSupport", "OP_SUPPORT", "CUSTOM_OP_SUPPORT", "max_opset", "MIN_OPSET", "OPERATORS_MD", "OPSET_SOURCES", "CHANGELOG"]

F = frozenset({"FLOAT", "FLOAT16", "BFLOAT16"})
FI = F | {"INT32", "INT64"}
FIB = FI | {"BOOL"}
B = frozenset({"BOOL"})
Q8_IN = frozenset({"INT8", "FLOAT8E4M3FN", "INT4"})  # DequantizeLinear x (FP4 from 10.8, below)
INTS = frozenset({"INT32", "INT64"})
V10 = TrtVersion(10, 0)
MIN_OPSET = 9

# Where a row's claim comes from. OPERATORS_MD is the operator matrix the table was written
# from; the changelog lines are NVIDIA/TensorRT CHANGELOG.md (main) and release notes.
OPERATORS_MD = "onnx-tensorrt docs/operators.md (release/10.15)"
TABLE_CHECKED = TrtVersion(10, 15)
CHANGELOG = "NVIDIA/TensorRT CHANGELOG.md"


def escape_text(text: str) -> str:
    """``text`` with every character ``repr`` would escape (control, format and line-separator characters) written as ``repr``
    writes it (``\\n``, ``\\x1b``, ``\\u2028``), the rest as is: one line, whatever a name in the file holds."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


@dataclass(frozen=True)
class Finding:
    """One result of the static check, printed as one line with the node name."""

    severity: str  # "error" | "warning" | "info"
    node: str
    op: str
    message: str

    def __post_init__(self) -> None:
        # node names, op types and the names quoted in messages come from the user's ONNX file: a name with a
        # newline (or a terminal code) must not start a line of its own, so one finding stays one line
        for name in ("node", "op", "message"):
            object.__setattr__(self, name, escape_text(getattr(self, name)))

    def __str__(self) -> str:
        return f"{self.severity.upper():7s} {self.node or '<graph>'} ({self.op or '-'}): {self.message}"


@dataclass(frozen=True)
class OpSupport:
    """One operator: since when TensorRT imports it, the types it takes, and the source of that.

    ``later`` lists types gained after ``since``: ``(version, types, inputs, source)``.
    """

    since: TrtVersion | None  # None: no importer in any supported version
    types: frozenset[str] | None = None  # allowed dtypes of the checked tensors; None = unchecked
    inputs: tuple[int, ...] | str = (0,)  # indices carrying T, or "all"
    outputs: bool = True
    note: str = ""
    checked: TrtVersion = TABLE_CHECKED  # the TensorRT version the row was checked against
    source: str = OPERATORS_MD
    later: tuple[tuple[TrtVersion, frozenset[str], tuple[int, ...], str], ...] = ()

    def types_at(self, version: TrtVersion, index: int | None) -> frozenset[str] | None:
        """Allowed types of input ``index`` (None: the output) on ``version``."""
        if self.types is None:
            return None
        out = set(self.types)
        for since, types, inputs, _ in self.later:
            if version >= since and (index if index is not None else 0) in inputs:
                out |= types
        return frozenset(out)


def _s(
    types: frozenset[str] | None,
    inputs: tuple[int, ...] | str = (0,),
    since: TrtVersion = V10,
    outputs: bool = True,
    note: str = "",
    source: str = OPERATORS_MD,
    checked: TrtVersion = TABLE_CHECKED,
    later: tuple[tuple[TrtVersion, frozenset[str], tuple[int, ...], str], ...] = (),
) -> OpSupport:
    return OpSupport(since, types, inputs, outputs, note, checked, source, later)


_NO = OpSupport(None)
_BIN = (0, 1)

OP_SUPPORT: dict[str, OpSupport] = {
    # elementwise / activations
    "Abs": _s(FI), "Acos": _s(F), "Acosh": _s(F), "Asin": _s(F), "Asinh": _s(F), "Atan": _s(F), "Atanh": _s(F),
    "Add": _s(FI, _BIN), "Sub": _s(FI, _BIN), "Mul": _s(FI, _BIN), "Div": _s(FI, _BIN), "Mod": _s(FI, _BIN),
    "Pow": _s(F, _BIN, later=(
        (TrtVersion(10, 8), INTS, (1,), f"{CHANGELOG}, 10.8.0 GA: 'Added support for Pow ops with integer-typed exponent values'"),
        (TrtVersion(10, 12), INTS, (0,), f"{CHANGELOG}, 10.12.0 GA: 'Added support for integer-typed base tensors for Pow operations'"),
    )),
    "Max": _s(FI, "all"), "Min": _s(FI, "all"), "Sum": _s(FI, "all"), "Mean": _s(FI, "all"),
    "Neg": _s(FI), "Sign": _s(FI), "Relu": _s(FI), "Ceil": _s(F), "Floor": _s(F), "Round": _s(F),
    "Reciprocal": _s(F), "Sqrt": _s(F), "Exp": _s(F), "Log": _s(F), "Erf": _s(F), "Sin": _s(F), "Cos": _s(F),
    "Tan": _s(F), "Sinh": _s(F), "Cosh": _s(F), "Tanh": _s(F), "Sigmoid": _s(F), "HardSigmoid": _s(F),
    "HardSwish": _s(F), "Elu": _s(F), "Selu": _s(F), "Celu": _s(F), "LeakyRelu": _s(F), "PRelu": _s(F, _BIN),
    "Softplus": _s(F), "Softsign": _s(F), "ThresholdedRelu": _s(F), "Mish": _s(F), "Gelu": _s(F),
    "Swish": _s(F, since=TrtVersion(11, 0), checked=TrtVersion(11, 0), source=f"{CHANGELOG}, 11.0 GA: 'Added support for `Swish` operator'"),
    "Clip": _s(F), "IsNaN": _s(FI, outputs=False), "IsInf": _s(F, outputs=False),
    "And": _s(B, _BIN), "Or": _s(B, _BIN), "Xor": _s(B, _BIN), "Not": _s(B),
    "Equal": _s(FI, _BIN, outputs=False), "Greater": _s(FI, _BIN, outputs=False),
    "GreaterOrEqual": _s(FI, _BIN, outputs=False), "Less": _s(FI, _BIN, outputs=False),
    "LessOrEqual": _s(FI, _BIN, outputs=False), "Where": _s(FIB, (1, 2)),
    "Cast": _s(FIB | {"UINT8"}, outputs=True), "CastLike": _s(FIB | {"UINT8"}, (0,)),
    # linear algebra and normalisation
    "MatMul": _s(F, _BIN), "Gemm": _s(F, _BIN), "Einsum": _s(F, "all"),
    "Softmax": _s(F), "LogSoftmax": _s(F),
    "LayerNormalization": _s(F, (0,), note="only the first output Y is supported"),
    "GroupNormalization": _s(F), "InstanceNormalization": _s(F), "BatchNormalization": _s(F),
    "LpNormalization": _s(F), "MeanVarianceNormalization": _s(F),
    "RMSNormalization": _s(F, since=TrtVersion(10, 15), source=f"{CHANGELOG}, 10.15 GA: 'Added support for RotaryEmbedding, RMSNormalization and TensorScatter'"),
    "RotaryEmbedding": _s(F, since=TrtVersion(10, 15), source=f"{CHANGELOG}, 10.15 GA: 'Added support for RotaryEmbedding, RMSNormalization and TensorScatter'"),
    "Attention": _s(F, (0, 1, 2), since=TrtVersion(10, 14), checked=TrtVersion(10, 14), note="ONNX Attention -> IAttention (not decomposable)",
                    source=f"{CHANGELOG}, 10.14 GA: 'Added support for the `Attention` operator'; NvInfer.h (release/10.14) IAttention: query/key/value kFLOAT, kHALF or kBF16"),
    "Dropout": _s(F, outputs=False, note="is_training must be a constant False"),
    "CumSum": _s(F, (0,), note="axis must be a build-time constant"),
    # reductions (axes must be an initializer)
    **{op: _s(FI, (0,), note="axes must be an initializer") for op in (
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
        "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare")},
    "ArgMax": _s(FI, outputs=False), "ArgMin": _s(FI, outputs=False), "TopK": _s(FI, outputs=False),
    # shape and data movement
    "Shape": _s(None), "Size": _s(None), "Constant": _s(None), "ConstantOfShape": _s(None),
    "Identity": _s(FIB), "Reshape": _s(FIB), "Flatten": _s(FIB), "Transpose": _s(FIB),
    "Squeeze": _s(FIB), "Unsqueeze": _s(FIB), "Expand": _s(FIB), "Tile": _s(FIB), "Concat": _s(FIB, "all"),
    "Split": _s(FIB), "Slice": _s(FIB), "Gather": _s(FIB), "GatherElements": _s(FIB), "GatherND": _s(FIB),
    "ScatterElements": _s(FI), "ScatterND": _s(FI), "Pad": _s(FI), "Range": _s(FI, "all"), "Trilu": _s(FIB),
    "OneHot": _s(None), "NonZero": _s(F, outputs=False), "DepthToSpace": _s(FI), "SpaceToDepth": _s(FI),
    "ReverseSequence": _s(FIB), "If": _s(None), "Loop": _s(None), "Scan": _s(None),
    # vision (common)
    "Conv": _s(F, _BIN), "ConvTranspose": _s(F, _BIN), "MaxPool": _s(F), "AveragePool": _s(F),
    "GlobalAveragePool": _s(F), "GlobalMaxPool": _s(F), "Resize": _s(F), "GridSample": _s(F),
    **{op: _s(None, since=TrtVersion(10, 4), checked=TrtVersion(10, 4),
              source="onnx-tensorrt docs/Changelog.md, 10.4 GA: 'Added support for BlackmanWindow, HammingWindow, and HannWindow operations'")
       for op in ("BlackmanWindow", "HannWindow", "HammingWindow")},
    "STFT": _s(F, since=TrtVersion(10, 5), checked=TrtVersion(10, 5), source="onnx-tensorrt docs/Changelog.md, 10.5 GA: 'Added support for real-valued STFT operations'"),
    "TensorScatter": _s(F | {"INT32"}, since=TrtVersion(10, 15), source=f"{CHANGELOG}, 10.15 GA: 'Added support for RotaryEmbedding, RMSNormalization and TensorScatter'"),
    "DFT": _s(F, since=TrtVersion(11, 2), checked=TrtVersion(11, 2), source="TensorRT 11.2.1 release notes: 'ONNX DFT operator support: Adds a cuFFT-based plugin for the ONNX DFT operator'"),
    # explicit quantization (symmetric, zero point 0; checked in detail by trt_compat)
    "QuantizeLinear": _s(F, (0,), outputs=False, note="y_zero_point must be 0"),
    "DequantizeLinear": _s(Q8_IN, (0,), outputs=False, note="x_zero_point must be 0", later=(
        (TrtVersion(10, 8), frozenset({"FLOAT4E2M1"}), (0,), f"{CHANGELOG}, 10.8.0 GA: 'Added support for FLOAT4E2M1 types for quantized networks'"),
    )),
    # no importer
    **{op: _NO for op in (
        "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul",
        "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor", "Compress", "ConcatFromSequence",
        "Det", "MaxRoiPool", "MaxUnpool", "Multinomial", "NegativeLogLikelihoodLoss", "Optional",
        "OptionalGetElement", "OptionalHasElement", "SequenceAt", "SequenceConstruct", "SequenceEmpty",
        "SequenceErase", "SequenceInsert", "SequenceLength", "SequenceMap", "SoftmaxCrossEntropyLoss",
        "SplitToSequence", "StringNormalizer", "StringConcat", "StringSplit", "RegexFullMatch",
        "TfIdfVectorizer", "Unique", "Col2Im", "CenterCropPad", "AffineGrid", "ImageDecoder", "Bernoulli")},
}


# Ops of custom domains the parser imports itself (no plugin), by (domain, op): the TensorRT parser's own "trt" ops
# (onnx-tensorrt docs/TRT_custom_ops.md). Any other custom-domain op needs a plugin and is an error.
CUSTOM_OP_SUPPORT: dict[tuple[str, str], OpSupport] = {
    ("trt", "TRT_Attention"): _s(F, (0, 1, 2), since=TRT_ATTENTION_OP, checked=TrtVersion(11, 4),
                                 note="IAttention with padded, or from 11.1 packed (PACKED_NHD), query and key/value layouts",
                                 source=f"{RELEASE_SOURCES['trt-attention-11.0']}; {RELEASE_SOURCES['packed-11.1']}"),
}

# Each release -> (the highest default-domain opset its parser accepts, the source): the release table's column
# (targets/trt_releases.py), which the exporter's default opset follows as well.
OPSET_SOURCES: dict[TrtVersion, tuple[int, str]] = {v: (r.max_opset, RELEASE_SOURCES[r.opset_source]) for v, r in RELEASES.items()}


def max_opset(version: TrtVersion) -> int:
    """Highest default-domain opset the parser of ``version`` accepts (the newest ``RELEASES`` row at or below it)."""
    rows = [first for first in OPSET_SOURCES if first <= version]
    return OPSET_SOURCES[max(rows)][0] if rows else min(v[0] for v in OPSET_SOURCES.values())
