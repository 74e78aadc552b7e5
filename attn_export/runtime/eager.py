"""Eager PyTorch as a runner, so it is validated and timed exactly like ONNX Runtime."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from attn_export.runtime.base import Feed, Runner

__all__ = ["EagerRunner"]


class EagerRunner(Runner):
    """Calls ``module(*inputs)`` under ``torch.inference_mode``; inputs in ``input_names`` order."""

    name = "eager"

    def __init__(
        self,
        module: nn.Module,
        input_names: list[str],
        output_names: list[str] | None = None,
        dtype: torch.dtype | None = None,
        device: str = "cpu",
        name: str | None = None,
    ) -> None:
        super().__init__()
        self.module = module
        self._input_names = list(input_names)
        self._output_names = list(output_names or ["y"])
        self.dtype = dtype
        self.device = device
        if name:
            self.name = name

    @property
    def input_names(self) -> list[str]:
        return self._input_names

    @property
    def output_names(self) -> list[str]:
        return self._output_names

    def _activate(self) -> None:
        self.module.eval()

    def _to_tensor(self, arr: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(arr)).to(self.device)
        if self.dtype is not None and t.is_floating_point():
            t = t.to(self.dtype)
        return t

    def _infer(self, feed: Feed) -> dict[str, np.ndarray]:
        args = [self._to_tensor(feed[n]) for n in self._input_names]
        with torch.inference_mode():
            out = self.module(*args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if self.device != "cpu":
            torch.cuda.synchronize()
        return {n: o.detach().float().cpu().numpy() for n, o in zip(self._output_names, outs)}
