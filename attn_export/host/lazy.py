"""Lazy imports: optional heavy backends with an install hint, and light package faces."""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

from attn_export.errors import MissingDependencyError

__all__ = ["lazy_exports", "quiet_loggers", "require"]


def require(module: str, pip_name: str, what: str | None = None, extra: str | None = None) -> ModuleType:
    """Import ``module`` or raise MissingDependencyError naming ``pip_name``."""
    try:
        return importlib.import_module(module)
    except ImportError as err:  # the backend or one of its shared libraries is missing
        raise MissingDependencyError(what or module, pip_name, extra) from err


def lazy_exports(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """PEP 562 ``__getattr__``/``__dir__`` for a package face: ``name -> submodule`` imported on first use.

    Why: a package face that imports its submodules eagerly makes ``import attn_export.x.light``
    load torch and onnx, and flag validation must stay light (errors in under a second).
    """

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(where)

    return __getattr__, __dir__


def quiet_loggers(names: Iterable[str], level: int = logging.ERROR) -> contextlib.AbstractContextManager[None]:
    """What the given loggers say below ``level`` stays off the terminal for the block (into the run's
    log, ``_quiet.run_log``, when a run holds one); their handlers are put back as they were after it.

    Why: importing or loading third-party libraries logs what a CPU user cannot act on (torchao's
    CUDA-only kernels, torch's pytree registration notices, transformers' loading report), and
    the toolkit must not change other libraries' loggers for good. A library that sets up its
    logger when imported (transformers) must be imported before the block.
    """
    from attn_export.host.quiet import diverted

    return diverted(names, level)
