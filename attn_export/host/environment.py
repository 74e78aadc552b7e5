"""What machine a run measured on: the one place that captures the environment for reports.

int8 accuracy and speed depend on the CPU's instruction set, not only on the model: ONNX
Runtime's x86 int8 GEMM for uint8 x int8 (U8S8) multiplies byte pairs with VPMADDUBSW,
whose 16-bit intermediate *saturates* on CPUs without VNNI (AVX2, AVX-512 without VNNI,
SSE4.1). With VNNI (VPDPBUSD), AMX or Arm's dot-product instructions the products are
accumulated in 32 bits and nothing saturates. ONNX Runtime documents this in its
quantization guide ("When to use reduce-range") and in
``onnxruntime_session_options_config_keys.h`` (``session.x64quantprecision``: "x64
SSE4.1/AVX2/AVX512(with no VNNI) has overflow problem with quantized matrix
multiplication with U8S8").

``detect_cpu()`` reads the CPU's feature flags and sorts the machine into an
*instruction-set class*; reports, baselines and the int8 encoding choice are keyed by it.
``capture_environment()`` is what every report and bench records.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ISA_CLASSES", "CpuInfo", "capture_environment", "classify", "cpu_summary_line", "detect_cpu", "package_versions", "parse_cpu_flags"]

log = logging.getLogger(__name__)

ISA_CLASSES: tuple[str, ...] = (
    "x86-amx", "x86-avx512-vnni", "x86-avx-vnni", "x86-avx512", "x86-avx2", "x86-sse", "arm-dotprod", "arm", "other",
)  # fmt: skip
# Classes whose ONNX Runtime U8S8 kernels use VPMADDUBSW (16-bit saturating pair sums).
_SATURATING = frozenset({"x86-avx512", "x86-avx2", "x86-sse"})
# The flags that decide the class, recorded in reports (the whole flag list is long and noisy).
_INT8_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "amx_tile", "asimddp", "i8mm", "sve")


@dataclass(frozen=True)
class CpuInfo:
    """The CPU's int8-relevant capabilities and its instruction-set class."""

    isa_class: str
    machine: str
    model: str
    flags: tuple[str, ...] = field(default_factory=tuple)  # only the int8-relevant ones

    @property
    def u8s8_saturates(self) -> bool:
        """True where ONNX Runtime's U8S8 GEMM can saturate (x86 without VNNI/AMX)."""
        return self.isa_class in _SATURATING

    @property
    def has_int8_dot(self) -> bool:
        """A 32-bit-accumulating int8 dot product instruction (VNNI, AMX, Arm SDOT)."""
        return self.isa_class in ("x86-amx", "x86-avx512-vnni", "x86-avx-vnni", "arm-dotprod")

    def describe(self) -> str:
        sat = "U8S8 can saturate (no VNNI)" if self.u8s8_saturates else "no U8S8 saturation"
        return f"{self.isa_class} ({self.model or self.machine}; {sat})"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["flags"] = list(self.flags)
        d["u8s8_saturates"] = self.u8s8_saturates
        return d


def parse_cpu_flags(cpuinfo_text: str) -> tuple[set[str], str]:
    """Feature flags and model name from ``/proc/cpuinfo`` text (x86 ``flags``, Arm ``Features``)."""
    flags: set[str] = set()
    model = ""
    for line in cpuinfo_text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features") and not flags:
            flags = set(value.split())
        elif key in ("model name", "cpu model", "hardware") and not model:
            model = " ".join(value.split())
    return flags, model


def classify(machine: str, flags: set[str]) -> str:
    """The instruction-set class of a CPU from its architecture and feature flags."""
    arch = machine.lower()
    if arch in ("x86_64", "amd64", "i686", "i386"):
        if "amx_int8" in flags:
            return "x86-amx"
        if "avx512_vnni" in flags:
            return "x86-avx512-vnni"
        if "avx_vnni" in flags:
            return "x86-avx-vnni"
        if "avx512f" in flags and "avx512bw" in flags:
            return "x86-avx512"
        if "avx2" in flags:
            return "x86-avx2"
        return "x86-sse"
    if arch in ("aarch64", "arm64") or arch.startswith("arm"):
        return "arm-dotprod" if "asimddp" in flags else "arm"
    return "other"


ISA_OVERRIDE_ENV = "ATTN_EXPORT_ISA_CLASS"


def detect_cpu(cpuinfo_path: str | os.PathLike[str] = "/proc/cpuinfo") -> CpuInfo:
    """Classify this machine's CPU; a machine without ``/proc/cpuinfo`` (macOS, Windows) uses its architecture.

    Reading the kernel's flag list (rather than CPUID through a compiled helper) keeps this
    dependency-free; the kernel hides features the OS does not enable (e.g. AMX state), which
    is what ONNX Runtime's own dispatch sees too. Under an emulated CPU (``qemu-x86_64 -cpu
    Haswell``, whose user mode passes the host's ``/proc/cpuinfo`` through) set
    ``ATTN_EXPORT_ISA_CLASS`` to the emulated class; the report records that it was set.
    """
    override = os.environ.get(ISA_OVERRIDE_ENV)
    if override:
        if override not in ISA_CLASSES:
            from attn_export.errors import ConfigError

            raise ConfigError(f"expected {ISA_OVERRIDE_ENV} in {', '.join(ISA_CLASSES)}, got {override!r}; unset it to detect the CPU")
        return CpuInfo(isa_class=override, machine=platform.machine(), model=f"{ISA_OVERRIDE_ENV}={override}", flags=())
    machine = platform.machine()
    flags: set[str] = set()
    model = platform.processor() or ""
    try:
        text = Path(cpuinfo_path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    if text:
        flags, model = parse_cpu_flags(text)
    if not flags and machine.lower() in ("arm64",) and platform.system() == "Darwin":
        flags = {"asimddp"}  # every Apple silicon core has the Armv8.4 dot product
    isa = classify(machine, flags)
    return CpuInfo(isa_class=isa, machine=machine, model=model, flags=tuple(f for f in _INT8_FLAGS if f in flags))


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _onnxruntime_distribution() -> str | None:
    """The installed distribution that provides the ``onnxruntime`` module (``onnxruntime``,
    ``onnxruntime-gpu``, ``onnxruntime-openvino``, ...), None when none does.

    Why not the name ``onnxruntime``: the GPU wheel is another distribution that installs the same
    module, and a machine with it would record no ONNX Runtime at all (or the CPU wheel's version
    left behind beside it). Several at once (a broken install) are named together, sorted."""
    from importlib import metadata

    names = sorted(set(metadata.packages_distributions().get("onnxruntime", [])))
    return ", ".join(names) or None


def package_versions() -> dict[str, str | None]:
    """The versions every run records (``run.json``'s ``versions``, a report's ``environment``):
    attn-export, Python, and the libraries its numbers depend on; ONNX Runtime under the
    distribution that provides its module (``onnxruntime_distribution``)."""
    from attn_export import __version__

    ort = _onnxruntime_distribution()
    return {
        "attn_export": __version__,
        "python": platform.python_version(),
        "torch": _version("torch"),
        "onnx": _version("onnx"),
        "onnxruntime": _version(ort.split(", ")[0]) if ort else None,
        "onnxruntime_distribution": ort,
        "numpy": _version("numpy"),
    }


def capture_environment(threads: int, process: dict[str, Any] | None = None, cpu: CpuInfo | None = None) -> dict[str, Any]:
    """What a report records about where it ran: versions, CPU class, threads and process settings.

    ``process`` is the process context's own record (``attn_export.host.process``): thread count,
    denormal flushing, OpenMP wait policy, so a reader knows eager and ONNX Runtime ran alike.
    """
    cpu = cpu or detect_cpu()
    env: dict[str, Any] = {
        **package_versions(),
        "machine": platform.machine(),
        "processor": cpu.model or platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "cpu": cpu.to_dict(),
    }
    if process:
        env["process"] = dict(process)
    return env


def cpu_summary_line(cpu: CpuInfo | None = None) -> str:
    """One line for bench output and logs, e.g. ``cpu: x86-avx2 (AMD EPYC ...; U8S8 can saturate (no VNNI))``."""
    return f"cpu: {(cpu or detect_cpu()).describe()}"
