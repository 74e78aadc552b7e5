"""What a run may use of the machine: memory probing, byte sizes, and a run's memory estimate.

Split from ``RunConfig`` so the config only validates: probing /proc and cgroups, parsing
``16G`` and estimating a run's peak are separate concerns (the calibration generator and the
sweep use them too, without a RunConfig). Light: no torch, no onnx.
"""

from __future__ import annotations

import os
import re
import resource
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attn_export.errors import ConfigError

if TYPE_CHECKING:
    from attn_export.vocab.run_options import RunOptions

__all__ = ["MAX_BYTES", "MemoryBudget", "MemoryEstimate", "address_space_limit", "available_memory", "check_fits", "estimate_memory",
           "format_bytes", "memory_budgets", "parse_bytes"]

# The largest size any flag takes (1 EiB): far above any machine, far below int64 overflow.
MAX_BYTES = 2**60
# Resident memory of the libraries a run loads (torch, ONNX Runtime, onnx, matplotlib) beyond the model.
RUNTIME_OVERHEAD = 768 * 2**20
# Address space a run maps beyond what it keeps resident, which an address-space limit (``ulimit -v``,
# RLIMIT_AS) counts and MemAvailable or a cgroup do not. The libraries: torch, ONNX Runtime, onnx and
# transformers map 1.3 GiB of code and reserved regions of which 0.47 GiB is resident (/proc/self/status
# VmSize and VmRSS after their import). Every artifact: its ONNX Runtime session's thread stacks and
# arenas, and the serialized copies a session is built from. Measured (2 threads, VmPeak / VmHWM):
# the default layer 1.6 / 0.6 GiB; ``--checkpoint minilm --quantize int8`` (6 artifacts) 3.9 / 2.3 GiB,
# which fails under ``ulimit -v 3500000`` (3.3 GiB) with a MemoryError, or a segmentation fault in a
# native library that cannot allocate: so such a run is refused before it starts.
LIBRARY_ADDRESS_SPACE = 900 * 2**20
ARTIFACT_ADDRESS_SPACE = 256 * 2**20

_SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20, "g": 2**30, "gb": 2**30,
               "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}  # fmt: skip


def parse_bytes(text: str | None, flag: str) -> int | None:
    """'64G', '512MiB', '1.5T' or a byte count -> bytes (binary units); None stays None."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d{1,20}(?:\.\d{1,20})?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ConfigError(f"expected {flag} as a size like 16G, 512M or a byte count, got {text!r}")
    value = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if not 1 <= value <= MAX_BYTES:
        raise ConfigError(f"expected {flag} between 1 byte and 1 EiB, got {text!r}")
    return int(value)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"  # pragma: no cover - unreachable


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory() -> int | None:
    """Bytes this process can still allocate: MemAvailable (/proc/meminfo, else sysconf), capped by
    the cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes) minus its usage; None if unknown."""
    avail: int | None = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = None
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):  # fmt: skip
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and limit < MAX_BYTES and usage is not None:
            room = max(0, limit - usage)
            avail = room if avail is None else min(avail, room)
            break
    return avail


@dataclass(frozen=True)
class MemoryEstimate:
    """A run's estimated peak memory in bytes, by part."""

    weights: int
    activations: int  # activations and attention scores of one forward pass, per runner
    data: int
    overhead: int
    mapped: int = 0  # address space mapped beyond the resident total (libraries, sessions): what RLIMIT_AS counts too

    @property
    def total(self) -> int:
        """Resident bytes at the peak (what MemAvailable, a cgroup and --max-memory are compared with)."""
        return self.weights + self.activations + self.data + self.overhead

    @property
    def address_space(self) -> int:
        """Address space at the peak (what ``ulimit -v`` is compared with)."""
        return self.total + self.mapped

    def describe(self) -> str:
        parts = (("weights", self.weights), ("activations and attention scores", self.activations), ("data", self.data))
        return ", ".join(f"{name} {format_bytes(v)}" for name, v in parts)


def estimate_memory(cfg: RunOptions) -> MemoryEstimate:
    """Peak resident memory of the run ``cfg`` describes, estimated from its shapes before anything is allocated.

    weights: every copy a run holds at once (eager, the exporter's working copy, the
    serialized graph, one ONNX Runtime session per artifact); activations and attention
    scores: one forward pass, kept by every session's arena after its first run; data:
    the validation feeds with their reference and artifact outputs. Deliberately on the
    high side: refusing a run that would fit wastes a flag, starting one that cannot
    fit wastes the machine.
    """
    shape = cfg.kind.model_shape(cfg)
    b, seq, d, h, ffn = cfg.batch, cfg.seq_len, shape.d_model, shape.heads, shape.ffn
    artifacts = _artifacts(cfg)
    if shape.attention_layer == "linear":  # (B, H, L, Dh, Dh) running sums when causal, (B, H, Dh, Dh) otherwise
        scores = b * d * (d // h) * 4 * (seq if cfg.resolved_mask == "causal" else 1) * 2
    elif shape.attention_layer == "block-sparse":  # (B * L/bs, H, bs, bs) with bs = 32
        scores = b * h * seq * min(seq, 32) * 4 * 3
    else:  # (B, H, L, L): scores, mask added, softmax
        scores = b * h * seq * seq * 4 * 3
    copies = 3 + artifacts
    activations = b * seq * (8 * d + ffn) * 4  # x, q/k/v, context, output, residual/norm (D each) + FFN hidden
    data = 3 * cfg.validation_batches * b * seq * d * 4
    mapped = LIBRARY_ADDRESS_SPACE + ARTIFACT_ADDRESS_SPACE * artifacts
    return MemoryEstimate(shape.params * 4 * copies, (activations + scores) * (1 + artifacts), data, RUNTIME_OVERHEAD, mapped)


def _artifacts(cfg: RunOptions) -> int:
    """How many artifacts the run builds, each with its own session: the routes the flags ask for, times
    the encoder forms (``--encoder-form auto`` builds a whole encoder both padded and packed, as
    ``plan.encoder_forms`` decides; counted here from the same flags, since the plan imports the config)."""
    per_form = 1 + (cfg.precision == "fp16") + 2 * (cfg.quantize is not None) + 2 * (cfg.low_rank is not None)
    return per_form * _encoder_forms(cfg)


def _encoder_forms(cfg: RunOptions) -> int:
    if (getattr(cfg, "encoder_form", None) or "auto") != "auto" or cfg.low_rank is not None or getattr(cfg, "distill", None) is not None:
        return 1
    try:
        whole_encoder = cfg.kind.profile(cfg).kind == "encoder"  # type: ignore[attr-defined]
        timed = cfg.target_info.select_by == "latency"  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a config its own checks refuse: count it as one form
        return 1
    return 2 if whole_encoder and timed else 1


def address_space_limit() -> int | None:
    """The process's address-space limit in bytes (``ulimit -v``, RLIMIT_AS), or None when unlimited."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


@dataclass(frozen=True)
class MemoryBudget:
    """One limit a run must fit in: bytes, what sets it, and whether it counts address space or resident memory."""

    limit: int
    source: str
    address_space: bool = False
    fix: str = ""


def memory_budgets(max_memory: int | None) -> list[MemoryBudget]:
    """Every limit that applies: ``--max-memory`` (else the memory available: MemAvailable capped by the
    cgroup), and the address-space limit, which ``--max-memory`` cannot lift (the kernel enforces it)."""
    out: list[MemoryBudget] = []
    if max_memory is not None:
        out.append(MemoryBudget(max_memory, "--max-memory", fix="pass a larger --max-memory"))
    else:
        avail = available_memory()
        if avail is not None:
            out.append(MemoryBudget(avail, "available on this machine", fix="pass --max-memory SIZE to try anyway"))
    limit = address_space_limit()
    if limit is not None:
        out.append(MemoryBudget(limit, "the address-space limit (ulimit -v)", address_space=True, fix="raise the limit (ulimit -v)"))
    return out


def check_fits(est: MemoryEstimate, max_memory: int | None) -> None:
    """Refuse (one line) a run whose estimate exceeds a limit that applies, before anything is built."""
    for budget in memory_budgets(max_memory):
        need = est.address_space if budget.address_space else est.total
        if need > budget.limit:
            what = f"{format_bytes(need)} of address space ({est.describe()}, libraries and sessions {format_bytes(est.mapped)})" if (
                budget.address_space) else f"{format_bytes(need)} ({est.describe()})"  # fmt: skip
            raise ConfigError(
                f"expected the run to fit in memory, but it needs about {what} and {format_bytes(budget.limit)} is {budget.source}; "
                f"lower --batch/--seq-len/--d-model (or drop a --quantize/--low-rank stage), or {budget.fix}"
            )
