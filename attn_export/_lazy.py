"""Lazy import of optional heavy backends, with an install hint instead of an ImportError."""

from __future__ import annotations

import importlib
from types import ModuleType

from attn_export.errors import MissingDependencyError

__all__ = ["require"]


def require(module: str, pip_name: str, what: str | None = None, extra: str | None = None) -> ModuleType:
    """Import ``module`` or raise MissingDependencyError naming ``pip_name``."""
    try:
        return importlib.import_module(module)
    except ImportError as err:  # the backend or one of its shared libraries is missing
        raise MissingDependencyError(what or module, pip_name, extra) from err
