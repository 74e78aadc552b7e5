"""Ctrl-C and SIGTERM as exceptions, so every ``finally`` and ``with`` on the way out runs.

SIGTERM's default action kills the process on the spot, leaving temporary files
(``.model.onnx.*.tmp``) and half a run behind; here it raises ``Terminated`` in the main thread,
like Ctrl-C raises ``KeyboardInterrupt``. Libraries sometimes wrap an interrupt into an
ordinary exception (``torch.onnx.export`` turns it into a ``TorchExportError``, typer into
``Exit(130)``), so the handlers also *record* the signal: ``main()`` reports "interrupted"
with 130 or 143 whenever a signal arrived, whatever exception came out.

Installed only for the duration of ``interrupt_signals()`` and only from the main thread; an
ignored SIGINT (a background job) stays ignored.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["Terminated", "exit_code_for", "interrupt_signals", "raise_if_interrupted", "received"]

_received: list[int] = []


class Terminated(BaseException):
    """SIGTERM, raised in the main thread (a BaseException, like KeyboardInterrupt)."""


def _handler(signum: int, _frame: FrameType | None) -> None:
    _received.append(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated


def received() -> int | None:
    """The first interrupt signal received inside ``interrupt_signals()``, or None."""
    return _received[0] if _received else None


def raise_if_interrupted() -> None:
    """Raise the interrupt again if a library swallowed it (some ``import`` paths catch everything)."""
    signum = received()
    if signum is not None:
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated


def exit_code_for(signum: int) -> int:
    """130 for SIGINT, 143 for SIGTERM: 128 + the signal number, as a shell reports it."""
    return 128 + int(signum)


@contextmanager
def interrupt_signals() -> Iterator[None]:
    """Turn SIGINT/SIGTERM into exceptions for the block; restore the previous handlers after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, object] = {}
    depth = len(_received)
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN:
                continue
            previous[sig] = current
            signal.signal(sig, _handler)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        del _received[depth:]
