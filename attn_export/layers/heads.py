"""The task heads users deploy on an encoder: sequence and token classification.

A fine-tuned classifier is judged by its logits, not by a sentence embedding, so the head is
part of the exported model (an extra output ``logits``). Each library's head is reproduced
exactly (transformers 5.x, ``models/<family>/modeling_<family>.py``). Every supported family's
sequence head is the same shape, dense -> activation -> out on token 0, and differs only in the
activation, which its family file (``checkpoint/families/<name>.py``) names and ``HeadConfig``
carries: tanh (BERT's and ALBERT's pooler, RoBERTa's ``ClassificationHead``), GELU (erf:
``ElectraClassificationHead``), ReLU (DistilBERT's ``pre_classifier``). Every
``...ForTokenClassification`` is one Linear on every token. The family maps its module names
onto ``head.dense`` and ``head.out``.

ModernBERT's heads (``ModernBertForSequenceClassification`` / ``...ForTokenClassification``) run
``ModernBertPredictionHead`` (dense -> activation -> LayerNorm, ``head.norm``) before the output
Linear, on the pooled vector (``classifier_pooling``: token 0 or the mean over real tokens,
``(h * mask).sum(1) / mask.sum(1)``) or on every token; ``HeadConfig`` carries that as data
(``norm``, ``pooling``, ``dense_bias``).

Dropout is left out: these modules are for inference, compression and distillation.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from attn_export.errors import ConfigError
from attn_export.layers.encoder_config import HEAD_ACTIVATIONS, HeadConfig
from attn_export.layers.transformer import Fp32LayerNorm

__all__ = ["ACTIVATION_MODULES", "HEAD_ACTIVATIONS", "HeadConfig", "SequenceClassificationHead", "TokenClassificationHead", "build_head"]

log = logging.getLogger(__name__)

# keys: encoder_config.HEAD_ACTIVATIONS (tests/layers/test_encoder_config.py holds them equal)
ACTIVATION_MODULES: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "gelu": nn.GELU, "relu": nn.ReLU}


class SequenceClassificationHead(nn.Module):
    """hidden (B, S, D) -> logits (B, L): dense -> activation [-> norm] -> out, on token 0 (``[CLS]``/``<s>``) or the mean."""

    def __init__(
        self, d_model: int, num_labels: int, activation: str, *, pooling: str = "cls", norm: bool = False,
        dense_bias: bool = True, eps: float = 1e-5, norm_bias: bool = True,
    ) -> None:  # fmt: skip
        super().__init__()
        if activation not in ACTIVATION_MODULES:
            raise ConfigError(f"expected a sequence head activation in {', '.join(ACTIVATION_MODULES)}, got {activation!r}")
        self.pooling = pooling
        self.dense = nn.Linear(d_model, d_model, bias=dense_bias)
        self.act = ACTIVATION_MODULES[activation]()
        self.norm = Fp32LayerNorm(d_model, eps=eps, bias=norm_bias) if norm else None
        self.out = nn.Linear(d_model, num_labels)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.pooling == "mean":  # transformers' ModernBertForSequenceClassification, classifier_pooling "mean"
            if attention_mask is None:
                raise ConfigError("expected an attention_mask for a mean-pooling sequence head, got None; pass the model's attention_mask")
            m = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, S, 1)
            pooled = (hidden * m).sum(dim=1) / m.sum(dim=1)  # (B, D)
        else:
            pooled = hidden[:, 0]  # (B, D)
        h = self.act(self.dense(pooled))
        return self.out(h if self.norm is None else self.norm(h))  # (B, L)


class TokenClassificationHead(nn.Module):
    """hidden (B, S, D) -> logits (B, S, L): one Linear applied to every token (after dense -> activation -> norm when the head has them)."""

    def __init__(
        self, d_model: int, num_labels: int, activation: str | None = None, *, dense_bias: bool = True, eps: float = 1e-5,
        norm_bias: bool = True,
    ) -> None:  # fmt: skip
        super().__init__()
        self.dense = None if activation is None else nn.Linear(d_model, d_model, bias=dense_bias)
        self.act = None if activation is None else ACTIVATION_MODULES[activation]()
        self.norm = None if activation is None else Fp32LayerNorm(d_model, eps=eps, bias=norm_bias)
        self.out = nn.Linear(d_model, num_labels)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.dense is not None:  # ModernBertPredictionHead on every token
            hidden = self.norm(self.act(self.dense(hidden)))  # type: ignore[misc]
        return self.out(hidden)  # (B, S, L)


def build_head(config: HeadConfig | None, d_model: int, *, eps: float = 1e-5, norm_bias: bool = True) -> nn.Module | None:
    """The head a ``HeadConfig`` describes (None -> None); ``eps`` and ``norm_bias`` are the encoder's, for a head with a norm."""
    if config is None:
        return None
    if config.task == "token":
        return TokenClassificationHead(d_model, config.num_labels, config.activation if config.norm else None,
                                       dense_bias=config.dense_bias, eps=eps, norm_bias=norm_bias)  # fmt: skip
    return SequenceClassificationHead(d_model, config.num_labels, config.activation,  # type: ignore[arg-type]
                                      pooling=config.pooling, norm=config.norm, dense_bias=config.dense_bias, eps=eps, norm_bias=norm_bias)  # fmt: skip
