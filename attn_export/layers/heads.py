"""The task heads users deploy on an encoder: sequence and token classification.

A fine-tuned classifier is judged by its logits, not by a sentence embedding, so the head is
part of the exported model (an extra output ``logits``). Each library's head is reproduced
exactly (transformers 5.x, ``models/<family>/modeling_<family>.py``):

| style | logits from | layers |
|---|---|---|
| ``bert`` (``BertForSequenceClassification``) | token 0 | ``pooler.dense`` -> tanh -> ``classifier`` |
| ``roberta`` (RoBERTa, XLM-R, CamemBERT ``ClassificationHead``) | token 0 | ``classifier.dense`` -> tanh -> ``classifier.out_proj`` |
| ``electra`` (``ElectraClassificationHead``) | token 0 | ``classifier.dense`` -> GELU (erf) -> ``classifier.out_proj`` |
| ``distilbert`` (``DistilBertForSequenceClassification``) | token 0 | ``pre_classifier`` -> ReLU -> ``classifier`` |
| ``linear`` (every ``...ForTokenClassification``) | every token | ``classifier`` |

Dropout is left out: these modules are for inference, compression and distillation.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from attn_export.errors import ConfigError
from attn_export.layers.encoder_config import HEAD_STYLES, HeadConfig

__all__ = ["HEAD_STYLES", "HeadConfig", "SequenceClassificationHead", "TokenClassificationHead", "build_head"]

log = logging.getLogger(__name__)

# keys: encoder_config.SEQUENCE_HEAD_STYLES (tests/layers/test_encoder_config.py holds them equal)
_SEQUENCE_ACTIVATIONS = {"bert": nn.Tanh, "roberta": nn.Tanh, "electra": nn.GELU, "distilbert": nn.ReLU}


class SequenceClassificationHead(nn.Module):
    """hidden (B, S, D) -> logits (B, L): dense -> activation -> out, on token 0 (``[CLS]``/``<s>``)."""

    def __init__(self, d_model: int, num_labels: int, style: str) -> None:
        super().__init__()
        if style not in _SEQUENCE_ACTIVATIONS:
            raise ConfigError(f"expected a sequence head style in {', '.join(_SEQUENCE_ACTIVATIONS)}, got {style!r}")
        self.style = style
        self.dense = nn.Linear(d_model, d_model)
        self.act = _SEQUENCE_ACTIVATIONS[style]()
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
    return SequenceClassificationHead(d_model, config.num_labels, config.style)
