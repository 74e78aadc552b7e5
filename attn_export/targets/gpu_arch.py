"""GPU architectures as data: which precisions TensorRT runs on each, per TensorRT release, with sources.

``--gpu-arch sm90`` names the GPU an engine is built for. Each row below says which
precisions TensorRT supports on that compute capability (fp16, bf16, int8, fp8, fp4), from
which TensorRT release the architecture has kernels at all, and where each claim comes
from. ``supports(arch, precision, trt_version)`` answers with its reason and source;
``best_8bit(arch, trt_version)`` picks the 8-bit format ``--quantize auto`` ships: FP8 E4M3
where the GPU has FP8 tensor cores (SM 8.9 and later), int8 elsewhere. A claim the sources
do not settle is ``unverified``, never guessed into a yes.

Sources (``SOURCES``): the TensorRT support matrix ("GPU Architecture and Precision
Support"), TensorRT release notes, NVIDIA's 10.x -> 11.x migration guide for Jetson, the
ONNX-TensorRT changelog, NVIDIA Transformer Engine's and TensorRT-RTX's support matrices
(the FP8/FP4 compute-capability floor) and TensorRT Edge-LLM's (Jetson Orin has no FP8).
``docs/targets.md`` renders ``support_table()``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from attn_export.errors import ConfigError
from attn_export.targets.trt_releases import RELEASES, TrtVersion, jetson_archs, jetson_releases, parse_trt_version
from attn_export.vocab.precisions import ARCH_PRECISIONS as PRECISIONS
from attn_export.vocab.precisions import EIGHT_BIT, precision_names

__all__ = [
    "ALIASES",
    "ARCHS",
    "EIGHT_BIT",
    "PRECISIONS",
    "SOURCES",
    "GpuArch",
    "Support",
    "archs_with",
    "best_8bit",
    "default_arch",
    "jetson_release",
    "get_arch",
    "parse_gpu_arch",
    "require_precision",
    "support_table",
    "supports",
]

log = logging.getLogger(__name__)

# PRECISIONS (the table's columns) and EIGHT_BIT (best first) come from the vocabulary.
FLOATS: tuple[str, ...] = precision_names(export_float=True)  # --precision's names, fp32 first

SOURCES: dict[str, str] = {
    "matrix": "TensorRT 10.14.1 Support Matrix, 'GPU Architecture and Precision Support' "
    "(https://docs.nvidia.com/deeplearning/tensorrt/latest/getting-started/support-matrix-10/10.14.1.html; "
    "10.1.0: https://docs.nvidia.com/deeplearning/tensorrt/archives/tensorrt-1010/support-matrix/index.html)",
    "te": "NVIDIA Transformer Engine support matrix: 'FP8 (per tensor) requires compute capability 8.9 or higher'; "
    "NVFP4 on 10.0/10.3 (https://nvidia.github.io/TransformerEngine/support_matrix.html)",
    "rtx": "TensorRT-RTX 'Working with Quantized Types': 'FP8 ... on Ada and later (compute capability 8.9 or later), "
    "FP4 ... on Blackwell or later (compute capability 10.0 or later)' "
    "(https://docs.nvidia.com/deeplearning/tensorrt-rtx/latest/inference-library/work-quantized-types.html)",
    "rn-10.8": "TensorRT 10.8.0 release notes: 'This release supports NVIDIA Blackwell GPUs ... B200 and GB200 NVL have "
    "limited support ... early access'; 'Added support for E2M1 FP4 data type on NVIDIA Blackwell GPUs using explicit "
    "quantization' (https://docs.nvidia.com/deeplearning/tensorrt/latest/getting-started/release-notes-10/10.8.0.html)",
    "rn-11.5": "TensorRT 11.5.0 release notes: GB300 (compute capability 10.3) 'supported precisions ... TF32, FP32, FP16, "
    "FP8, FP4, BF16, and INT8' (https://docs.nvidia.com/deeplearning/tensorrt/latest/getting-started/release-notes-11/11.5.0.html)",
    "jetson-11": "TensorRT 10.x -> 11.x migration guide, Jetson/JetPack (11.3.0 and 11.4.1 editions): 11.0-11.3 do not "
    "support JetPack; 11.4.1 supports JetPack 7.2.2+ on Jetson AGX Orin and Thor; Orin on JetPack 6.x stays on TensorRT 10.x "
    "(https://docs.nvidia.com/deeplearning/tensorrt/11.4.1/api/migration/tensorrt-10x-to-11x-jetson.html)",
    "jetpack6": "JetPack 6.1 ships CUDA 12.6 and TensorRT 10.3 (https://docs.pytorch.org/TensorRT/v2.6.1/_sources/getting_started/jetpack.rst.txt)",
    "edge-llm": "TensorRT Edge-LLM support matrix: Jetson Orin on JetPack 7.2 'FP16, INT8, and INT4 only'; 'Jetson Orin does "
    "not run FP8 or FP4 model engines' (https://nvidia.github.io/TensorRT-Edge-LLM/0.11.1/user_guide/getting_started/support-matrix.html)",
    "parser-9.0": "onnx-tensorrt docs/Changelog.md, TensorRT 9.0 GA: 'Added support for FP8 and BF16 datatypes'; "
    "docs/operators.md: DequantizeLinear takes INT8, FP8, INT4",
    "sm110": "CUDA 13.0 renames Jetson Thor's compute capability from 10.1 to 11.0: 'Support Thor SM renaming from sm_101 to "
    "sm_110 starting from CUDA 13.0; for CUDA 12.9 and older releases Thor stays labeled as sm_101' (cuRANDDx/nvCOMPDx release notes, "
    "https://docs.nvidia.com/cuda/curanddx/release_notes.html)",
    "jetpack7": "JetPack 7.0/7.1 (Jetson Linux 38.x) run on Jetson AGX Thor; 7.2 adds the Orin family; 7.2.2 takes TensorRT 11.4.1 "
    "(https://developer.nvidia.com/embedded/jetpack/downloads/archive-7.0, archive-7.1; targets/trt_releases.py JETPACKS has each row's sources)",
    "trt-4590": "NVIDIA/TensorRT#4590 (open): on Jetson Thor (SM 110) TensorRT 10.13.3.9 accepts the FP8/FP4 builder flags but "
    "'silently builds FP32 engines' with no error or warning (https://github.com/NVIDIA/TensorRT/issues/4590)",
    "vllm-39712": "vLLM PR #39712 'Enable FP8 on NVIDIA Thor (SM110)' (https://github.com/vllm-project/vllm/pull/39712)",
}


@dataclass(frozen=True)
class GpuArch:
    """One compute capability and what TensorRT runs on it.

    precisions: precision -> "yes" | "no" | "unverified" (the hardware's support in TensorRT).
    first_trt: the first TensorRT release with kernels for it. releases: a predicate's data,
    ``(lo, hi)`` ranges of releases that ship for it (None: every release from ``first_trt``).
    """

    name: str
    cc: tuple[int, int]
    family: str
    examples: tuple[str, ...]
    precisions: dict[str, str]
    sources: tuple[str, ...]
    first_trt: TrtVersion = TrtVersion(10, 0)
    releases: tuple[tuple[TrtVersion, TrtVersion | None], ...] | None = None
    releases_note: str = ""
    trt11: str = "yes"  # whether the sources list it for TensorRT 11.x
    dla: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    # (precision, TensorRT release) -> a known problem the sources report: it rides on ``supports``'s reason, so the
    # plan's --quantize auto note and the static check carry it into the report (the engine attestation checks it on the device)
    caveats: dict[tuple[str, TrtVersion], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = set(PRECISIONS) - set(self.precisions)
        if missing or any(v not in ("yes", "no", "unverified") for v in self.precisions.values()):
            raise ConfigError(f"{self.name}: expected a yes/no/unverified for each of {PRECISIONS}, got {self.precisions}")

    @property
    def label(self) -> str:
        return f"{self.name} ({self.family}: {', '.join(self.examples)})"


def _p(fp16: str, bf16: str, int8: str, fp8: str, fp4: str) -> dict[str, str]:
    return {"fp16": fp16, "bf16": bf16, "int8": int8, "fp8": fp8, "fp4": fp4}


V10_8, V10_13, V11_4 = TrtVersion(10, 8), TrtVersion(10, 13), TrtVersion(11, 4)
_JETSON_NOTE = "the TensorRT releases a JetPack ships for it (targets/trt_releases.py JETPACKS: " + ", ".join(
    f"{r.version} = {r.jetpack}" for r in RELEASES.values() if r.jetpack) + ")"
ARCHS: dict[str, GpuArch] = {
    "sm75": GpuArch("sm75", (7, 5), "Turing", ("T4",), _p("yes", "no", "yes", "no", "no"), ("matrix", "te", "rtx"), trt11="unverified"),
    "sm80": GpuArch("sm80", (8, 0), "Ampere", ("A100", "A30"), _p("yes", "yes", "yes", "no", "no"), ("matrix", "te")),
    "sm86": GpuArch("sm86", (8, 6), "Ampere", ("A10", "A40", "RTX 30"), _p("yes", "yes", "yes", "no", "no"), ("matrix", "te", "rtx")),
    "sm87": GpuArch(
        "sm87", (8, 7), "Ampere (Jetson)", ("Jetson AGX Orin", "Orin NX", "Orin Nano"), _p("yes", "unverified", "yes", "no", "no"),
        ("matrix", "edge-llm", "jetson-11", "jetpack6", "jetpack7"),
        releases=jetson_releases("sm87"),
        releases_note="JetPack 6.x ships TensorRT 10.3, JetPack 7.2 ships 10.16 (7.0/7.1 are Thor only); TensorRT 11.0-11.3 have no "
        "JetPack build; 11.4.1 needs JetPack >= 7.2.2",
        dla=True,
    ),
    "sm89": GpuArch("sm89", (8, 9), "Ada Lovelace", ("L4", "L40S", "RTX 40"), _p("yes", "yes", "yes", "yes", "no"), ("matrix", "te", "rtx")),
    "sm90": GpuArch("sm90", (9, 0), "Hopper", ("H100", "H200", "GH200"), _p("yes", "yes", "yes", "yes", "no"), ("matrix", "te")),
    "sm100": GpuArch("sm100", (10, 0), "Blackwell", ("B200", "GB200"), _p("yes", "yes", "yes", "yes", "yes"), ("matrix", "te", "rtx", "rn-10.8"),
                     first_trt=V10_8, notes=("10.8 lists B200/GB200 as early access",)),
    "sm103": GpuArch("sm103", (10, 3), "Blackwell Ultra", ("B300", "GB300"), _p("yes", "yes", "yes", "yes", "yes"), ("rn-11.5", "te"),
                     first_trt=V10_8, notes=("the first release listing CC 10.3 was not found; 10.8 (Blackwell) is assumed",)),
    "sm110": GpuArch(
        "sm110", (11, 0), "Blackwell (Jetson Thor)", ("Jetson AGX Thor",), _p("yes", "unverified", "yes", "yes", "unverified"),
        ("sm110", "te", "rtx", "vllm-39712", "jetpack7", "trt-4590", "jetson-11"),
        first_trt=V10_13, releases=jetson_releases("sm110"),
        releases_note="JetPack 7.0/7.1 ship TensorRT 10.13, 7.2 ships 10.16; TensorRT 11.0-11.3 have no JetPack build; 11.4.1 needs "
        "JetPack >= 7.2.2",
        notes=("sm101 before CUDA 13", "bf16 and fp4 are not settled by the sources read: unverified"),
        caveats={("fp8", V10_13): "NVIDIA/TensorRT#4590: FP8 builds on Thor with TensorRT 10.13 are reported to come out FP32 "
                 "silently; the engine attestation on the device catches it (TensorRT 10.16, JetPack 7.2, is the next release)"},
    ),
    "sm120": GpuArch("sm120", (12, 0), "Blackwell (workstation)", ("RTX PRO 6000", "RTX 50"), _p("yes", "yes", "yes", "yes", "yes"),
                     ("matrix", "te", "rtx", "rn-10.8"), first_trt=V10_8),
}  # fmt: skip
ALIASES: dict[str, str] = {"sm101": "sm110"}  # Jetson Thor's name before CUDA 13 (source "sm110")


@dataclass(frozen=True)
class Support:
    """The answer to "does TensorRT X run precision P on arch A": truthy only for a sourced yes."""

    status: str  # "yes" | "no" | "unverified"
    reason: str
    sources: tuple[str, ...]

    def __bool__(self) -> bool:
        return self.status == "yes"

    def __str__(self) -> str:
        return f"{self.status}: {self.reason}"


def parse_gpu_arch(text: str) -> str:
    """'sm90', 'sm_90', 'SM90', '9.0' or '90' -> 'sm90' ('sm101', Thor before CUDA 13, -> 'sm110'); anything not in ``ARCHS`` is a ConfigError listing them."""
    raw = str(text).strip().lower()
    m = re.fullmatch(r"(?:sm_?)?(\d{1,2})\.?(\d)", raw)
    name = f"sm{m.group(1)}{m.group(2)}" if m else raw
    name = ALIASES.get(name, name)
    if name not in ARCHS:
        known = ", ".join(f"{a.name} ({a.family})" for a in ARCHS.values())
        raise ConfigError(f"unknown --gpu-arch {text!r}; choose one of {known}")
    return name


def get_arch(arch: str | GpuArch) -> GpuArch:
    return arch if isinstance(arch, GpuArch) else ARCHS[parse_gpu_arch(arch)]


def default_arch(needs_jetpack: bool, trt_version: str | TrtVersion | None) -> str | None:
    """The architecture a target implies when ``--gpu-arch`` is not given: on a Jetson target the one GPU the JetPacks
    shipping ``trt_version`` run on (``JETPACKS``: 10.3 -> sm87 Orin, 10.13 -> sm110 Thor); None when not known or not one."""
    if not needs_jetpack or trt_version is None:
        return None
    archs = jetson_archs(_version(trt_version))
    return archs[0] if len(archs) == 1 else None


def jetson_release(arch: str | None, trt_version: str) -> str:
    """The TensorRT release a Jetson target builds with when ``--trt-version`` is not given: its own (``trt_version``)
    where a JetPack ships it for ``arch``, else the newest JetPack TensorRT 10.x release for ``arch`` (Thor: 10.16)."""
    if arch is None or parse_gpu_arch(arch) in jetson_archs(_version(trt_version)):
        return trt_version
    name = parse_gpu_arch(arch)
    shipped = [v for v in RELEASES if RELEASES[v].jetpack and name in jetson_archs(v) and v.major == _version(trt_version).major]
    return str(max(shipped)) if shipped else trt_version


def _version(trt_version: str | TrtVersion) -> TrtVersion:
    return trt_version if isinstance(trt_version, TrtVersion) else parse_trt_version(str(trt_version))


def _release_ok(a: GpuArch, v: TrtVersion) -> Support:
    src = tuple(s for s in a.sources if s in ("jetson-11", "jetpack6", "jetpack7", "rn-10.8")) or ("matrix",)
    if v < a.first_trt:
        return Support("no", f"TensorRT {v} has no kernels for {a.label}; it needs TensorRT >= {a.first_trt}", src)
    if a.releases is not None and not any(lo <= v and (hi is None or v <= hi) for lo, hi in a.releases):
        status = "no" if v.major >= 11 else "unverified"
        return Support(status, f"TensorRT {v} does not ship for {a.label}: {a.releases_note}", src)
    if v.major >= 11 and a.trt11 != "yes":
        return Support("unverified", f"the sources this table was written from do not list {a.label} for TensorRT 11; check the 11.x support matrix", src)
    return Support("yes", f"TensorRT {v} supports {a.label}", src)


def supports(arch: str | GpuArch, precision: str, trt_version: str | TrtVersion) -> Support:
    """Whether TensorRT ``trt_version`` runs ``precision`` on ``arch``, with the reason and its sources."""
    a, v = get_arch(arch), _version(trt_version)
    if precision not in PRECISIONS:
        raise ConfigError(f"expected a precision in {', '.join(PRECISIONS)}, got {precision!r}")
    status = a.precisions[precision]
    if status == "no":  # the hardware lacks it, whichever release
        have = ", ".join(archs_with(precision))
        return Support("no", f"{a.label} has no {precision} in TensorRT (GPUs with it: {have})", a.sources)
    release = _release_ok(a, v)
    if not release:
        return release
    if precision == "fp4" and status == "yes" and v < V10_8:
        return Support("no", f"FP4 (E2M1) explicit quantization needs TensorRT >= 10.8, got {v}", ("rn-10.8",))
    if status == "yes":
        extra = " (FP8 Q/DQ parsed since TensorRT 9.0)" if precision == "fp8" else ""
        if (caveat := a.caveats.get((precision, v))) is not None:
            return Support("yes", f"{a.label} runs {precision} in TensorRT {v}{extra}; caveat: {caveat}", a.sources)
        return Support("yes", f"{a.label} runs {precision} in TensorRT {v}{extra}", a.sources + (("parser-9.0",) if precision == "fp8" else ()))
    return Support("unverified", f"the sources do not settle {precision} on {a.label}", a.sources)


def archs_with(precision: str) -> list[str]:
    """Architectures whose row says yes for ``precision``, oldest first."""
    return [a.name for a in ARCHS.values() if a.precisions.get(precision) == "yes"]


def require_precision(arch: str | GpuArch, precision: str, trt_version: str | TrtVersion) -> Support:
    """``supports`` or a one-line ConfigError naming the architectures that have ``precision`` (checked before any work)."""
    s = supports(arch, precision, trt_version)
    if not s:
        a = get_arch(arch)
        if precision in EIGHT_BIT or precision not in FLOATS:
            alt = " or ".join(p for p in EIGHT_BIT if p != precision and supports(a, p, trt_version)) if precision in EIGHT_BIT else ""
            flag, hint = "--quantize", f"; use --quantize {alt} (or auto)" if alt else ""
        else:  # a reduced export float (--precision): another one this GPU runs
            ok = [p for p in FLOATS if p != precision and (p not in PRECISIONS or supports(a, p, trt_version))]
            alt = " or ".join(sorted(ok, key=lambda p: p not in PRECISIONS))  # reduced floats first, fp32 last
            flag, hint = "--precision", f"; use --precision {alt}" if alt else ""
            if not _release_ok(a, _version(trt_version)):  # the release, not the precision, is what the GPU lacks
                hint = f"; use a --trt-version that ships for {a.name}"
        raise ConfigError(f"{flag} {precision} cannot run on --gpu-arch {a.name} with TensorRT {_version(trt_version)}: {s.reason}{hint}")
    return s


def best_8bit(arch: str | GpuArch, trt_version: str | TrtVersion) -> tuple[str, str]:
    """("fp8" | "int8", why): the 8-bit format ``--quantize auto`` ships for ``arch`` on ``trt_version``."""
    a, v = get_arch(arch), _version(trt_version)
    skipped = []
    for precision in EIGHT_BIT:
        s = supports(a, precision, v)
        if s:
            why = f"{precision}: {s.reason}" + (f" ({'; '.join(skipped)})" if skipped else "")
            log.debug("best 8-bit for %s on TensorRT %s: %s", a.name, v, why)
            return precision, why
        skipped.append(f"not {precision}: {s.reason}")
    raise ConfigError(f"no 8-bit format runs on --gpu-arch {a.name} with TensorRT {v}: {'; '.join(skipped)}; pick a supported --trt-version")


def support_table(releases: tuple[str, ...] = ("10.3", "10.13", "10.14", "10.16", "11.4")) -> str:
    """Markdown: each architecture x TensorRT release -> the 8-bit format auto picks (docs/targets.md)."""
    head = "| GPU | " + " | ".join(f"TensorRT {r}" for r in releases) + " | sources |"
    lines = [head, "|" + "---|" * (len(releases) + 2)]
    for a in ARCHS.values():
        cells = []
        for r in releases:
            try:
                best = best_8bit(a, r)[0]
                cells.append(f"{best} (caveat)" if (best, _version(r)) in a.caveats else best)
            except ConfigError:
                s = _release_ok(a, _version(r))
                cells.append("–" if s.status == "no" else "unverified")
        lines.append(f"| {a.label} | " + " | ".join(cells) + f" | {', '.join(a.sources)} |")
    return "\n".join(lines)
