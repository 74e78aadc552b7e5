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

Dropout is left out: these modules are for inference, compression and distillation.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from attn_export.errors import ConfigError
from attn_export.layers.encoder_config import HEAD_ACTIVATIONS, HeadConfig

__all__ = ["ACTIVATION_MODULES", "HEAD_ACTIVATIONS", "HeadConfig", "SequenceClassificationHead", "TokenClassificationHead", "build_head"]

log = logging.getLogger(__name__)

# keys: encoder_config.HEAD_ACTIVATIONS (tests/layers/test_encoder_config.py holds them equal)
ACTIVATION_MODULES: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "gelu": nn.GELU, "relu": nn.ReLU}


class SequenceClassificationHead(nn.Module):
    """hidden (B, S, D) -> logits (B, L): dense -> activation -> out, on token 0 (``[CLS]``/``<s>``)."""

    def __init__(self, d_model: int, num_labels: int, activation: str) -> None:
        super().__init__()
        if activation not in ACTIVATION_MODULES:
            raise ConfigError(f"expected a sequence head activation in {', '.join(ACTIVATION_MODULES)}, got {activation!r}")
        self.dense = nn.Linear(d_model, d_model)
        self.act = ACTIVATION_MODULES[activation]()
        self.out = nn.Linear(d_model, num_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.dense(hidden[:, 0])))  # (B, D) -> (B, L)


class TokenClassificationHead(nn.Module):
    """hidden (B, S, D) -> logits (B, S, L): one Linear applied to every token."""

    def __init__(self, d_model: int, num_labels: int) -> None:
        super().__init__()
        self.out = nn.Linear(d_model, num_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(hidden)  # (B, S, L)


def build_head(config: HeadConfig | None, d_model: int) -> nn.Module | None:
    """The head a ``HeadConfig`` describes (None -> None)."""
    if config is None:
        return None
    if config.task == "token":
        return TokenClassificationHead(d_model, config.num_labels)
    return SequenceClassificationHead(d_model, config.num_labels, config.activation)  # type: ignore[arg-type]
