"""Run an encoder artifact the way it is judged: sentence embeddings of held-out text.

An artifact of the whole encoder is run on the texts directly (``embed``). An artifact of one
layer N is run in context: the eager encoder with layer N replaced by the artifact
(``SplicedEncoder`` around a ``RunnerLayer``), so a single-layer int8 or low-rank model is
still measured by what it does to the sentence embeddings (``subjects.encoder_layer``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from attn_export.compress.layer_forward import forward_layer
from attn_export.errors import ConfigError
from attn_export.layers.encoder import SentenceEncoder
from attn_export.runtime.base import Feed, Runner

__all__ = ["RunnerLayer", "SplicedEncoder", "embed"]

log = logging.getLogger(__name__)


class RunnerLayer(nn.Module):
    """A runner with the layer signature ``(x, key_padding_mask) -> y`` as an ``nn.Module``."""

    def __init__(self, runner: Runner) -> None:
        super().__init__()
        self.runner = runner

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor) -> torch.Tensor:
        feed = {"x": x.detach().float().numpy(), "key_padding_mask": key_padding_mask.numpy().astype(np.int32)}
        return torch.from_numpy(np.asarray(self.runner.infer(feed)["y"], dtype=np.float32))  # (B, S, D)


class SplicedEncoder(nn.Module):
    """``encoder`` with layer ``index`` replaced by ``layer``: the layer artifact in context."""

    def __init__(self, encoder: SentenceEncoder, index: int, layer: nn.Module) -> None:
        super().__init__()
        if not 0 <= index < len(encoder.layers):
            raise ConfigError(f"expected a layer index 0..{len(encoder.layers) - 1}, got {index}")
        self.encoder = encoder
        self.index = index
        self.layer = layer

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.encoder.input_names  # with token_type_ids when the encoder takes them

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        h = self.encoder.embeddings(input_ids, token_type_ids)  # (B, S, D)
        for i, layer in enumerate(self.encoder.layers):
            h = forward_layer(self.layer if i == self.index else layer, h, attention_mask)
        return self.encoder.outputs(h, attention_mask)  # the encoder's own pooling (and head)


def embed(runner: Runner, feeds: Sequence[Feed]) -> np.ndarray:
    """``sentence_embedding`` (N, D) of the encoder ``runner`` over ``feeds``, concatenated."""
    return np.concatenate([np.asarray(runner.infer(f)["sentence_embedding"], dtype=np.float32) for f in feeds])
