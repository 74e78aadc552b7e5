"""Data shipped inside the package: calibration sets (``calibration/``) and the text corpus (``text/``).

Everything is found through ``importlib.resources``, so a wheel installed anywhere reads the
same files as a source checkout; nothing is looked up relative to the repository.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["shipped_path"]


def shipped_path(*parts: str) -> Path:
    """Path of a shipped data file or folder, e.g. ``shipped_path("calibration", "synthetic_d512.npz")``.

    The package is installed unzipped (wheels always are), so the resource is a real file and
    ``numpy``/``tokenizers`` can open it by path.
    """
    return Path(str(files(__name__).joinpath(*parts)))
