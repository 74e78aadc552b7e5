"""Eager int8 with torchao: the PyTorch reference for what int8 costs in accuracy.

``quantize_eager_(model, "int8-dynamic")`` applies ``torchao.quantization.quantize_`` with
``Int8DynamicActivationInt8WeightConfig`` (int8 weights per output channel, activations
quantized per token at run time); ``"int8-weight-only"`` uses ``Int8WeightOnlyConfig``
(int8 weights, float activations). Every ``nn.Linear`` is quantized: the projections, the
FFN, and both factors of a low-rank Linear. Attention BMMs, softmax and LayerNorm stay float.

This route is a reference, not a deployment: the quantized module does not export to ONNX,
and on CPU without ``torch.compile`` it is slower than fp32. The ONNX routes are compared
against its error (SQNR in dB, as torchao's own tests do).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

from torch import nn

from attn_export.host.lazy import require
from attn_export.host.quiet import quiet_loggers
from attn_export.errors import ConfigError

__all__ = ["EAGER_INT8_MODES", "quantize_eager_"]

log = logging.getLogger(__name__)

EAGER_INT8_MODES: tuple[str, ...] = ("int8-dynamic", "int8-weight-only")


def _torchao_quantization() -> Any:
    """Import torchao.quantization lazily; its import warns about CUDA-only kernels on CPU hosts."""
    # torchao's import logs CUDA-only kernels it cannot load, and torch warns (W1201 ... KernelPreference)
    # about its enum registration: noise for a CPU user, kept out of the terminal and CI logs.
    with quiet_loggers(("torchao", "torch.utils._pytree")):
        return require("torchao.quantization", "torchao", what="torchao (eager int8)")


def _config_for(mode: str) -> Any:
    q = _torchao_quantization()
    configs: dict[str, Callable[[], Any]] = {
        # set_inductor_config=False: we run eagerly, so leave torch._inductor's global config alone.
        "int8-dynamic": lambda: q.Int8DynamicActivationInt8WeightConfig(set_inductor_config=False),
        "int8-weight-only": lambda: q.Int8WeightOnlyConfig(set_inductor_config=False),
    }
    return configs[mode]()


def quantize_eager_(model: nn.Module, mode: str = "int8-dynamic", inplace: bool = False) -> nn.Module:
    """Return ``model`` with every ``nn.Linear`` quantized by torchao.

    Works on a deep copy unless ``inplace=True`` (the trailing underscore follows torchao's
    ``quantize_``, but the original fp32 layer is usually still needed as the reference).
    The result is in eval mode.
    """
    if mode not in EAGER_INT8_MODES:
        raise ConfigError(f"expected an eager int8 mode in {', '.join(EAGER_INT8_MODES)}, got {mode!r}; use int8-dynamic")
    n_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    if n_linear == 0:
        raise ConfigError(f"expected a model with nn.Linear layers to quantize, got {type(model).__name__} with none")
    config = _config_for(mode)
    target = model if inplace else copy.deepcopy(model)
    q = _torchao_quantization()
    q.quantize_(target, config)
    log.info("torchao %s: quantized %d Linear layers", mode, n_linear)
    return target.eval()
