"""Ctrl-C and SIGTERM as exceptions, so every ``finally`` and ``with`` on the way out runs.

SIGTERM's default action kills the process on the spot, leaving temporary files
(``.model.onnx.*.tmp``) and half a run behind; here it raises ``Terminated`` in the main thread,
like Ctrl-C raises ``KeyboardInterrupt``. Libraries sometimes wrap an interrupt into an
ordinary exception (``torch.onnx.export`` turns it into a ``TorchExportError``, typer into
``Exit(130)``), so the handlers also *record* the signal: ``main()`` reports "interrupted"
with 130 or 143 whenever a signal arrived, whatever exception came out.

Three races are closed here:

* **A signal inside a finalizer.** Python runs a signal handler at the next bytecode of the
  main thread, which may be a ``__del__`` or a weakref callback run by the garbage collector
  (matplotlib frees figures and their callback registries that way while a report renders).
  An exception raised there cannot propagate: Python prints it with a traceback ("Exception
  ignored in ...") and goes on, so the run used to complete and print a traceback beside
  "interrupted". While ``interrupt_signals()`` is active, ``sys.unraisablehook`` takes such an
  interrupt silently and delivers it again a moment later (``_thread.interrupt_main``), in the
  main flow, where it unwinds the run like any other interrupt.
* **A re-delivery racing the clean-up.** When the main flow takes a swallowed interrupt first
  (``raise_if_interrupted``, which ``runner.run`` calls before the commit), the pending
  re-delivery is cancelled; it used to land 5 ms later inside the removal of the half run and
  leave part of it behind (1 run in ~20 under load).
* **A second signal during the clean-up of the first.** Only the first signal raises (and a
  re-delivery); later ones are recorded, so the ``finally`` blocks that remove a half run are
  not themselves interrupted halfway.

``announce`` prints the one "interrupted" line, once per command however many times the
interrupt surfaces. Installed only for the duration of ``interrupt_signals()`` and only from the
main thread; an ignored SIGINT (a background job) stays ignored.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["Terminated", "announce", "exit_code_for", "interrupt_signals", "raise_if_interrupted", "received"]

_received: list[int] = []
_redeliver: list[int] = []  # an interrupt a finalizer swallowed, to raise again in the main flow
_announced: list[int] = []
_active: list[int] = []  # nesting depth of interrupt_signals()
_REDELIVER_S = 0.005  # long enough for the finalizer (and the collection it is part of) to finish


class Terminated(BaseException):
    """SIGTERM, raised in the main thread (a BaseException, like KeyboardInterrupt)."""


def _interrupt(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def _handler(signum: int, _frame: FrameType | None) -> None:
    first = not _received
    _received.append(signum)
    if first or _redeliver:
        _redeliver.clear()
        raise _interrupt(_received[0])


def _deliver() -> None:
    if _redeliver:
        _thread.interrupt_main(_redeliver[0])  # a no-op once the handlers are restored to SIG_DFL


def _unraisable_hook(previous: Any) -> Any:
    def hook(unraisable: Any) -> None:
        exc = unraisable.exc_type
        if exc is not None and issubclass(exc, (KeyboardInterrupt, Terminated)) and _received:
            timer = threading.Timer(_REDELIVER_S, _deliver)
            timer.daemon = True
            timer.start()
            _redeliver[:] = [_received[0]]  # after start(): a signal landing in start() itself is recorded, not raised here
            return
        previous(unraisable)

    return hook


def received() -> int | None:
    """The first interrupt signal received inside ``interrupt_signals()``, or None."""
    return _received[0] if _received else None


def raise_if_interrupted() -> None:
    """Raise the interrupt again if a library swallowed it (some ``import`` paths catch everything).

    A re-delivery still pending for an interrupt a finalizer swallowed is cancelled: the main flow
    has the interrupt now, and a second one landing a moment later would cut short the clean-up it
    unwinds into (a half-removed run left behind).
    """
    signum = received()
    if signum is not None:
        _redeliver.clear()
        raise _interrupt(signum)


def exit_code_for(signum: int) -> int:
    """130 for SIGINT, 143 for SIGTERM: 128 + the signal number, as a shell reports it."""
    return 128 + int(signum)


def announce(signum: int) -> int:
    """Print "attn-export: interrupted" (once per command) and return the exit code for ``signum``."""
    _redeliver.clear()
    if not _announced:
        _announced.append(int(signum))
        print("attn-export: interrupted" + (" (terminated)" if signum == signal.SIGTERM else ""), file=sys.stderr)
    return exit_code_for(_announced[0])


@contextmanager
def interrupt_signals() -> Iterator[None]:
    """Turn SIGINT/SIGTERM into exceptions for the block; restore the previous handlers after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, object] = {}
    depth = len(_received)
    if not _active:
        del _announced[:]  # a new command (tests call main() many times in one process)
    _active.append(depth)
    hook = sys.unraisablehook
    try:
        sys.unraisablehook = _unraisable_hook(hook)
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
        sys.unraisablehook = hook
        _redeliver.clear()
        del _received[depth:]
        _active.pop()
