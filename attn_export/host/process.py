"""The one context that sets process-wide state for a run, and puts it back afterwards.

Three process settings change measured numbers, so eager PyTorch and ONNX Runtime must run
under the same ones, and a library must not leave them changed:

* **threads**: ``torch.set_num_threads`` (ONNX Runtime sessions get the same count through
  their own options);
* **denormal flushing**: the masked softmax drives ``exp`` into denormals, which run ~8x
  slower; ONNX Runtime flushes them on its pool threads (``session.set_denormal_as_zero``)
  but the calling thread computes too, so the run flushes them on this thread for eager and
  ONNX Runtime alike (``torch.set_flush_denormal``);
* **OpenMP wait policy**: torch's OpenMP threads spin after each op by default, stealing the
  cores from ONNX Runtime when the two are timed side by side (eager was 4-8x slower on a
  shared 2-core box). libgomp reads ``OMP_WAIT_POLICY`` once, when torch is imported, so it
  can only be set before the first ``import torch``: the CLI's ``main()`` enters this context
  before importing anything heavy. Inside an already-running program it is recorded as it is.

Nothing here runs at import. ``process_settings(...)`` is re-entrant: an inner context (the
runner's) restores what the outer one (``main()``'s) set.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["ProcessSettings", "current_settings", "process_settings", "reapply_denormal_flush"]

log = logging.getLogger(__name__)

_ACTIVE: list[dict[str, Any]] = []


@dataclass(frozen=True)
class ProcessSettings:
    """What to set for the duration of a run; ``threads=None`` keeps the current thread count."""

    threads: int | None = None
    flush_denormals: bool = True
    omp_wait_policy: str | None = "PASSIVE"


def current_settings() -> dict[str, Any] | None:
    """The record of the innermost active context (what a report stores), or None outside one."""
    return dict(_ACTIVE[-1]) if _ACTIVE else None


def reapply_denormal_flush() -> None:
    """Re-assert the active context's denormal flushing on this thread.

    Creating an ONNX Runtime session resets the calling thread's FTZ/DAZ flags, so runners
    call this after building a session; outside a context (or with flushing off) it does nothing.
    """
    if _ACTIVE and _ACTIVE[-1].get("flush_denormals"):
        import torch  # noqa: PLC0415 - the context already imported it

        torch.set_flush_denormal(True)


@contextmanager
def process_settings(settings: ProcessSettings | None = None) -> Iterator[dict[str, Any]]:
    """Apply ``settings``; yield the record of what is in force; restore everything on exit."""
    settings = settings or ProcessSettings()
    record: dict[str, Any] = {}
    env_before = os.environ.get("OMP_WAIT_POLICY")
    torch_loaded = "torch" in sys.modules
    if settings.omp_wait_policy is not None and not torch_loaded:
        os.environ["OMP_WAIT_POLICY"] = settings.omp_wait_policy
    record["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY", "default (spinning)")
    record["omp_wait_policy_applied"] = not torch_loaded or env_before == settings.omp_wait_policy
    threads_before: int | None = None
    flush_changed = False
    try:
        if settings.threads is not None or settings.flush_denormals:
            import torch  # noqa: PLC0415 - only once a run needs it

            threads_before = torch.get_num_threads()
            if settings.threads is not None:
                torch.set_num_threads(max(1, int(settings.threads)))
            if settings.flush_denormals:
                flush_changed = bool(torch.set_flush_denormal(True))
            record["threads"] = torch.get_num_threads()
            record["flush_denormals"] = flush_changed
        _ACTIVE.append(record)
        yield dict(record)
    finally:
        if _ACTIVE and _ACTIVE[-1] is record:
            _ACTIVE.pop()
        if threads_before is not None:
            import torch  # noqa: PLC0415

            torch.set_num_threads(threads_before)
            outer_flush = bool(_ACTIVE and _ACTIVE[-1].get("flush_denormals"))
            if flush_changed and not outer_flush:
                torch.set_flush_denormal(False)  # the process default
        if not torch_loaded:
            if env_before is None:
                os.environ.pop("OMP_WAIT_POLICY", None)
            else:
                os.environ["OMP_WAIT_POLICY"] = env_before
