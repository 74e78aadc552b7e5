"""A BERT-family encoder built from the reference ``TransformerLayer``s, with the model's pooling and task head.

Pretrained encoders (all-MiniLM-L6-v2, BGE, E5, fine-tuned RoBERTa/XLM-R/DistilBERT/ELECTRA/ALBERT
classifiers) are what users bring, and random weights hide what compression does to them.
This module is the eager model such a checkpoint loads into; ``EncoderConfig`` holds what
differs between the families (``attn_export.checkpoint.families`` fills it from config.json):

- embeddings: word + token-type (none for DistilBERT) + position, LayerNorm, then, for
  factorised embeddings (``embedding_size`` set: ELECTRA's ``embeddings_project``, ALBERT's
  ``embedding_hidden_mapping_in``), a Linear from ``embedding_size`` to ``hidden_size``. Positions
  are ``arange(S)`` (``"absolute"``, BERT) or RoBERTa's ``padding_idx + cumsum(ids != pad)``
  with pads at ``padding_idx`` (``"padded"``: RoBERTa, XLM-R, CamemBERT; transformers'
  ``create_position_ids_from_input_ids``), both computed in-graph so exports stay dynamic in S;
- a stack of post-norm ``TransformerLayer``s with the checkpoint's activation and LayerNorm eps;
  with ``shared_layers`` (ALBERT) one layer's module sits at every depth of ``layers``, so
  code that walks the depth is unchanged and the export reads one set of weights at every depth;
- with ``relative_attention_buckets`` (MPNet), one relative position bias table
  (``layers.position_bias``) shared by every layer: the bias is computed once per forward
  from ``arange(S)`` and added to every layer's attention scores;
- with ``disentangled`` (DeBERTa-v2/v3), every layer's attention is ``DisentangledSelfAttention``
  (``layers.disentangled``) over one shared ``RelativeEmbeddings`` table (``relative``), the
  embeddings are projected then normed (``norm_after_projection``, a bias-free ``embed_proj``) or
  have no position table (positions ``"none"``), and with ``conv_kernel_size`` a ``TokenConv``
  (``layers.token_conv``) runs after layer 0;
- with ``layer_kind`` ``"pre-norm-glu"`` (ModernBERT), token-only embeddings, pre-norm GeGLU
  layers (``layers.prenorm``) with rotary positions (``layers.rotary``: one base for global,
  one for local layers) and a local window on ``local_layers``, then a final LayerNorm;
- the model's sentence pooling (``attn_export.layers.pooling``) and optional task head
  (``attn_export.layers.heads``).

Its ``forward(input_ids, attention_mask[, token_type_ids])`` is the exported interface
(``docs/encoder.md``): int64 (B, S) inputs, 1 = real token; outputs ``last_hidden_state`` (B, S, D),
``sentence_embedding`` (B, D') and, with a head, ``logits``. ``input_names`` says which inputs an
encoder takes (``encoder_input_names``, the one place that decides): ``input_ids`` and
``attention_mask``, and ``token_type_ids`` only once ``use_token_types_()`` was called (a
cross-encoder over ``[CLS] A [SEP] B [SEP]`` pairs whose B is type 1). Without it every token is
type 0, what single sentences (and RoBERTa-style pairs) are, and the export takes two inputs.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from attn_export.errors import ConfigError
from attn_export.layers.encoder_config import ACTIVATIONS, POSITION_STYLES, EncoderConfig, parse_layers
from attn_export.layers.disentangled import DisentangledSelfAttention, RelativeEmbeddings
from attn_export.layers.heads import build_head
from attn_export.layers.pooling import SentencePooling
from attn_export.layers.position_bias import RelativePositionBias
from attn_export.layers.prenorm import PreNormLayer, TokenEmbeddings
from attn_export.layers.registry import MaskedLayer
from attn_export.layers.rotary import RotaryEmbedding
from attn_export.layers.token_conv import TokenConv
from attn_export.layers.transformer import Fp32LayerNorm, TransformerLayer

__all__ = [
    "ENCODER_INPUTS",
    "TOKEN_TYPE_INPUT",
    "ACTIVATIONS",
    "POSITION_STYLES",
    "BertEmbeddings",
    "EncoderConfig",
    "SentenceEncoder",
    "activation_module",
    "encoder_input_names",
    "parse_layers",
]

log = logging.getLogger(__name__)

ENCODER_INPUTS: tuple[str, ...] = ("input_ids", "attention_mask")  # every encoder's inputs, int64 (B, S)
TOKEN_TYPE_INPUT = "token_type_ids"  # int64 (B, S), 0 = segment A, 1 = segment B: only a typed-pair encoder's


def encoder_input_names(token_types: bool = False) -> tuple[str, ...]:
    """The exported encoder's input names, in graph order: the one place that decides them (feeds, exports,
    runners and profiles all read this). ``token_types``: the encoder takes ``token_type_ids`` as a third input."""
    return (*ENCODER_INPUTS, TOKEN_TYPE_INPUT) if token_types else ENCODER_INPUTS


def activation_module(name: str) -> nn.Module:
    """The torch module for a Hugging Face ``hidden_act`` name in ``ACTIVATIONS``."""
    if name == "gelu":
        return nn.GELU()
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return nn.GELU(approximate="tanh")
    if name == "relu":
        return nn.ReLU()
    if name in ("silu", "swish"):
        return nn.SiLU()
    raise ConfigError(f"expected hidden_act in {', '.join(ACTIVATIONS)}, got {name!r}")


class BertEmbeddings(nn.Module):
    """input_ids (B, S) -> [project](LayerNorm(word + token_type + position)) (B, S, D).

    Without ``token_type_ids`` every token has type 0 (single-sentence input, as
    sentence-transformers encodes). Positions are built in-graph from ``input_ids`` (see the
    module docstring), so exported graphs stay dynamic in S.
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        e, d = config.embedding_dim, config.hidden_size
        self.positions = config.positions
        self.pad_token_id = config.pad_token_id
        self.word_embeddings = nn.Embedding(config.vocab_size, e)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, e) if config.positions != "none" else None
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, e) if config.type_vocab_size else None
        # DeBERTa-v2 projects the sum, then normalises (hidden_size wide); the others normalise, then project
        self.norm_after_projection = config.norm_after_projection
        self.norm = Fp32LayerNorm(d if config.norm_after_projection else e, eps=config.layer_norm_eps)
        self.project = nn.Linear(e, d, bias=config.projection_bias) if config.embedding_size is not None else None  # factorised embeddings

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, S) ids -> (S,) ``arange`` or (B, S) RoBERTa positions (pads at ``padding_idx``); ``arange`` for ``"none"``
        (no table: the positions relative attention measures distances between)."""
        if self.positions in ("absolute", "none"):
            return torch.arange(input_ids.shape[1], device=input_ids.device)  # (S,)
        # transformers' create_position_ids_from_input_ids, with the running count in float32: exact (counts < 2^24),
        # and TensorRT's parser runs CumSum on float only (check-trt: an int CumSum is an error on every release)
        real = input_ids.ne(self.pad_token_id).to(torch.float32)  # (B, S)
        return (torch.cumsum(real, dim=1) * real).long() + self.pad_token_id  # (B, S)

    def embed(self, ids: torch.Tensor, positions: torch.Tensor, types: torch.Tensor | None = None) -> torch.Tensor:
        """LayerNorm(word[ids] + token_type[types or 0] + position[positions]) (projected when factorised);
        ``positions`` broadcasts against ``ids``, ``types`` (None: all type 0) has ``ids``' shape.

        The packed form (``layers.packed``) passes the real tokens (T,) with each one's own
        position id (T,), read from ``position_ids`` of the padded batch, and its own token type (T,).
        Same sum and order as transformers' ``BertEmbeddings.forward`` (models/bert/modeling_bert.py).
        """
        x = self.word_embeddings(ids)  # (..., E)
        if self.token_type_embeddings is not None:
            x = x + (self.token_type_embeddings.weight[0] if types is None else self.token_type_embeddings(types))  # (E,) or (..., E)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(positions)  # same order as BERT and RoBERTa
        return self._norm_and_project(x)  # (..., D)

    def _norm_and_project(self, x: torch.Tensor) -> torch.Tensor:
        """LayerNorm then the factorised projection (BERT family), or projection then LayerNorm (DeBERTa-v2)."""
        if self.norm_after_projection:
            return self.norm(x if self.project is None else self.project(x))
        x = self.norm(x)
        return x if self.project is None else self.project(x)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.embed(input_ids, self.position_ids(input_ids), token_type_ids)  # (B, S, D)


def _deberta_parts(config: EncoderConfig, layers: list[TransformerLayer]) -> tuple[RelativeEmbeddings | None, TokenConv | None]:
    """DeBERTa-v2's parts, when the config has them: each layer's attention made disentangled over one shared
    ``RelativeEmbeddings`` (None without relative attention), and the ``TokenConv`` run after layer 0."""
    dis = config.disentangled
    relative = None
    if dis is not None:
        relative = RelativeEmbeddings(dis, config.hidden_size, config.layer_norm_eps) if dis.relative or dis.norm else None
        for layer in layers:
            layer.self_attn = DisentangledSelfAttention(config.hidden_size, config.num_attention_heads, dis, relative)
    conv = None
    if config.conv_kernel_size:
        conv = TokenConv(config.hidden_size, config.conv_kernel_size, config.conv_groups, config.conv_act, config.layer_norm_eps)
    return relative, conv


class SentenceEncoder(nn.Module):
    """Embeddings -> N x TransformerLayer (post-norm) or PreNormLayer (+ final norm) -> (last_hidden_state, sentence_embedding[, logits])."""

    input_names: tuple[str, ...] = ENCODER_INPUTS  # with token_type_ids after use_token_types_()
    output_names: tuple[str, ...] = ("last_hidden_state", "sentence_embedding")

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings: nn.Module = TokenEmbeddings(config) if config.layer_kind == "pre-norm-glu" else BertEmbeddings(config)
        # dropout 0: this model is for inference and for compression/distillation, where
        # the checkpoint's training-time dropout would only add noise to the student.
        distinct = 1 if config.shared_layers else config.num_hidden_layers
        # registered before the layers, so its state-dict name is position_bias.* (the layers share the module)
        self.position_bias = (
            RelativePositionBias(config.num_attention_heads, config.relative_attention_buckets, config.relative_attention_max_distance)
            if config.relative_attention_buckets
            else None
        )
        weights: list[nn.Module] = _pre_norm_layers(config, self.position_bias) if config.layer_kind == "pre-norm-glu" else [
            TransformerLayer(
                config.hidden_size,
                config.num_attention_heads,
                activation="relu" if config.hidden_act == "relu" else "gelu",
                dropout=0.0,
                eps=config.layer_norm_eps,
                d_ffn=config.intermediate_size,
                position_bias=self.position_bias,
            )
            for _ in range(distinct)
        ]
        for layer in weights:  # TransformerLayer knows relu/gelu; the families also need the tanh GELU and SiLU
            if isinstance(layer, TransformerLayer):
                layer.act = activation_module(config.hidden_act)
        # DeBERTa-v2: disentangled attention over one shared relative embedding table, a token convolution after layer 0
        self.relative, self.conv = _deberta_parts(config, weights)
        # depth i runs weights[i] or, shared across depth, weights[0]: the same module object at every index
        self.layers = nn.ModuleList(weights[i % distinct] for i in range(config.num_hidden_layers))
        # pre-norm layers leave the residual stream un-normalised: a final LayerNorm (ModernBERT's final_norm)
        self.final_norm = (
            Fp32LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.norm_bias) if config.layer_kind == "pre-norm-glu" else None
        )
        self.pooling = SentencePooling(config.pooling)
        self.head = build_head(config.head, config.hidden_size, eps=config.layer_norm_eps, norm_bias=config.norm_bias)
        if config.head is not None:
            self.output_names = (*SentenceEncoder.output_names, "logits")

    @property
    def d_model(self) -> int:
        return self.config.hidden_size

    @property
    def takes_token_types(self) -> bool:
        return TOKEN_TYPE_INPUT in self.input_names

    def use_token_types_(self) -> SentenceEncoder:
        """Take ``token_type_ids`` as a third input (export, runners, feeds): a cross-encoder fed ``[CLS] A [SEP] B [SEP]``
        pairs whose B is type 1. In place (copies made with ``copy.deepcopy`` keep it); refused without a type-1 embedding."""
        if self.config.type_vocab_size < 2:
            raise ConfigError(f"expected a token-type embedding with type 1 (type_vocab_size >= 2) for token_type_ids, got type_vocab_size "
                              f"{self.config.type_vocab_size}; feed this model single texts or pairs its tokenizer types all 0")  # fmt: skip
        self.input_names = encoder_input_names(token_types=True)
        return self

    def outputs(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The last layer's hidden states (B, S, D) -> (hidden, sentence_embedding[, logits])."""
        emb = self.pooling(hidden, attention_mask)  # (B, D'), float32
        if self.head is None:
            return hidden, emb
        return hidden, emb, self.head(hidden, attention_mask)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        h = embedded = self.embeddings(input_ids, token_type_ids)  # (B, S, D)
        bias = None if self.position_bias is None else self.position_bias.for_length(input_ids.shape[1], input_ids.device)  # (1, H, S, S)
        for i, layer in enumerate(self.layers):
            h = layer(h, attention_mask, bias)  # (B, S, D); attention_mask (B, S), 1 = keep
            if i == 0 and self.conv is not None:
                h = self.conv(embedded, h, attention_mask)  # DeBERTa-v2's ConvLayer (layers.token_conv)
        if self.final_norm is not None:
            h = self.final_norm(h)
        return self.outputs(h, attention_mask)

    def subject(self, layers: str | int) -> nn.Module:
        """The module a pipeline works on: the whole encoder (``"all"``) or layer N.

        Layer N comes back as ``MaskedLayer(layer, "padding")``, so its signature is the
        reference layers' ``(x, key_padding_mask) -> y``; it shares weights with the encoder.
        """
        index = parse_layers(layers, len(self.layers))
        if index is None:
            return self
        return MaskedLayer(self.layers[index], "padding").eval()


def _pre_norm_layers(config: EncoderConfig, position_bias: RelativePositionBias | None) -> list[nn.Module]:
    """ModernBERT's layers (``layers.prenorm``): layer 0 without attn_norm; local layers windowed, each kind with its rotary base.

    One ``RotaryEmbedding`` per base, shared by the layers that use it (it holds no weights).
    """
    if config.shared_layers:
        raise ConfigError("expected distinct layers for pre-norm-glu layers, got shared_layers; no pre-norm family shares its layers")
    rotary = {
        kind: RotaryEmbedding(config.head_dim, theta) if config.positions == "rotary" else None
        for kind, theta in (("global", config.rope_theta), ("local", config.local_rope_theta))
    }
    layers: list[nn.Module] = []
    for i in range(config.num_hidden_layers):
        window = config.window_of(i)
        layers.append(PreNormLayer(
            config.hidden_size, config.num_attention_heads, config.intermediate_size, activation_module(config.hidden_act),
            first=i == 0, eps=config.layer_norm_eps, window=window, rotary=rotary["global" if window is None else "local"],
            attention_bias=config.attention_bias, mlp_bias=config.mlp_bias, norm_bias=config.norm_bias, position_bias=position_bias,
        ))  # fmt: skip
    return layers
