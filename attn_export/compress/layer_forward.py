"""Running a layer the way calibration and compression do: on its own device, in eval mode, with its mask semantics.

Low-rank whitening, distillation and the reference checks call a layer many times on
calibration activations; these helpers keep that call the same everywhere (a
``MaskedLayer`` gets the mask only when it takes one) and restore each module's train flag.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from attn_export.layers.registry import LAYERS, MaskedLayer

__all__ = ["device_of", "eval_mode", "forward_layer"]


def device_of(model: nn.Module) -> torch.device:
    """Where the model's parameters live (CPU for a parameter-free module)."""
    return next(model.parameters(), torch.empty(0)).device


@contextmanager
def eval_mode(*models: nn.Module) -> Iterator[None]:
    """Put every module in eval mode and restore each one's own flag afterwards.

    ``model.train(flag)`` would instead force one flag on all children (a MaskedLayer is
    built in train mode around an eval-mode layer).
    """
    modes = [(m, m.training) for model in models for m in model.modules()]
    try:
        for model in models:
            model.eval()
        yield
    finally:
        for m, training in modes:
            m.training = training


def forward_layer(model: nn.Module, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Run a layer with ``MaskedLayer`` semantics and return y (B, L, D).

    A ``MaskedLayer`` gets the mask only when it takes one (mask="padding"); a bare reference
    layer is wrapped; any other module is called as ``model(x[, key_padding_mask])``.
    """
    if isinstance(model, MaskedLayer):
        out = model(x, key_padding_mask) if model.mask == "padding" else model(x)
    elif isinstance(model, tuple(info.cls for info in LAYERS.values())):
        out = MaskedLayer(model, "padding")(x, key_padding_mask)
    else:
        out = model(x) if key_padding_mask is None else model(x, key_padding_mask)
    return out[0] if isinstance(out, (tuple, list)) else out
