"""The one runner contract every backend follows (Polygraphy-style).

A runner is a context manager with ``infer(feed) -> dict[str, np.ndarray]`` and
``last_inference_time`` (seconds). Validation and benchmarking only ever talk to this
interface, so eager PyTorch, ONNX Runtime and TensorRT are compared the same way.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["Runner", "Feed", "check_feed"]

Feed = Mapping[str, np.ndarray]


def check_feed(feed: Feed, input_names: list[str], runner: str = "runner") -> None:
    """Raise a one-line ConfigError when ``feed`` lacks an input or carries one the model does not take."""
    from attn_export.errors import ConfigError

    missing = [n for n in input_names if n not in feed]
    extra = [n for n in feed if n not in input_names]
    if missing or extra:
        what = "; ".join(part for part in (f"missing inputs {missing}" if missing else "", f"unexpected inputs {extra}" if extra else "") if part)
        raise ConfigError(f"{runner}: {what}; the model takes {list(input_names)}")


class Runner(ABC):
    """Base class: subclasses implement ``_activate``, ``_infer`` and optionally ``_deactivate``."""

    name: str = "runner"

    def __init__(self) -> None:
        self.is_active = False
        self.last_inference_time: float | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> "Runner":
        self.activate()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.deactivate()

    def activate(self) -> None:
        if not self.is_active:
            self._activate()
            self.is_active = True

    def deactivate(self) -> None:
        if self.is_active:
            self._deactivate()
            self.is_active = False

    # -- inference ---------------------------------------------------------------------
    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        """Run once on ``feed`` (input name -> array); returns output name -> array.

        Every backend checks the feed the same way: a missing or an unexpected input is a
        one-line ``ConfigError``, never a silently dropped mask.
        """
        if not self.is_active:
            self.activate()
        check_feed(feed, self.input_names, self.name)
        start = time.perf_counter()
        out = self._infer(feed)
        self.last_inference_time = time.perf_counter() - start
        return out

    @property
    @abstractmethod
    def input_names(self) -> list[str]: ...

    @property
    @abstractmethod
    def output_names(self) -> list[str]: ...

    @abstractmethod
    def _activate(self) -> None: ...

    @abstractmethod
    def _infer(self, feed: Feed) -> dict[str, np.ndarray]: ...

    def _deactivate(self) -> None:
        return None
