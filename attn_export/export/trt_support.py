"""What TensorRT's ONNX parser accepts, per version: the maintained table behind ``check-trt``.

Sources: ONNX-TensorRT ``docs/operators.md`` (10.15: opset 9-24, supported types and
restrictions per op), its changelog (the release each op importer landed in, e.g.
``Attention`` in 10.14, ``RMSNormalization``/``RotaryEmbedding`` in 10.15) and the
TensorRT 11 opset guide (opset 25). The table covers every op the toolkit emits plus the
common ones; an op missing from it is reported as unknown, never silently accepted.

Types are ONNX dtype names as onnx_ir spells them (FLOAT, FLOAT16, INT64...). ``inputs``
says which inputs carry the op's data type T (shape/axes/index/condition inputs are not
checked against T), ``outputs`` whether outputs must be in T as well.
"""

from __future__ import annotations

from dataclasses import dataclass

from attn_export.runtime.trt_spec import TrtVersion

__all__ = ["Finding", "OpSupport", "OP_SUPPORT", "max_opset", "MIN_OPSET"]

F = frozenset({"FLOAT", "FLOAT16", "BFLOAT16"})
FI = F | {"INT32", "INT64"}
FIB = FI | {"BOOL"}
B = frozenset({"BOOL"})
Q8_IN = frozenset({"INT8", "FLOAT8E4M3FN", "INT4", "FLOAT4E2M1"})  # DequantizeLinear x
V10 = TrtVersion(10, 0)
MIN_OPSET = 9


@dataclass(frozen=True)
class Finding:
    """One result of the static check, printed as one line with the node name."""

    severity: str  # "error" | "warning" | "info"
    node: str
    op: str
    message: str

    def __str__(self) -> str:
        return f"{self.severity.upper():7s} {self.node or '<graph>'} ({self.op or '-'}): {self.message}"


@dataclass(frozen=True)
class OpSupport:
    since: TrtVersion | None  # None: no importer in any supported version
    types: frozenset[str] | None = None  # allowed dtypes of the checked tensors; None = unchecked
    inputs: tuple[int, ...] | str = (0,)  # indices carrying T, or "all"
    outputs: bool = True
    note: str = ""


def _s(types: frozenset[str] | None, inputs: tuple[int, ...] | str = (0,), since: TrtVersion = V10, outputs: bool = True, note: str = "") -> OpSupport:
    return OpSupport(since, types, inputs, outputs, note)


_NO = OpSupport(None)
_BIN = (0, 1)

OP_SUPPORT: dict[str, OpSupport] = {
    # elementwise / activations
    "Abs": _s(FI), "Acos": _s(F), "Acosh": _s(F), "Asin": _s(F), "Asinh": _s(F), "Atan": _s(F), "Atanh": _s(F),
    "Add": _s(FI, _BIN), "Sub": _s(FI, _BIN), "Mul": _s(FI, _BIN), "Div": _s(FI, _BIN), "Mod": _s(FI, _BIN),
    "Pow": _s(FI, (0,)), "Max": _s(FI, "all"), "Min": _s(FI, "all"), "Sum": _s(FI, "all"), "Mean": _s(FI, "all"),
    "Neg": _s(FI), "Sign": _s(FI), "Relu": _s(FI), "Ceil": _s(F), "Floor": _s(F), "Round": _s(F),
    "Reciprocal": _s(F), "Sqrt": _s(F), "Exp": _s(F), "Log": _s(F), "Erf": _s(F), "Sin": _s(F), "Cos": _s(F),
    "Tan": _s(F), "Sinh": _s(F), "Cosh": _s(F), "Tanh": _s(F), "Sigmoid": _s(F), "HardSigmoid": _s(F),
    "HardSwish": _s(F), "Elu": _s(F), "Selu": _s(F), "Celu": _s(F), "LeakyRelu": _s(F), "PRelu": _s(F, _BIN),
    "Softplus": _s(F), "Softsign": _s(F), "ThresholdedRelu": _s(F), "Mish": _s(F), "Gelu": _s(F),
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
    "RMSNormalization": _s(F, since=TrtVersion(10, 15)),
    "RotaryEmbedding": _s(F, since=TrtVersion(10, 15)),
    "Attention": _s(F | {"INT8", "FLOAT8E4M3FN"}, (0, 1, 2), since=TrtVersion(10, 14), note="ONNX Attention -> IAttention"),
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
    "BlackmanWindow": _s(None, since=TrtVersion(10, 4)), "HannWindow": _s(None, since=TrtVersion(10, 4)),
    "HammingWindow": _s(None, since=TrtVersion(10, 4)), "STFT": _s(F, since=TrtVersion(10, 5)),
    "TensorScatter": _s(F | {"INT32"}, since=TrtVersion(10, 15)),
    # explicit quantization (symmetric, zero point 0; checked in detail by trt_compat)
    "QuantizeLinear": _s(F, (0,), outputs=False, note="y_zero_point must be 0"),
    "DequantizeLinear": _s(Q8_IN, (0,), outputs=False, note="x_zero_point must be 0"),
    # no importer
    **{op: _NO for op in (
        "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul",
        "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor", "Compress", "ConcatFromSequence",
        "DFT", "Det", "MaxRoiPool", "MaxUnpool", "Multinomial", "NegativeLogLikelihoodLoss", "Optional",
        "OptionalGetElement", "OptionalHasElement", "SequenceAt", "SequenceConstruct", "SequenceEmpty",
        "SequenceErase", "SequenceInsert", "SequenceLength", "SequenceMap", "SoftmaxCrossEntropyLoss",
        "SplitToSequence", "StringNormalizer", "StringConcat", "StringSplit", "RegexFullMatch",
        "TfIdfVectorizer", "Unique", "Col2Im", "CenterCropPad", "AffineGrid", "ImageDecoder", "Bernoulli")},
}


def max_opset(version: TrtVersion) -> int:
    """Highest default-domain opset the parser of ``version`` accepts."""
    if version.major >= 11:
        return 25  # TensorRT 11.x opset guide
    if version >= TrtVersion(10, 13):
        return 24
    if version >= TrtVersion(10, 9):
        return 22
    return 20  # 10.0-10.8, JetPack 6's 10.3 included
