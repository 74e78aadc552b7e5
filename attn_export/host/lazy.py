"""Lazy imports: optional heavy backends with an install hint, and light package faces."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from attn_export.errors import MissingDependencyError

__all__ = ["lazy_exports", "require"]


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
