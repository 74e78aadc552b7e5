"""Sentence pooling as sentence-transformers computes it, inside the exported graph.

A sentence-embedding model is its encoder *and* its pooling: BGE and E5-style models ship
CLS pooling, all-MiniLM-L6-v2 ships mean pooling followed by Normalize, and an export that
always means-pools certifies the wrong vector (issue 19: cosine 0.457 against
``SentenceTransformer.encode`` for a CLS model). So the pooling is data (``PoolingConfig``)
read from the model's own files (``attn_export.checkpoint.pooling``) and computed here with
the formulas of sentence-transformers' ``Pooling._forward_padded`` (sentence-transformers
6.2, ``sentence_transformer/modules/pooling.py``) and ``Normalize`` (``F.normalize``, eps 1e-12):

- ``cls``: the first real token (``argmax`` of the mask, so left padding works too);
- ``max``: padded positions set to -inf, then the maximum over the sequence;
- ``mean``: ``sum(h * m) / max(sum(m), 1e-9)``; ``mean_sqrt_len_tokens``: divided by ``sqrt`` instead;
- ``weightedmean``: position weights 1, 2, ... from the first real token, ``sum(h * w) / max(sum(w), 1e-9)``;
- ``lasttoken``: the last real token (zeros for a row without one).

Several modes are concatenated in the configured order, as sentence-transformers does. Every
formula runs in float32 (a half-precision encoder still returns float32 embeddings) and uses
only ops the ONNX exporter maps one-to-one (ArgMax on int32, as sentence-transformers avoids
int64 ArgMax for onnxruntime issue 10068).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from attn_export.errors import ConfigError
from attn_export.layers.encoder_config import PoolingConfig
from attn_export.vocab.choices import POOLING_MODES

__all__ = ["PoolingConfig", "SentencePooling", "pool"]

log = logging.getLogger(__name__)




def _gather_rows(h: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """h (B, S, D), index (B,) -> h[b, index[b]] (B, D)."""
    return torch.gather(h, 1, index.to(torch.int64).view(-1, 1, 1).expand(-1, 1, h.shape[-1])).squeeze(1)


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, modes: tuple[str, ...] = ("mean",), normalize: bool = True) -> torch.Tensor:
    """(B, S, D) hidden states and a (B, S) mask (1 = real token) -> (B, len(modes) * D) float32."""
    h = hidden.float()  # (B, S, D)
    keep = attention_mask.to(torch.float32).unsqueeze(-1)  # (B, S, 1)
    mask32 = attention_mask.to(torch.int32)  # (B, S); int32: onnxruntime's ArgMax has no int64 kernel
    first = mask32.argmax(dim=1)  # (B,) first real token
    out: list[torch.Tensor] = []
    for mode in modes:
        if mode == "cls":
            out.append(_gather_rows(h, first))
        elif mode == "max":
            out.append(h.masked_fill(keep == 0, float("-inf")).max(dim=1).values)
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            count = keep.sum(dim=1).clamp(min=1e-9)  # (B, 1)
            out.append((h * keep).sum(dim=1) / (count if mode == "mean" else torch.sqrt(count)))
        elif mode == "weightedmean":
            steps = torch.arange(1, h.shape[1] + 1, device=h.device, dtype=torch.float32).view(1, -1, 1)  # (1, S, 1)
            weights = keep * (steps - first.to(torch.float32).view(-1, 1, 1))  # (B, S, 1): 1, 2, ... from the first real token
            out.append((h * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9))
        elif mode == "lasttoken":
            steps = torch.arange(1, h.shape[1] + 1, device=h.device, dtype=torch.int32).view(1, -1)  # (1, S)
            last = (mask32 * steps).argmax(dim=1)  # (B,) last real token; 0 for a row without one, as in sentence-transformers
            out.append(_gather_rows(h * keep, last))
        else:  # PoolingConfig refuses unknown modes; a direct caller gets the same line
            raise ConfigError(f"expected pooling modes in {', '.join(POOLING_MODES)}, got {mode!r}")
    emb = out[0] if len(out) == 1 else torch.cat(out, dim=-1)  # (B, len(modes) * D)
    return F.normalize(emb, p=2.0, dim=-1, eps=1e-12) if normalize else emb


class SentencePooling(nn.Module):
    """(hidden (B, S, D), attention_mask (B, S)) -> sentence_embedding (B, len(modes) * D), float32."""

    def __init__(self, config: PoolingConfig | None = None) -> None:
        super().__init__()
        self.config = config or PoolingConfig()

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return pool(hidden, attention_mask, self.config.modes, self.config.normalize)

    def extra_repr(self) -> str:
        return f"{self.config.name} (from {self.config.source})"
