"""Third-party loggers quieted for one block and restored after it: never a permanent change to another library.

torch's exporter and onnxscript log at DEBUG and INFO while a model is exported (onnxscript's
converter, constant folding, onnx_ir's pass manager, torch's ``torch.__trace`` structured
trace, a warning per missing torchvision op), so a user test that runs with
``log_level = DEBUG`` got pages of their internals on one failure (issue 23). The export and
the pytest plugin wrap their work in ``quieted(...)``; levels are put back on the way out,
including after an exception.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["EXPORT_NOISE", "quieted"]

# logger -> the least severe level let through while exporting
EXPORT_NOISE: dict[str, int] = {
    "torch.onnx": logging.WARNING,
    "torch.onnx._internal.exporter._registration": logging.ERROR,  # one warning per missing torchvision op, every export
    "torch.__trace": logging.WARNING,  # torch's structured trace: always DEBUG unless told otherwise
    "torch.export": logging.WARNING,
    "torch._dynamo": logging.WARNING,
    "torch.fx": logging.WARNING,
    "onnxscript": logging.WARNING,
    "onnx_ir": logging.WARNING,
}


@contextmanager
def quieted(levels: Mapping[str, int]) -> Iterator[None]:
    """Raise each named logger to at least its level for the block, then restore the level it had."""
    saved: dict[str, int] = {}
    for name, level in levels.items():
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < level:
            saved[name] = logger.level
            logger.setLevel(level)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
