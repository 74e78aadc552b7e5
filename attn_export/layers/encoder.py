"""A BERT-family sentence encoder built from the reference ``TransformerLayer``s.

Pretrained encoders (all-MiniLM-L6-v2 and the like) are what users bring, and random
weights hide what compression does to them. This module is the eager model such a
checkpoint loads into: token + position + token-type embeddings, a stack of post-norm
``TransformerLayer``s (exact-erf GELU, the checkpoint's LayerNorm eps), and
sentence-transformers' mean pooling followed by L2 normalisation.

Its ``forward(input_ids, attention_mask)`` is the exported interface (``docs/encoder.md``):
``input_ids`` and ``attention_mask`` are int64 (B, S), 1 = real token, and the outputs are
``last_hidden_state`` (B, S, D) and ``sentence_embedding`` (B, D), unit length.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attn_export.errors import ConfigError
from attn_export.layers.registry import MaskedLayer
from attn_export.layers.transformer import Fp32LayerNorm, TransformerLayer

__all__ = [
    "ACTIVATIONS",
    "BertEmbeddings",
    "EncoderConfig",
    "SentenceEncoder",
    "mean_pool",
    "parse_layers",
]

log = logging.getLogger(__name__)

ACTIVATIONS: tuple[str, ...] = ("gelu", "relu")  # BERT's "gelu" is the exact erf form


@dataclass(frozen=True)
class EncoderConfig:
    """The shape of a BERT-family encoder (the fields of a Hugging Face ``config.json``)."""

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

    def __post_init__(self) -> None:
        sizes = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size,
        }
        for name, value in sizes.items():
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"expected {name} to be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"expected hidden_size divisible by num_attention_heads, got {self.hidden_size} and {self.num_attention_heads}; fix the encoder config"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"expected hidden_act in {', '.join(ACTIVATIONS)}, got {self.hidden_act!r}")
        if not 0.0 < self.layer_norm_eps < 1.0:
            raise ConfigError(f"expected 0 < layer_norm_eps < 1, got {self.layer_norm_eps}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class BertEmbeddings(nn.Module):
    """input_ids (B, S) -> LayerNorm(word + token_type[0] + position) (B, S, D).

    Token types are always 0 (single-sentence input, as sentence-transformers encodes).
    Positions are ``arange(S)`` gathered from the table, so exported graphs stay dynamic in S.
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, d)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, d)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, d)
        self.norm = Fp32LayerNorm(d, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (S,)
        return self.embed(input_ids, positions)  # (B, S, D)

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """LayerNorm(word[ids] + token_type[0] + position[positions]); ``positions`` broadcasts against ``ids``.

        The padded model passes ids (B, S) with positions (S,); the packed form
        (``layers.packed``) passes the real tokens (T,) with each one's own position (T,).
        """
        x = self.word_embeddings(ids) + self.token_type_embeddings.weight[0]  # (..., D)
        x = x + self.position_embeddings(positions)  # same order as BERT
        return self.norm(x)


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens, then L2-normalised, computed in float32: (B, S, D) -> (B, D).

    Exactly sentence-transformers' Pooling(mean) + Normalize: sum / max(count, 1e-9), then
    x / max(|x|, 1e-12). Float32 so that a half-precision encoder still returns unit vectors.
    """
    keep = attention_mask.to(torch.float32).unsqueeze(-1)  # (B, S, 1)
    summed = (hidden.float() * keep).sum(dim=1)  # (B, D)
    count = keep.sum(dim=1).clamp(min=1e-9)  # (B, 1)
    return F.normalize(summed / count, p=2.0, dim=-1, eps=1e-12)  # (B, D)


class SentenceEncoder(nn.Module):
    """Embeddings -> N x TransformerLayer (post-norm) -> (last_hidden_state, sentence_embedding)."""

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
                activation=config.hidden_act,
                dropout=0.0,
                eps=config.layer_norm_eps,
                d_ffn=config.intermediate_size,
            )
            for _ in range(config.num_hidden_layers)
        )

    @property
    def d_model(self) -> int:
        return self.config.hidden_size

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.embeddings(input_ids)  # (B, S, D)
        for layer in self.layers:
            h = layer(h, attention_mask)  # (B, S, D); attention_mask (B, S), 1 = keep
        return h, mean_pool(h, attention_mask)  # (B, S, D), (B, D)

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
