"""The padding-free ("packed") form of ``SentenceEncoder``: every GEMM runs on real tokens only.

Why: real text in batches is ragged. On the corpus' test split in batches of 8, padded to
each batch's longest text, 23% of the token slots are padding; in a fixed (8, 128) input,
80%. The padded model runs every GEMM, LayerNorm and GELU on those slots. This form keeps
the encoder's interface (``input_ids``/``attention_mask`` (B, S) in, and ``token_type_ids``
when the encoder takes it; ``last_hidden_state`` (B, S, D) and ``sentence_embedding`` (B, D) out)
and, inside:

1. gathers the T real tokens once (``PackedIndex``: NonZero on the mask) and embeds them
   with their own positions (and token types), so the model is the padded one on any padding pattern;
2. runs Q/K/V, O, FFN, LayerNorm and GELU on (T + 1, D) rows: the real tokens plus one
   spare row, a copy of the first real token, which keeps every tensor non-empty when a
   batch has no real token and never puts a padding token into activation ranges;
3. attends per sequence: each sequence's rows are gathered into a compact, right-padded
   (B, W, D) batch, W = the longest sequence (not S), attention runs with a key-length mask,
   and the outputs are gathered back to rows. On ONNX Runtime the kernel is
   ``com.microsoft.MultiHeadAttention`` (``attention_form == "ort-contrib"``); on TensorRT 11.1+
   the rows go ungathered into ``IAttention`` with packed layouts (``"trt-packed"``); otherwise the
   explicit math below, with the scores and softmax in float32 (``layers.packed_forms``). A model with a score bias
   (MPNet's relative positions, ``layers.position_bias``) gets it over the compact slots,
   computed once from each slot's position in the padded grid, as MultiHeadAttention's
   ``attention_bias`` (``export.passes.mask_free_attention`` then leaves that node alone).
   A local (windowed) layer gets its window the same way, over the slots' positions
   (|pos_i - pos_j| <= w, so any padding pattern windows as the padded grid does), and a
   rotary layer (``layers.rotary``) rotates each row's q and k by that token's own position.
   DeBERTa's disentangled terms (``layers.disentangled``) depend on q and k: each layer computes
   them over the compact slots from the gathered q and k and adds them to that bias; DeBERTa-v2's
   token convolution after layer 0 (``layers.token_conv``) runs once on the rows scattered to the
   (B, S, D) grid, so a token's neighbours are the padded model's;
4. scatters the rows back to (B, S, D), zeros at padded positions (the padded model's
   values there are whatever padding tokens compute, which no consumer reads), and pools
   that tensor (and runs the task head) with the padded encoder's own ``outputs``.

The rows are 2-D (T, D), so ONNX Runtime's SkipLayerNormalization fusion, which needs 3-D
inputs (core/optimizer/skip_layer_norm_fusion.cc, ``CheckFirstAdd``) and measured slower on
ORT 1.32's CPU kernel, cannot fire: the graph is fast in a plain session.

Designs measured and not taken (MiniLM, ORT 1.32, 2 threads; /docs and the bench):
block-diagonal attention over all T tokens (one (T, T) mask from sequence ids) costs
O(T^2) and measured slower at B = 8; scattering to the input's (B, S) grid pays padded
attention at S; ORT's PackedAttention / PackedMultiHeadAttention have no CPU kernel in 1.32;
MultiHeadAttention's packed-QKV layout is not implemented on CPU.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attn_export.errors import ConfigError
from attn_export.layers.disentangled import DisentangledSelfAttention
from attn_export.layers.encoder import EncoderConfig, SentenceEncoder
from attn_export.layers.masks import keep_to_bias
from attn_export.layers.packed_forms import PACKED_FORMS
from attn_export.layers.prenorm import PreNormLayer
from attn_export.layers.self_attention import SelfAttention
from attn_export.layers.transformer import TransformerLayer

__all__ = ["PackedEncoder", "PackedIndex", "packed_attention"]

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class PackedIndex:
    """Where every real token sits, computed once per batch from the attention mask.

    rows:   (T,)   flat index b * S + s of each real token, in row-major order
    seq:    (T,)   its sequence b
    pos:    (T,)   its position s (the padded model's position id, for any padding pattern)
    counts: (B,)   real tokens per sequence
    slot:   (B, W) the packed row in each sequence's compact, right-padded attention slots;
                   padded slots read the spare row T
    back:   (T+1,) the slot b * W + j each packed row reads its attention output from
    """

    rows: torch.Tensor
    seq: torch.Tensor
    pos: torch.Tensor
    counts: torch.Tensor
    slot: torch.Tensor
    back: torch.Tensor

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> PackedIndex:
        b, s = attention_mask.shape
        # dtypes TensorRT's parser takes as well (check-trt): NonZero on float, CumSum on float
        # (exact: counts < 2^24), and no int64 Clip
        keep = (attention_mask != 0).to(torch.float32)  # (B, S)
        rows = torch.nonzero(keep.reshape(-1)).squeeze(1)  # (T,)
        t = rows.shape[0]
        seq = torch.div(rows, s, rounding_mode="floor")  # (T,)
        pos = rows - seq * s  # (T,)
        counts = keep.sum(dim=1).to(torch.int64)  # (B,)
        starts = torch.cumsum(keep.sum(dim=1), dim=0).to(torch.int64) - counts  # (B,) first packed row of each sequence
        width = torch.cat([counts, counts.new_ones(1)]).max().item()  # W >= 1 keeps the attention batch non-empty
        torch._check(width >= 1)
        torch._check(width <= s)
        j = torch.arange(width, device=rows.device)  # (W,)
        in_seq = j.unsqueeze(0) < counts.unsqueeze(1)  # (B, W)
        slot = torch.where(in_seq, starts.unsqueeze(1) + j.unsqueeze(0), t)  # (B, W)
        back = seq * width + (torch.arange(t, device=rows.device) - starts.index_select(0, seq))  # (T,)
        return cls(rows, seq, pos, counts, slot, _with_spare(back))

    @property
    def width(self) -> int:
        return self.slot.shape[1]


def _scatter(x: torch.Tensor, index: PackedIndex, b: int, s: int) -> torch.Tensor:
    """Packed rows (T+1, D) -> the padded grid (B, S, D), zeros at padding (the spare row is dropped)."""
    t, d = index.rows.shape[0], x.shape[-1]
    return x.new_zeros(b * s, d).index_copy(0, index.rows, x[:t]).view(b, s, d)


def _with_spare(x: torch.Tensor) -> torch.Tensor:
    """(T,) -> (T+1,): append a copy of the first element, or 0 when there is none (T = 0)."""
    return torch.cat([x, x[:1], x.new_zeros(1)])[: x.shape[0] + 1]


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    index: PackedIndex,
    heads: int,
    form: str = "decomposed",
    impl: str = "math",
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Self-attention of packed rows q, k, v (T+1, D) within each sequence -> (T+1, D).

    ``bias``: an additive score bias over the compact batch (B, H, W, W), float32 (a relative
    position bias from each slot's position: ``PackedEncoder``), added before the key mask.

    The rows are gathered into the compact (B, W, D) batch, attended with each sequence's
    key count as the mask and gathered back. A padded slot is only ever a key (masked) or a
    query whose output no row reads; every real query has at least itself as a key, so no
    row that is read is fully masked.
    """
    packed_form = PACKED_FORMS[form]
    if torch.onnx.is_in_onnx_export() and packed_form.export is not None:  # the form's own node (layers.packed_forms)
        if bias is not None and not packed_form.score_bias:
            raise ConfigError(f"the {form} attention form takes no score bias or window; export --encoder-form padded for this model")
        return packed_form.export(q, k, v, index, heads, bias)  # (T+1, D)
    b, w = index.slot.shape
    d = q.shape[-1]
    # F.embedding is a row gather with a 2-D index: one ONNX Gather straight to (B, W, D), no Reshape
    qb, kb, vb = (F.embedding(index.slot, x) for x in (q, k, v))  # (B, W, D)
    out = _compact_math(qb, kb, vb, index.counts, heads, sdpa=impl == "sdpa" and not torch.onnx.is_in_onnx_export(), bias=bias)
    return out.reshape(b * w, d).index_select(0, index.back)  # (T+1, D)


def _window_bias(slot_pos: torch.Tensor, window: int, bias: torch.Tensor | None) -> torch.Tensor:
    """A local window over the compact slots, |pos_i - pos_j| <= w by their grid positions (B, W), as an additive
    float32 score bias (B, 1 or H, W, W), joined to the model's own score bias when it has one."""
    keep = (slot_pos[:, :, None] - slot_pos[:, None, :]).abs() <= window  # (B, W, W)
    out = keep_to_bias(keep, torch.float32)[:, None]  # (B, 1, W, W)
    return out if bias is None else bias.float() + out


def _compact_math(
    qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, counts: torch.Tensor, heads: int, sdpa: bool = False,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Explicit attention over the compact batch (B, W, D); scores and softmax in float32."""
    b, w, d = qb.shape
    dh = d // heads
    qh = qb.view(b, w, heads, dh).transpose(1, 2)  # (B, H, W, Dh)
    kh = kb.view(b, w, heads, dh).transpose(1, 2)  # (B, H, W, Dh)
    vh = vb.view(b, w, heads, dh).transpose(1, 2)  # (B, H, W, Dh)
    key_keep = (torch.arange(w, device=qb.device).unsqueeze(0) < counts.unsqueeze(1))[:, None, None, :]  # (B, 1, 1, W)
    if sdpa:
        mask = key_keep if bias is None else bias.to(qh.dtype) + keep_to_bias(key_keep, qh.dtype)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)  # (B, H, W, Dh)
    else:
        scores = ((qh * (1.0 / math.sqrt(dh))) @ kh.transpose(-2, -1)).float()  # (B, H, W, W), fp32 island
        if bias is not None:
            scores = scores + bias.float()
        probs = torch.softmax(scores + keep_to_bias(key_keep, torch.float32), dim=-1).to(vh.dtype)
        out = probs @ vh  # (B, H, W, Dh)
    return out.transpose(1, 2).reshape(b, w, d)  # (B, W, D)


class PackedEncoder(nn.Module):
    """``SentenceEncoder`` run on its real tokens only; same weights (shared), same interface."""

    output_names: tuple[str, ...] = SentenceEncoder.output_names

    def __init__(self, encoder: SentenceEncoder) -> None:
        super().__init__()
        for i, layer in enumerate(encoder.layers):
            attn = getattr(layer, "self_attn", None)
            if not isinstance(layer, (TransformerLayer, PreNormLayer)) or not isinstance(attn, SelfAttention) or attn.causal:
                raise ConfigError(
                    f"expected encoder layers with bidirectional self-attention for the packed encoder form, "
                    f'got {type(layer).__name__} at layer {i}; export the padded form (ExportSpec(encoder_form="padded"))'
                )
        self.encoder = encoder
        self.output_names = encoder.output_names  # with "logits" when the encoder has a task head

    @property
    def config(self) -> EncoderConfig:
        return self.encoder.config

    @property
    def needs_score_bias(self) -> bool:
        """A layer adds a score bias or a window to its attention (MPNet, DeBERTa, local layers): what the forms
        without ``score_bias`` (``layers.packed_forms``) cannot export."""
        return self.encoder.position_bias is not None or any(
            layer.self_attn.window is not None or isinstance(layer.self_attn, DisentangledSelfAttention) for layer in self.encoder.layers
        )

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.encoder.input_names  # with token_type_ids when the encoder takes them

    @property
    def d_model(self) -> int:
        return self.encoder.d_model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        b, s = input_ids.shape
        index = PackedIndex.from_mask(attention_mask)
        ids = _with_spare(input_ids.reshape(-1).index_select(0, index.rows))  # (T+1,)
        types = None if token_type_ids is None else _with_spare(token_type_ids.reshape(-1).index_select(0, index.rows))  # (T+1,)
        emb = self.encoder.embeddings
        positions = emb.position_ids(input_ids)  # (S,) arange, or (B, S) RoBERTa positions from the pads in the ids
        pos = index.pos if positions.dim() == 1 else positions.reshape(-1).index_select(0, index.rows)  # (T,)
        x = emb.embed(ids, _with_spare(pos), types)  # (T+1, D)
        row_pos = _with_spare(pos)  # (T+1,): each row's position, what rotary layers rotate by
        slot_pos = _with_spare(index.pos).index_select(0, index.slot.reshape(-1)).view_as(index.slot)  # (B, W) grid positions
        bias = None
        if self.encoder.position_bias is not None:  # relative distances between the padded grid's positions (transformers' arange)
            bias = self.encoder.position_bias(slot_pos)  # (B, H, W, W), computed once for every layer
        windowed: dict[int, torch.Tensor | None] = {}  # window -> the score bias of a local layer, computed once per window
        embedded = x
        for i, layer in enumerate(self.encoder.layers):
            w = layer.self_attn.window
            if w is not None and w not in windowed:
                windowed[w] = _window_bias(slot_pos, w, bias)
            x = self._layer(layer, x, index, bias if w is None else windowed[w], row_pos, slot_pos)  # (T+1, D)
            if i == 0 and self.encoder.conv is not None:  # DeBERTa-v2's ConvLayer reads neighbours in the padded grid
                grid = self.encoder.conv(_scatter(embedded, index, b, s), _scatter(x, index, b, s), attention_mask)  # (B, S, D)
                x = grid.reshape(b * s, -1).index_select(0, _with_spare(index.rows))  # (T+1, D): the spare row reads the first real token
        if self.encoder.final_norm is not None:
            x = self.encoder.final_norm(x)
        hidden = _scatter(x, index, b, s)  # (B, S, D), zeros at padding: the spare row is dropped
        return self.encoder.outputs(hidden, attention_mask)  # the encoder's own pooling (and head) on the scattered states

    @staticmethod
    def _layer(
        layer: TransformerLayer | PreNormLayer, x: torch.Tensor, index: PackedIndex, bias: torch.Tensor | None, row_pos: torch.Tensor,
        slot_pos: torch.Tensor,
    ) -> torch.Tensor:
        att = layer.self_attn
        h = layer.attention_input(x)  # post-norm: x; pre-norm: attn_norm(x)
        q, k, v = att.project(h, h, h)  # (T+1, D) each
        q, k = att.positioned(q, k, row_pos)  # rotary layers: each row by its own token's position
        if isinstance(att, DisentangledSelfAttention):  # DeBERTa: content-dependent terms over the compact slots, then q pre-scaled
            term = att.score_bias(F.embedding(index.slot, q), F.embedding(index.slot, k), slot_pos)  # (B, H, W, W) or None
            bias = bias if term is None else term if bias is None else bias + term
            q = q if att.scale_factor == 1 else q * att.q_scale
        ctx = packed_attention(q, k, v, index, att.heads, form=att.attention_form, impl=att.attention_impl, bias=bias)  # (T+1, D)
        return layer.after_attention(x, att.w_o(att.dropout(ctx)))  # (T+1, D)
