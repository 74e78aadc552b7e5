"""Pre-norm encoder layers with a gated (GeGLU) MLP, and token-only embeddings: ModernBERT's building blocks.

Why a second layer kind: BERT-family layers normalise *after* each residual add
(``layers.transformer``); pre-norm encoders normalise each block's *input* and leave the
residual stream un-normalised until a final LayerNorm after the last layer. Their MLP is gated:
one projection to 2 x intermediate, split in two halves, ``act(input) * gate``, then back to D.

This reproduces transformers' ``models/modernbert/modeling_modernbert.py``:

- ``ModernBertEncoderLayer.forward``: ``h = x + Attn(attn_norm(x))``; ``h + MLP(mlp_norm(h))``,
  with ``attn_norm`` an Identity in layer 0 (its input is the embeddings' LayerNorm already);
- ``ModernBertMLP.forward``: ``input, gate = Wi(x).chunk(2, dim=-1)``; ``Wo(act(input) * gate)``;
- ``ModernBertEmbeddings.forward``: ``norm(tok_embeddings(ids))``, no position or token-type table
  (positions are rotary, in the attention: ``layers.rotary``).

Linears and LayerNorms have a bias or not as the config says (``attention_bias``, ``mlp_bias``,
``norm_bias``; ModernBERT ships none). LayerNorms run in float32 (``Fp32LayerNorm``), as in the
post-norm layers. The attention is the reference ``SelfAttention`` (a local window, rotary
positions), with Q/K/V fused into one ``w_qkv`` as ModernBERT stores them (``Wqkv``).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from attn_export.layers.encoder_config import EncoderConfig
from attn_export.layers.position_bias import RelativePositionBias
from attn_export.layers.projections import fuse_qkv_
from attn_export.layers.rotary import RotaryEmbedding
from attn_export.layers.self_attention import SelfAttention
from attn_export.layers.transformer import Fp32LayerNorm

__all__ = ["GatedMLP", "PreNormLayer", "TokenEmbeddings"]

log = logging.getLogger(__name__)


class GatedMLP(nn.Module):
    """x (..., D) -> w_out(act(a) * g), with (a, g) = w_in(x).chunk(2): a GLU (GeGLU with GELU)."""

    def __init__(self, d_model: int, d_ffn: int, act: nn.Module, bias: bool = True) -> None:
        super().__init__()
        self.w_in = nn.Linear(d_model, 2 * d_ffn, bias=bias)
        self.act = act
        self.w_out = nn.Linear(d_ffn, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, gate = self.w_in(x).chunk(2, dim=-1)  # (..., I) each
        return self.w_out(self.act(a) * gate)  # (..., D)


class PreNormLayer(nn.Module):
    """x -> h = x + Attn(attn_norm(x)) -> h + MLP(mlp_norm(h)); ``first``: attn_norm is an Identity.

    Same call signature as ``TransformerLayer`` (``(x, key_padding_mask, position_bias)``) and the
    same two halves the packed form runs on rows (``attention_input``, ``after_attention``).
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        d_ffn: int,
        act: nn.Module,
        *,
        first: bool = False,
        eps: float = 1e-5,
        window: int | None = None,
        rotary: RotaryEmbedding | None = None,
        attention_bias: bool = True,
        mlp_bias: bool = True,
        norm_bias: bool = True,
        position_bias: RelativePositionBias | None = None,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.heads = heads
        self.attn_norm: nn.Module = nn.Identity() if first else Fp32LayerNorm(d_model, eps=eps, bias=norm_bias)
        self.self_attn = SelfAttention(d_model, heads, window=window, bias=attention_bias, rotary=rotary)
        fuse_qkv_(self.self_attn)  # one w_qkv, as the checkpoint stores Wqkv
        self.mlp_norm = Fp32LayerNorm(d_model, eps=eps, bias=norm_bias)
        self.mlp = GatedMLP(d_model, d_ffn, act, bias=mlp_bias)
        self.position_bias = position_bias

    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention projects: the normalised input (any leading shape)."""
        return self.attn_norm(x)

    def forward(
        self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, position_bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if position_bias is None and self.position_bias is not None:
            position_bias = self.position_bias.for_length(x.shape[1], x.device)  # (1, H, L, L)
        attn, _ = self.self_attn(self.attention_input(x), key_padding_mask, need_weights=False, bias=position_bias)  # (B, L, D)
        return self.after_attention(x, attn)

    def after_attention(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The residual around the attention output, then the MLP block with its residual; any leading shape."""
        h = x + attn
        return h + self.mlp(self.mlp_norm(h))


class TokenEmbeddings(nn.Module):
    """input_ids (B, S) -> LayerNorm(word[ids]) (B, S, D): no position or token-type table.

    The interface of ``BertEmbeddings`` the encoder and its packed form use: ``position_ids``
    (``arange(S)``, what the rotary attention rotates by) and ``embed(ids, positions)``.
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.norm = Fp32LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.norm_bias)

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, S) ids -> (S,) ``arange``: transformers' default ``position_ids``, whatever the padding."""
        return torch.arange(input_ids.shape[1], device=input_ids.device)

    def embed(self, ids: torch.Tensor, positions: torch.Tensor, types: torch.Tensor | None = None) -> torch.Tensor:
        """LayerNorm(word[ids]); ``positions`` is unused here (rotary positions live in the attention), and so are
        ``types`` (no token-type table: ``use_token_types_`` refuses such a model before any type reaches it)."""
        return self.norm(self.word_embeddings(ids))

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.norm(self.word_embeddings(input_ids))  # (B, S, D); token types: none
