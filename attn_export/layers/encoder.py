"""A BERT-family encoder built from the reference ``TransformerLayer``s, with the model's pooling and task head.

Pretrained encoders (all-MiniLM-L6-v2, BGE, E5, fine-tuned RoBERTa/XLM-R/DistilBERT/ELECTRA
classifiers) are what users bring, and random weights hide what compression does to them.
This module is the eager model such a checkpoint loads into; ``EncoderConfig`` holds what
differs between the families (``attn_export.checkpoint.families`` fills it from config.json):

- embeddings: word + token-type (none for DistilBERT) + position, LayerNorm, then ELECTRA's
  ``embeddings_project`` when its ``embedding_size`` differs from ``hidden_size``. Positions
  are ``arange(S)`` (``"absolute"``, BERT) or RoBERTa's ``padding_idx + cumsum(ids != pad)``
  with pads at ``padding_idx`` (``"padded"``: RoBERTa, XLM-R, CamemBERT; transformers'
  ``create_position_ids_from_input_ids``), both computed in-graph so exports stay dynamic in S;
- a stack of post-norm ``TransformerLayer``s with the checkpoint's activation and LayerNorm eps;
- the model's sentence pooling (``attn_export.layers.pooling``) and optional task head
  (``attn_export.layers.heads``).

Its ``forward(input_ids, attention_mask)`` is the exported interface (``docs/encoder.md``):
int64 (B, S) inputs, 1 = real token; outputs ``last_hidden_state`` (B, S, D),
``sentence_embedding`` (B, D') and, with a head, ``logits``. ``token_type_ids`` is an optional
eager-only third argument (single sentences are type 0, which is what the export computes).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from attn_export.errors import ConfigError
from attn_export.layers.heads import HeadConfig, build_head
from attn_export.layers.pooling import PoolingConfig, SentencePooling, mean_pool
from attn_export.layers.registry import MaskedLayer
from attn_export.layers.transformer import Fp32LayerNorm, TransformerLayer

__all__ = [
    "ACTIVATIONS",
    "POSITION_STYLES",
    "BertEmbeddings",
    "EncoderConfig",
    "SentenceEncoder",
    "activation_module",
    "mean_pool",
    "parse_layers",
]

log = logging.getLogger(__name__)

# Hugging Face ``hidden_act`` names (transformers' ACT2CLS) this model reproduces exactly:
# "gelu" is the exact erf form; "gelu_new" and "gelu_pytorch_tanh" are the tanh approximation,
# exported as such (one ONNX Gelu with approximate="tanh" from opset 20); "swish" is SiLU.
ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")
POSITION_STYLES: tuple[str, ...] = ("absolute", "padded")


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


@dataclass(frozen=True)
class EncoderConfig:
    """The shape of a BERT-family encoder (the fields of a Hugging Face ``config.json``, per family).

    ``type_vocab_size`` 0 means no token-type embedding (DistilBERT); ``embedding_size`` None
    means ``hidden_size`` (no projection); ``family`` is the checkpoint's ``model_type``.
    """

    vocab_size: int = 30522
    hidden_size: int = 384
    num_attention_heads: int = 12
    num_hidden_layers: int = 6
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0
    family: str = "bert"
    positions: str = "absolute"
    embedding_size: int | None = None
    pooling: PoolingConfig = field(default_factory=PoolingConfig)
    head: HeadConfig | None = None

    def __post_init__(self) -> None:
        sizes = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "embedding_size": self.embedding_size if self.embedding_size is not None else 1,
        }
        for name, value in sizes.items():
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"expected {name} to be a positive integer, got {value!r}")
        if not isinstance(self.type_vocab_size, int) or self.type_vocab_size < 0:
            raise ConfigError(f"expected type_vocab_size to be a non-negative integer (0 = no token types), got {self.type_vocab_size!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"expected hidden_size divisible by num_attention_heads, got {self.hidden_size} and {self.num_attention_heads}; fix the encoder config"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"expected hidden_act in {', '.join(ACTIVATIONS)}, got {self.hidden_act!r}")
        if not 0.0 < self.layer_norm_eps < 1.0:
            raise ConfigError(f"expected 0 < layer_norm_eps < 1, got {self.layer_norm_eps}")
        if self.positions not in POSITION_STYLES:
            raise ConfigError(f"expected positions in {', '.join(POSITION_STYLES)}, got {self.positions!r}")
        if self.max_tokens < 1:
            raise ConfigError(
                f"expected max_position_embeddings > pad_token_id + 1 for {self.positions} positions, got {self.max_position_embeddings} and pad {self.pad_token_id}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def embedding_dim(self) -> int:
        """Width of the embedding tables (ELECTRA-small: 128, projected to ``hidden_size``)."""
        return self.embedding_size or self.hidden_size

    @property
    def max_tokens(self) -> int:
        """The longest input the position table covers: RoBERTa-style positions start at pad + 1 (514 -> 512)."""
        offset = self.pad_token_id + 1 if self.positions == "padded" else 0
        return self.max_position_embeddings - offset


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
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, e)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, e) if config.type_vocab_size else None
        self.norm = Fp32LayerNorm(e, eps=config.layer_norm_eps)
        self.project = nn.Linear(e, d) if e != d else None  # ELECTRA's embeddings_project

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, S) ids -> (S,) ``arange`` or (B, S) RoBERTa positions (pads at ``padding_idx``)."""
        if self.positions == "absolute":
            return torch.arange(input_ids.shape[1], device=input_ids.device)  # (S,)
        # transformers' create_position_ids_from_input_ids, casts included (int32 cumsum)
        real = input_ids.ne(self.pad_token_id).int()  # (B, S)
        return (torch.cumsum(real, dim=1).type_as(real) * real).long() + self.pad_token_id  # (B, S)

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """LayerNorm(word[ids] + token_type[0] + position[positions]) (projected for ELECTRA); ``positions`` broadcasts against ``ids``.

        The packed form (``layers.packed``) passes the real tokens (T,) with each one's own
        position id (T,), read from ``position_ids`` of the padded batch.
        """
        x = self.word_embeddings(ids)  # (..., E)
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings.weight[0]
        x = self.norm(x + self.position_embeddings(positions))  # same order as BERT and RoBERTa
        return x if self.project is None else self.project(x)  # (..., D)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.word_embeddings(input_ids)  # (B, S, E)
        if self.token_type_embeddings is not None:
            types = self.token_type_embeddings.weight[0] if token_type_ids is None else self.token_type_embeddings(token_type_ids)
            x = x + types  # (B, S, E) + (E,) or (B, S, E)
        x = x + self.position_embeddings(self.position_ids(input_ids))  # same order as BERT and RoBERTa
        x = self.norm(x)
        return x if self.project is None else self.project(x)  # (B, S, D)


class SentenceEncoder(nn.Module):
    """Embeddings -> N x TransformerLayer (post-norm) -> (last_hidden_state, sentence_embedding[, logits])."""

    input_names: tuple[str, ...] = ("input_ids", "attention_mask")
    output_names: tuple[str, ...] = ("last_hidden_state", "sentence_embedding")

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        # dropout 0: this model is for inference and for compression/distillation, where
        # the checkpoint's training-time dropout would only add noise to the student.
        self.layers = nn.ModuleList(
            TransformerLayer(
                config.hidden_size,
                config.num_attention_heads,
                activation="relu" if config.hidden_act == "relu" else "gelu",
                dropout=0.0,
                eps=config.layer_norm_eps,
                d_ffn=config.intermediate_size,
            )
            for _ in range(config.num_hidden_layers)
        )
        for layer in self.layers:  # TransformerLayer knows relu/gelu; the families also need the tanh GELU and SiLU
            layer.act = activation_module(config.hidden_act)
        self.pooling = SentencePooling(config.pooling)
        self.head = build_head(config.head, config.hidden_size)
        if config.head is not None:
            self.output_names = (*SentenceEncoder.output_names, "logits")

    @property
    def d_model(self) -> int:
        return self.config.hidden_size

    def outputs(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The last layer's hidden states (B, S, D) -> (hidden, sentence_embedding[, logits])."""
        emb = self.pooling(hidden, attention_mask)  # (B, D'), float32
        if self.head is None:
            return hidden, emb
        return hidden, emb, self.head(hidden)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        h = self.embeddings(input_ids, token_type_ids)  # (B, S, D)
        for layer in self.layers:
            h = layer(h, attention_mask)  # (B, S, D); attention_mask (B, S), 1 = keep
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


def parse_layers(layers: str | int | None, num_layers: int) -> int | None:
    """``"all"``/None -> None (the whole encoder); ``"N"``/N -> N, checked against the depth."""
    if layers is None or (isinstance(layers, str) and layers.strip().lower() == "all"):
        return None
    try:
        index = int(layers)
    except (TypeError, ValueError):
        raise ConfigError(f"expected --layers all or a layer index 0..{num_layers - 1}, got {layers!r}") from None
    if not 0 <= index < num_layers:
        raise ConfigError(f"expected --layers all or a layer index 0..{num_layers - 1}, got {index}")
    return index
