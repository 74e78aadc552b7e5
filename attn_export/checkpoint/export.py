"""Export a ``SentenceEncoder`` with its documented interface (``docs/encoder.md``).

Other tools feed the exported encoder by name, so the names and axes are fixed here:
inputs ``input_ids`` and ``attention_mask`` (int64 [batch, seq], both axes dynamic), and
``token_type_ids`` (the same) for an encoder that takes token types (``SentenceEncoder.input_names``,
decided by ``layers.encoder.encoder_input_names``), outputs ``last_hidden_state`` [batch, seq, hidden] and ``sentence_embedding``
[batch, hidden] (pooled over the mask as the model ships it, float32 in every precision),
plus ``logits`` for a checkpoint with a classification head.
The export itself is the generic ``attn_export.export.export_module``, so the attention
form, QKV fusion, fp32 softmax/LayerNorm islands and the report fields are the layers'.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

import torch

from attn_export.errors import ConfigError, ExportError
from attn_export.export import ExportResult, ExportSpec, export_module
from attn_export.layers.encoder import SentenceEncoder, encoder_input_names
from attn_export.layers.packed import PackedEncoder
from attn_export.layers.packed_forms import PACKED_FORMS

__all__ = [
    "ENCODER_INPUT_NAMES",
    "ENCODER_MIN_DEFAULT_OPSET",
    "encoder_dynamic_axes",
    "encoder_example_inputs",
    "encoder_export_spec",
    "export_encoder",
]

log = logging.getLogger(__name__)

ENCODER_INPUT_NAMES: list[str] = list(encoder_input_names())  # the two-input interface of single texts (and type-0 pairs)
# GELU is one ONNX op from opset 20 (five ops before): ONNX Runtime runs it as one kernel,
# which makes the int8 MiniLM ~12% faster on CPU; TensorRT 10.3 (JetPack 6) parses up to 20.
ENCODER_MIN_DEFAULT_OPSET = 20


def encoder_dynamic_axes(names: list[str]) -> dict[str, dict[int, str]]:
    """Every encoder input is (batch, seq), both dynamic: a TensorRT profile gives each the same (B, S) shapes."""
    return {name: {0: "batch", 1: "seq"} for name in names}


def encoder_example_inputs(encoder: SentenceEncoder, batch: int = 2, seq: int = 16, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Token ids (B, S) int64 framed by [CLS]-like/[SEP]-like ids, and a mask with padded tails; for an encoder that
    takes token types, ``token_type_ids`` too: 0 on each row's first half of real tokens, 1 on the rest, 0 at pads."""
    g = torch.Generator().manual_seed(seed)
    vocab = encoder.config.vocab_size
    ids = torch.randint(min(1000, vocab - 1), vocab, (batch, seq), generator=g, dtype=torch.int64)
    lengths = torch.randint(max(2, seq // 2), seq + 1, (batch,), generator=g)
    lengths[0] = seq  # one unpadded row, one padded row at least
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).to(torch.int64)  # (B, S), 1 = real token
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, encoder.config.pad_token_id))
    if not encoder.takes_token_types:
        return ids, mask
    types = ((torch.arange(seq)[None, :] >= (lengths[:, None] // 2)) & mask.bool()).to(torch.int64)  # (B, S): A 0, B 1, pads 0
    return ids, mask, types


def encoder_export_spec(spec: ExportSpec | None = None) -> ExportSpec:
    """``spec`` with the encoder's default opset when none was chosen: at least ``ENCODER_MIN_DEFAULT_OPSET``."""
    spec = spec or ExportSpec()
    if spec.opset is None and spec.resolved_opset < ENCODER_MIN_DEFAULT_OPSET:
        spec = replace(spec, opset=ENCODER_MIN_DEFAULT_OPSET)
    return spec


def export_encoder(encoder: SentenceEncoder, path: str | os.PathLike[str], spec: ExportSpec | None = None) -> ExportResult:
    """Export the whole encoder (its pooling and head included) to ONNX; fp16 keeps softmax, LayerNorm and pooling in float32.

    ``spec.encoder_form == "packed"`` exports ``layers.packed.PackedEncoder`` over the same
    weights: the same inputs and outputs, computed on the real tokens only (zeros in
    ``last_hidden_state`` at padded positions).
    """
    spec = encoder_export_spec(spec)
    example = encoder_example_inputs(encoder, spec.example_batch, max(spec.example_seq, 2))
    outputs = list(encoder.output_names)  # SentenceEncoder.output_names, plus "logits" with a task head
    inputs = list(encoder.input_names)  # input_ids, attention_mask[, token_type_ids]
    module = PackedEncoder(encoder) if spec.encoder_form == "packed" else encoder
    if isinstance(module, PackedEncoder) and module.needs_score_bias and not PACKED_FORMS[spec.attention].score_bias:
        raise ConfigError(f"the {spec.attention} attention form takes no score bias or window (a packed-query IAttention takes no "
                          "attn_mask), but this model adds one; export --encoder-form padded")  # fmt: skip
    result = export_module(module.eval(), path, spec, example, inputs, outputs, encoder_dynamic_axes(inputs))
    if result.input_names != inputs or result.output_names != outputs:
        raise ExportError(
            f"expected graph inputs {inputs} and outputs {outputs}, got "
            f"{result.input_names} and {result.output_names}; the encoder interface must not drift"
        )
    return result
