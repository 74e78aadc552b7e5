"""The error hierarchy users see.

Every failure a user can cause or fix is an ``AttnExportError`` subclass whose message
says what was expected, what was found and what to do. The CLI prints the message on one
line and exits non-zero; library callers can catch the family they care about.
"""

from __future__ import annotations

__all__ = [
    "AttnExportError",
    "ConfigError",
    "DataError",
    "CheckpointError",
    "ExportError",
    "CompatibilityError",
    "EngineError",
    "MissingDependencyError",
    "ToleranceError",
]


class AttnExportError(Exception):
    """Base class: an error the user can act on. ``str(err)`` is one line."""


class ConfigError(AttnExportError, ValueError):
    """A configuration value is out of range or inconsistent (e.g. heads not dividing d_model)."""


class DataError(AttnExportError, ValueError):
    """Calibration / validation data is missing, malformed or does not fit the layer."""


class CheckpointError(AttnExportError, ValueError):
    """A pretrained checkpoint is missing keys, has wrong shapes or an unsafe format."""


class ExportError(AttnExportError, RuntimeError):
    """ONNX export or graph rewriting failed."""


class CompatibilityError(AttnExportError, RuntimeError):
    """A graph uses something the chosen runtime/target cannot run."""


class EngineError(AttnExportError, RuntimeError):
    """A TensorRT engine cannot be built, loaded or run (wrong GPU, version, shapes...)."""


class MissingDependencyError(AttnExportError, ImportError):
    """An optional backend is not installed; the message names the pip package."""

    def __init__(self, what: str, pip_name: str, extra: str | None = None) -> None:
        hint = f"pip install {pip_name}"
        if extra:
            hint += f" (or pip install 'attn-export[{extra}]')"
        super().__init__(f"{what} is not installed; {hint}")
        self.pip_name = pip_name


class ToleranceError(AttnExportError, AssertionError):
    """Outputs differ from the reference by more than the tolerance."""
