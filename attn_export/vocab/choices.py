"""The value lists the toolkit's options and reports use, defined once.

Every module that takes an attention form, an int8 encoding, a calibration method, a pooling
mode or a reference layer imports the allowed values from here, so a flag means the same thing
in the CLI, the plan, the sweep and the bench, and a new value is added in one place.
Precisions are objects with their own facts: ``vocab.precisions``.
"""

from __future__ import annotations

from attn_export.errors import ConfigError

__all__ = [
    "ATTENTION_FORMS",
    "ATTENTION_IMPLS",
    "CALIB_CHOICES",
    "CALIB_METHODS",
    "CPU_INT8_ENCODINGS",
    "ENCODER_FORMS",
    "INT8_QAT_SCALES",
    "LOW_RANK_METHODS",
    "LAYER_MASKS",
    "LAYER_NAMES",
    "LOW_RANK_TARGET_NAMES",
    "MASK_KINDS",
    "PACKED_ATTENTION_FORMS",
    "PER_TENSOR",
    "POOLING_MODES",
    "check_heads",
    "is_ascii_digits",
]

# How a whole encoder is exported (--encoder-form): on the padded (B, S) grid, or on its real
# tokens only (layers.packed); "auto" (the option's default) is the plan's choice, not a form.
ENCODER_FORMS: tuple[str, ...] = ("padded", "packed")
# Attention forms the packed encoder exports: ONNX Runtime's kernel, TensorRT 11's packed IAttention, or the portable
# math (layers.packed_forms has what each writes).
PACKED_ATTENTION_FORMS: tuple[str, ...] = ("decomposed", "ort-contrib", "trt-packed")

# --int8-mode and --quantize take the compression registry's route names and precisions
# (compress.registry.route_names / precisions): a new method adds its own.

# Static calibration: how an activation's range is chosen from the calibration split.
CALIB_METHODS: tuple[str, ...] = ("minmax", "percentile", "entropy")
# --calib-method: a global method, or per-tensor (each activation the method that quantizes it best)
PER_TENSOR = "per-tensor"
CALIB_CHOICES: tuple[str, ...] = (*CALIB_METHODS, PER_TENSOR)

# How int8 weights are stored for ONNX Runtime CPU (compress/int8_encoding.py).
CPU_INT8_ENCODINGS: tuple[str, ...] = ("auto", "full-range", "reduce-range", "u8u8")

LOW_RANK_METHODS: tuple[str, ...] = ("activation", "svd")
# QAT-lite's activation ranges (--int8-qat-scales): trained with the weights, or kept as calibrated.
INT8_QAT_SCALES: tuple[str, ...] = ("learned", "frozen")

# Sentence-transformers' pooling modes (``layers/pooling.py`` computes them; ``--pooling`` names one, or several joined by +).
POOLING_MODES: tuple[str, ...] = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")

# How attention is written into the ONNX graph (``export/``), and how eager computes it (``layers/``).
# The packed encoder's own forms (PACKED_ATTENTION_FORMS) add "trt-packed", which a target chooses (--encoder-form packed).
ATTENTION_FORMS: tuple[str, ...] = ("decomposed", "onnx-attention", "ort-contrib", "long-seq")
ATTENTION_IMPLS: tuple[str, ...] = ("math", "sdpa")
LOW_RANK_TARGET_NAMES: tuple[str, ...] = ("q", "k", "v", "o", "ffn")

# The reference layers and the mask kinds each supports (``layers.registry`` builds them; the
# names live here so flag validation needs no torch).
MASK_KINDS: tuple[str, ...] = ("none", "padding", "causal", "window")
LAYER_MASKS: dict[str, tuple[str, ...]] = {
    "transformer": MASK_KINDS,
    "mha": ("none", "padding", "causal"),
    "self-attention": MASK_KINDS,
    "block-sparse": ("none", "padding"),
    "linear": ("none", "padding", "causal"),
}
LAYER_NAMES: tuple[str, ...] = tuple(LAYER_MASKS)


def is_ascii_digits(text: str, max_len: int | None = None) -> bool:
    """``text`` is a whole number written in ASCII digits (at most ``max_len`` of them): how every option and file
    field that holds a count is checked before ``int()``.

    Why not ``str.isdigit()`` alone: it is also true of '²' and '①', which ``int()`` refuses, and ``int()``
    takes '١٢' (Arabic-Indic digits), which no user means."""
    return text.isascii() and text.isdigit() and (max_len is None or len(text) <= max_len)


def check_heads(d_model: int, heads: int) -> None:
    """Validate the head split; raised at construction so a bad CLI flag fails before any work."""
    import operator

    try:
        if isinstance(d_model, bool) or isinstance(heads, bool):
            raise TypeError
        d_model, heads = operator.index(d_model), operator.index(heads)
    except TypeError:
        raise ConfigError(f"expected integer d_model and heads, got d_model={d_model!r}, heads={heads!r}") from None
    if d_model <= 0 or heads <= 0:
        raise ConfigError(f"d_model and heads must be positive, got d_model={d_model}, heads={heads}")
    if d_model % heads != 0:
        raise ConfigError(
            f"heads must divide d_model, got d_model={d_model}, heads={heads}; "
            f"use e.g. --heads {_nearest_divisor(d_model, heads)}"
        )


# How far from the requested head count the suggestion looks. Bounded so the error path stays
# instant for any d_model (a scan of 1..d_model hung on --d-model 999999937); 1 always divides,
# so a suggestion always exists.
_DIVISOR_SEARCH = 4096


def _nearest_divisor(n: int, near: int) -> int:
    """The divisor of ``n`` closest to ``near`` (the smaller one on a tie), looking at most
    ``_DIVISOR_SEARCH`` steps either way; 1 when none is that close."""
    for delta in range(_DIVISOR_SEARCH + 1):
        for h in (near - delta, near + delta):
            if 1 <= h <= n and n % h == 0:
                return h
    return 1
