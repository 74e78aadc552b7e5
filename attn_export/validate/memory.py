"""Peak memory of one inference: the process's peak RSS delta, read from ``/proc/self/status``.

Method ("vmhwm-reset"): release free heap pages (``gc.collect`` + glibc ``malloc_trim``),
reset the kernel's peak-RSS counter (write ``5`` to ``/proc/self/clear_refs``), note VmRSS,
run, then read VmHWM. The difference is the resident memory the inference added at its peak
(activations, workspaces, allocator arenas), whatever allocator made it: torch, ONNX
Runtime and numpy alike, which tracemalloc (Python allocations only) could not see.
Weights already loaded are not counted. Where the counter cannot be reset (not Linux, or a
locked-down /proc) the figure is None and the method says so; no psutil needed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["MEMORY_METHOD", "memory_method", "peak_memory_delta", "read_status_kib"]

log = logging.getLogger(__name__)

MEMORY_METHOD = "vmhwm-reset"
_libc: Any = None


def read_status_kib() -> dict[str, int]:
    """VmRSS and VmHWM of this process in KiB ({} when /proc is unavailable)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0])
    except OSError:
        return {}
    return out


def _trim() -> None:
    global _libc
    gc.collect()
    if _libc is None:
        name = ctypes.util.find_library("c")
        _libc = ctypes.CDLL(name) if name else False
    if _libc and hasattr(_libc, "malloc_trim"):
        _libc.malloc_trim(0)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_method() -> str:
    """The method this process can use: ``vmhwm-reset``, or ``unavailable (...)``."""
    if not read_status_kib():
        return "unavailable (no /proc/self/status)"
    return MEMORY_METHOD if _reset_peak() else "unavailable (cannot reset /proc/self/clear_refs)"


def peak_memory_delta(fn: Callable[[], object]) -> int | None:
    """Bytes of peak RSS that ``fn()`` added over the RSS before it (None if not measurable)."""
    _trim()
    if not _reset_peak():
        fn()
        return None
    before = read_status_kib().get("VmRSS")
    fn()
    peak = read_status_kib().get("VmHWM")
    if before is None or peak is None:
        return None
    return max(0, peak - before) * 1024
