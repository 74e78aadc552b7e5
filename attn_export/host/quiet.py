"""Third-party loggers quieted for one block and restored after it, and the run's log that keeps what they said.

torch's exporter and onnxscript log at DEBUG and INFO while a model is exported (onnxscript's
converter, constant folding, onnx_ir's pass manager, torch's ``torch.__trace`` structured
trace, a warning per missing torchvision op), so a user test that runs with
``log_level = DEBUG`` got pages of their internals on one failure (issue 23). The export and
the pytest plugin wrap their work in ``quieted(...)``; levels are put back on the way out,
including after an exception.

Loading reports are kept, not lost: while a run holds ``run_log(OUT/run.log)``, what a
quieted library logger says (transformers' LOAD REPORT with its MISSING table for a
checkpoint saved without a pooler) goes into that file instead of the terminal
(``quiet_loggers``), and with ``terminal=False`` (``--quiet``, ``--json``) every other library's
records and Python warnings go there too: the terminal gets the verdict only. The file is
created on the first record, so a run with nothing to say writes none. Every handler, filter
and the warnings capture is removed on the way out: no library's logging stays changed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

__all__ = ["EXPORT_NOISE", "RUN_LOG_NAME", "quieted", "quiet_loggers", "run_log"]

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
RUN_LOG_NAME = "run.log"
_OURS = "attn_export"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # transformers colours its reports
_LOGS: list[logging.Handler] = []  # the active runs' log files, innermost last


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


class _PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return _ANSI.sub("", super().format(record))


class _Divert(logging.Handler):
    """Stands in for a logger's handlers: every record into the run's log; at ``level`` or above also
    where it went before (the logger's own handlers, then its parents' if it propagated)."""

    def __init__(self, logger: logging.Logger, level: int, handlers: list[logging.Handler], propagate: bool) -> None:
        super().__init__(logging.NOTSET)
        self.logger, self.threshold, self.handlers, self.propagate = logger, level, handlers, propagate

    def emit(self, record: logging.LogRecord) -> None:
        passed_on = record.levelno >= self.threshold
        if _LOGS and not (passed_on and self.propagate):  # propagated, it reaches the log through the root logger
            _LOGS[-1].handle(record)
        if passed_on:
            for h in self.handlers:
                if record.levelno >= h.level:
                    h.handle(record)
            if self.propagate and self.logger.parent is not None:
                self.logger.parent.callHandlers(record)


@contextmanager
def quiet_loggers(names: Iterable[str], level: int = logging.ERROR) -> Iterator[None]:
    """What the named loggers say below ``level`` goes to the run's log (if a run holds one), not the terminal.

    Why: importing or loading third-party libraries logs what a CPU user cannot act on (torchao's
    CUDA-only kernels, torch's pytree registration notices, transformers' loading report), and
    the toolkit must not change other libraries' loggers for good. A logger below WARNING is
    raised to it for the block (INFO chatter is not kept). A library that configures its logger
    when imported (transformers) must be imported before the block, or it replaces what is set
    here. Handlers, ``propagate`` and levels are put back on the way out."""
    saved: list[tuple[logging.Logger, list[logging.Handler], bool, int]] = []
    floor = min(level, logging.WARNING)  # INFO and DEBUG chatter (one line per node) is not even kept
    for name in names:
        logger = logging.getLogger(name)
        saved.append((logger, list(logger.handlers), logger.propagate, logger.level))
        logger.handlers = [_Divert(logger, level, list(logger.handlers), logger.propagate)]
        logger.propagate = False
        if logger.getEffectiveLevel() < floor:
            logger.setLevel(floor)
    try:
        yield
    finally:
        for logger, handlers, propagate, old_level in reversed(saved):
            added = [h for h in logger.handlers if not isinstance(h, _Divert) and h not in handlers]  # a handler added meanwhile stays
            logger.handlers = handlers + added
            logger.propagate = propagate
            logger.setLevel(old_level)


def _not_a_library(record: logging.LogRecord) -> bool:
    return record.name == _OURS or record.name.startswith(_OURS + ".")


@contextmanager
def run_log(path: Path, terminal: bool = True) -> Iterator[None]:
    """Hold ``path`` as the run's log for the block (created on the first record).

    ``terminal=False``: the terminal's handlers (the root logger's) let through only attn-export's
    own records, and Python warnings are captured into the log (``logging.captureWarnings``)."""
    handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    handler.setFormatter(_PlainFormatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    _LOGS.append(handler)
    root.addHandler(handler)
    filtered = [h for h in root.handlers if h is not handler] if not terminal else []
    for h in filtered:
        h.addFilter(_not_a_library)
    warnings_were_captured = getattr(logging, "_warnings_showwarning", None) is not None
    if not terminal and not warnings_were_captured:
        logging.captureWarnings(True)
    try:
        yield
    finally:
        if not terminal and not warnings_were_captured:
            logging.captureWarnings(False)
        for h in filtered:
            h.removeFilter(_not_a_library)
        root.removeHandler(handler)
        _LOGS.remove(handler)
        handler.close()
