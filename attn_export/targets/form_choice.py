"""``--attention auto``: which exported attention form a target and a sequence profile get, and why.

A pure function of the run's facts (no I/O), so the plan can call it before exporting and
the report can print its reason. The threshold is measured, not guessed: ``bench/long_seq.py``
runs the default TransformerLayer (d_model 512, 8 heads, padding mask) on ONNX Runtime CPU
with 2 threads and prints where the ``long-seq`` form stops being slower than the
``decomposed`` form (ort-cpu's form below the threshold); see docs/long-sequences.md.
"""

from __future__ import annotations

from attn_export.errors import ConfigError
from attn_export.targets.targets import Target, get_target
from attn_export.vocab.choices import LAYER_NAMES, MASK_KINDS

__all__ = ["LONG_SEQ_MIN_LEN", "choose_attention_form"]

# Smallest sequence-profile maximum for which ort-cpu gets the long-seq form. Measured with
# bench/long_seq.py (B=1, padding mask, 2 threads, docs/long-sequences.md): long-seq vs
# decomposed latency 1.31x at L=128, 1.02x at 256, 0.89x at 512, 0.67x at 1024, 0.57x at
# 4096, 0.43x at 8192; memory 0.74x at 128 down to 0.03x at 8192.
LONG_SEQ_MIN_LEN = 512
# Layers whose attention is already O(L) in memory: nothing for the long-seq form to win.
_LINEAR_MEMORY_LAYERS = frozenset({"linear", "block-sparse"})


def choose_attention_form(
    target: str | Target,
    max_seq_len: int,
    mask: str = "padding",
    *,
    layer: str = "transformer",
    threshold: int = LONG_SEQ_MIN_LEN,
    score_bias: bool = False,
) -> tuple[str, str]:
    """The attention form for ``--attention auto`` and a one-line reason for the report.

    Args:
        target: a target name from ``export.targets.TARGETS`` (or the ``Target``).
        max_seq_len: the largest sequence length the deployment will see (the maximum of the
            sequence profile / ``--seq-len``), >= 1.
        mask: the layer's mask kind, one of ``layers.registry.MASK_KINDS``.
        layer: the layer name, one of ``layers.registry.LAYER_NAMES`` (checkpoint encoders:
            pass ``"transformer"``).
        threshold: the minimum ``max_seq_len`` for the long-seq form (default: measured).
        score_bias: the model adds a bias to every layer's scores (MPNet's relative positions, DeBERTa's disentangled terms).

    Returns:
        ``(form, reason)``: ``form`` is a value for ``ExportSpec(attention=form)``.

    Rules, in order:
        1. TensorRT targets keep the target's form (the one TensorRT fuses into its MHA
           kernels; long-seq lowers to ONNX Runtime contrib ops TensorRT cannot parse).
        2. ONNX Runtime targets other than ``ort-cpu`` keep the target's form (long-seq's
           flash conditions were read and measured for the CPU kernels only).
        3. ``linear`` and ``block-sparse`` layers keep the target's form: their attention
           memory is already O(L); so does a model with a score bias (the long-seq kernels
           take none).
        4. ``max_seq_len >= threshold``: ``long-seq``; otherwise the target's form.

    An int8 *dynamic* route that quantizes a long-seq export must export it with
    ``ExportSpec(attention="long-seq", linear_gemm=False)``: ONNX Runtime's dynamic quantizer
    quantizes MatMul, not the Gemm the long-seq form writes for Linears.
    """
    tgt = get_target(target) if isinstance(target, str) else target
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise ConfigError(f"expected a positive integer max_seq_len, got {max_seq_len!r}; use the profile's maximum --seq-len")
    if mask not in MASK_KINDS:
        raise ConfigError(f"expected mask in {', '.join(MASK_KINDS)}, got {mask!r}")
    if layer not in LAYER_NAMES:
        raise ConfigError(f"expected layer in {', '.join(LAYER_NAMES)}, got {layer!r}")
    if threshold < 1:
        raise ConfigError(f"expected a positive threshold, got {threshold}; use {LONG_SEQ_MIN_LEN}")
    keep = tgt.attention
    if tgt.trt_releases:  # TensorRT parses the graph
        return keep, (
            f"TensorRT target {tgt.name}: keeps {keep}, which TensorRT fuses into its MHA kernel "
            "(long-seq uses ONNX Runtime contrib ops)"
        )
    if not tgt.long_seq:
        return keep, f"{tgt.name}: keeps {keep}; the long-seq form is measured for ONNX Runtime CPU only"
    if layer in _LINEAR_MEMORY_LAYERS:
        return keep, f"{layer} attention is already O(L) in memory; keeps {keep}"
    if score_bias:
        return keep, f"the model adds a relative position bias to its attention scores, which the long-seq kernels do not take; keeps {keep}"
    if max_seq_len >= threshold:
        return "long-seq", (
            f"max sequence length {max_seq_len} >= {threshold}: long-seq ({mask} mask) keeps attention memory "
            "O(L) with ONNX Runtime's flash kernels and is faster than decomposed from there (bench/long_seq.py)"
        )
    return keep, f"max sequence length {max_seq_len} < {threshold}: {keep} is as fast and small enough"
