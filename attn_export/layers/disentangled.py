"""Disentangled attention: a content-dependent relative position score term per layer (DeBERTa-v2/v3).

Why: DeBERTa does not add a learned scalar per relative distance (``layers.position_bias``, MPNet);
each layer scores every (query, key) pair against shared relative position *embeddings*, through
its own query and key projections (transformers' ``models/deberta_v2/modeling_deberta_v2.py``,
``DisentangledSelfAttention.disentangled_attention_bias`` with ``share_att_key``):

- relative positions ``i - j`` are log-bucketed (``make_log_bucket_position``: distances below
  ``buckets // 2`` exact, farther ones log-spaced up to ``max_relative_positions``) and shifted
  into the table's 2 * span rows (``clamp(rel + span, 0, 2 * span - 1)``);
- the table ``R`` (one per encoder, LayerNorm'd with ``norm_rel_ebd: layer_norm``) is projected
  by the layer's own ``w_q`` and ``w_k``: ``pq = W_q R``, ``pk = W_k R``;
- content->position ``c2p[i, j] = q_i . pk[idx(i, j)]`` and position->content
  ``p2c[i, j] = k_j . pq[idx'(j, i)]`` (transformers gathers with ``-rel`` and transposes), both
  divided by ``sqrt(head_dim * scale_factor)``, ``scale_factor`` = 1 + the number of terms;
- the content score q . k is divided by the same ``sqrt(head_dim * scale_factor)``: ``attend``
  scales by ``1/sqrt(head_dim)``, so ``q`` is pre-multiplied by ``1/sqrt(scale_factor)``.

The term is an additive float32 score bias (B, H, Lq, Lk) handed to ``attend``, which adds it to
the scaled scores before the mask in every form but long-seq (whose kernels take no bias:
refused). The products ``q @ pk^T`` and ``k @ pq^T`` run in the model's dtype on pre-scaled
operands (as ``attend`` scales q before Q @ K^T), the gathered terms and their sum in float32:
the fp16 export keeps the score sum inside the softmax's float32 island.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from attn_export.layers.attention import attend, split_heads
from attn_export.layers.encoder_config import DisentangledConfig
from attn_export.layers.masks import AttentionMask
from attn_export.layers.self_attention import SelfAttention
from attn_export.layers.transformer import Fp32LayerNorm

__all__ = ["DisentangledSelfAttention", "RelativeEmbeddings", "clamp_index", "log_bucket_position"]

log = logging.getLogger(__name__)


def log_bucket_position(relative: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """Relative positions (int64, any shape) -> log-bucketed positions (int64), op for op transformers'
    ``make_log_bucket_position`` (same float32 rounding); hand-written because these layers never import transformers."""
    sign = torch.sign(relative)
    mid = bucket_size // 2
    abs_pos = torch.where((relative < mid) & (relative > -mid), torch.tensor(mid - 1).type_as(relative), torch.abs(relative))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative.type_as(log_pos), log_pos * sign).to(torch.long)


def clamp_index(index: torch.Tensor, hi: int) -> torch.Tensor:
    """An integer index tensor clamped into [0, hi], exported as ONNX Max and Min rather than Clip.

    Why not ``torch.clamp``: it exports as Clip, which TensorRT's ONNX parser runs on float types only
    (onnx-tensorrt docs/operators.md, 10.15: Clip FP32, FP16, BF16), so every TensorRT release refuses the
    int64 bucket index; Max and Min take INT32 and INT64 there (``checks.trt_support.OP_SUPPORT``)."""
    return torch.minimum(torch.maximum(index, index.new_zeros(())), index.new_full((), hi))


class RelativeEmbeddings(nn.Module):
    """The encoder's relative position embeddings (2 * span, D), shared by every layer, and the bucket of each pair.

    transformers' ``DebertaV2Encoder``: ``rel_embeddings`` and, with ``norm_rel_ebd: layer_norm``,
    ``LayerNorm`` (``get_rel_embedding``); ``build_relative_position`` for the buckets.
    """

    def __init__(self, config: DisentangledConfig, d_model: int, eps: float) -> None:
        super().__init__()
        self.config = config
        # transformers builds the LayerNorm whenever norm_rel_ebd says so, the table only with relative attention
        self.embeddings = nn.Embedding(2 * config.span, d_model) if config.relative else None
        self.norm = Fp32LayerNorm(d_model, eps=eps) if config.norm else None

    def table(self) -> torch.Tensor:
        """The (2 * span, D) table every layer projects, LayerNorm'd when the config says so."""
        w = self.embeddings.weight  # type: ignore[union-attr]  # (only called with relative terms)
        return w if self.norm is None else self.norm(w)

    def relative(self, positions: torch.Tensor) -> torch.Tensor:
        """positions (L,) or (B, L) -> bucketed ``p_i - p_j`` (1 or B, L, L), int64 (``build_relative_position``)."""
        p = positions if positions.dim() == 2 else positions.unsqueeze(0)  # (B or 1, L)
        rel = p[:, :, None] - p[:, None, :]  # (B, Lq, Lk): query - key
        c = self.config
        if c.buckets > 0 and c.max_relative_positions > 0:
            rel = log_bucket_position(rel, c.buckets, c.max_relative_positions)
        return rel


class DisentangledSelfAttention(SelfAttention):
    """``SelfAttention`` whose scores get the disentangled c2p / p2c terms and the 1/sqrt(scale_factor * Dh) scale.

    ``relative`` is the encoder's shared ``RelativeEmbeddings`` (None when the config has no
    relative attention: then only the scale differs from ``SelfAttention``). Positions are
    ``arange(L)`` in the padded form (transformers' ``build_relative_position``), each compact
    slot's own position in the packed form (``score_bias``).
    """

    def __init__(self, d_model: int, heads: int, config: DisentangledConfig, relative: RelativeEmbeddings | None) -> None:
        super().__init__(d_model, heads)
        self.terms = config.terms
        self.scale_factor = config.scale_factor
        self.span = config.span
        self.relative = relative if self.terms else None

    @property
    def q_scale(self) -> float:
        """What q is multiplied by so that ``attend``'s 1/sqrt(Dh) makes the content score q.k / sqrt(Dh * scale_factor)."""
        return 1.0 / math.sqrt(self.scale_factor)

    def _table_qk(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The shared table through this layer's own query and key projections (``share_att_key``): (1, 2 * span, D) each."""
        # (1, 2A, D): the tokens' own (B, L, D) MatMul pattern, so the export reads the weight it already holds
        table = self.relative.table().unsqueeze(0)  # type: ignore[union-attr]
        if self.is_qkv_fused:
            pq, pk, _ = self.project(table, table, table)
            return pq, pk
        return self.w_q(table), self.w_k(table)

    def score_bias(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | None:
        """The c2p + p2c terms (B, H, L, L), float32, from projected q, k (B, L, D) and positions (L,) or (B, L); None without terms."""
        if self.relative is None:
            return None
        b, length, _ = q.shape
        rel = self.relative.relative(positions)  # (1 or B, L, L)
        pq, pk = self._table_qk()  # (1, 2A, D)
        scale = 1.0 / math.sqrt(self.head_dim * self.scale_factor)
        shape = (b, self.heads, length, length)
        bias: torch.Tensor | None = None
        if "c2p" in self.terms:
            c2p = (split_heads(q * scale, self.heads) @ split_heads(pk, self.heads).transpose(-1, -2)).float()  # (B, H, L, 2A)
            index = clamp_index(rel + self.span, 2 * self.span - 1).unsqueeze(1).expand(shape)  # (B, H, Lq, Lk)
            bias = torch.gather(c2p, -1, index)
        if "p2c" in self.terms:
            p2c = (split_heads(k * scale, self.heads) @ split_heads(pq, self.heads).transpose(-1, -2)).float()  # (B, H, Lk, 2A)
            index = clamp_index(-rel + self.span, 2 * self.span - 1).unsqueeze(1).expand(shape)  # transformers' p2c_pos
            term = torch.gather(p2c, -1, index).transpose(-1, -2)  # (B, H, Lq, Lk)
            bias = term if bias is None else bias + term
        return bias

    def forward(
        self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``bias``: another additive score bias (B or 1, H, L, L), added to the disentangled terms."""
        q, k, v = self.project(x, x, x)  # (B, L, D)
        term = self.score_bias(q, k, torch.arange(x.shape[1], device=x.device))
        if term is not None:
            bias = term if bias is None else bias + term
        keep = AttentionMask(key_keep=None if key_padding_mask is None else key_padding_mask != 0, causal=self.causal, window=self.window)
        out, weights = attend(
            q if self.scale_factor == 1 else q * self.q_scale, k, v, self.heads, keep, form=self.attention_form, need_weights=need_weights, impl=self.attention_impl, bias=bias
        )
        return self.w_o(self.dropout(out)), weights
