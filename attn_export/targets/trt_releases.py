"""The TensorRT releases the toolkit knows, as data: each release's ONNX parser opset ceiling and its JetPack.

Every table of the toolkit (the operator table behind ``check-trt``, the GPU architectures,
the build plans) is written for these releases only, so a ``--trt-version`` (or check-trt's
``--trt``) that names none of them is refused, listing them, rather than checked against
rules that were never written for it. ``release("10.3")`` is the row; ``release_for_target``
also holds a target to the releases it has a build of (its ``trt_releases``; ``--target jetson``:
the ones a JetPack ships).

Columns, each with its source (``SOURCES``):

* ``max_opset``: the highest default-domain opset the release's ONNX parser accepts. The
  exporter's default opset is capped by it and an explicit ``--opset`` above it is refused
  (``export.targets.export_spec_for``), so a graph is never exported for a parser that
  cannot read it.
* ``jetpack``: the JetPacks that ship the release (from ``JETPACKS``), or None when no JetPack
  does (the 10.x server releases; 11.0-11.3, which have no JetPack build at all).

``JETPACKS`` is the Jetson stack as data: each JetPack, the TensorRT it ships and the GPU
architectures (``gpu_arch`` names) it runs on, with its sources. JetPack 7.0 and 7.1 run on
Jetson Thor only; Orin joins the JetPack 7 line at 7.2. A fact the sources do not settle says
so in the row's ``note`` ("unverified: ...").

``TrtVersion`` and ``parse_trt_version`` (major.minor from any spelling pip or a user writes) live
here too, below ``runtime/`` and ``checks/``, which read them (``runtime.tensorrt.spec`` re-exports them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from attn_export.errors import ConfigError

__all__ = ["JETPACKS", "PACKED_ATTENTION", "RELEASES", "SOURCES", "TRT_ATTENTION_OP", "JetPack", "Release", "TrtVersion", "jetson_archs", "jetson_releases", "known_releases",
           "parse_trt_version", "release", "release_for_target"]

@dataclass(frozen=True, order=True)
class TrtVersion:
    major: int
    minor: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


# "10.3", "11", "10.14.1.48", and what pip-installed bindings report: "10.14.1.48.post1"
# (the only 10.14 wheel on PyPI), "10.7.0.post1", "11.0.0rc1", "10.0.0b6", "10.3.0+cuda12.5".
_VERSION = re.compile(r"\s*(\d+)(?:\.(\d+))?(?:\.\d+)*(?:[.-]?(?:post|rc|a|b|dev)\d*)*(?:\+[0-9A-Za-z.]+)?\s*")


def parse_trt_version(text: str, flag: str | None = None) -> TrtVersion:
    """'10.3', '10.14.1.48.post1' or '11' -> TrtVersion; anything older than 10.0 is refused, naming ``flag`` (the
    option the user typed: ``--trt-version``, or check-trt's ``--trt``) and the releases the tables cover. Without a
    flag (a version read from a file: an engine's sidecar, the installed bindings) the message names no option.

    Only major.minor matter to the toolkit; patch, build, ``.postN``/``rcN`` and local
    (``+cuda12.5``) suffixes are accepted and dropped.
    """
    what = f"{flag} to be a TensorRT version" if flag else "a TensorRT version"
    m = _VERSION.fullmatch(str(text))
    if not m:
        raise ConfigError(f"expected {what} like 10.3, 11 or 10.14.1.48.post1, got {text!r}")
    ver = TrtVersion(int(m.group(1)), int(m.group(2) or 0))
    if ver.major < 10:
        fix = f"; use e.g. {flag} 10.3 (JetPack 6) or {flag} 10.14" if flag else ""
        raise ConfigError(f"expected {flag + ' to name ' if flag else ''}TensorRT 10.x or 11.x (the tables cover {known_releases()}), "
                          f"got {str(text).strip()}{fix}")  # fmt: skip
    return ver


SOURCES: dict[str, str] = {
    "ops-10.0": "onnx-tensorrt docs/operators.md (release/10.0-GA and 10.1-GA): 'TensorRT 10.0 supports operators in the "
    "inclusive range of opset 9 to opset 20'; unchanged for 10.3 (release/10.3)",
    "ops-10.9": "onnx-tensorrt docs/operators.md (release/10.9): opset 9-22 (the ONNX 1.17 submodule arrived in 10.6, docs/Changelog.md; "
    "10.6-10.8 are held to 20 until their operators.md is read)",
    "onnx-1.18": "onnx-tensorrt docs/Changelog.md, 10.11 GA: 'Updated ONNX version to 1.18' (opset 23); no later ONNX update is "
    "listed before 10.15, whose operators.md is the first read that says 24",
    "ops-10.15": "onnx-tensorrt docs/operators.md (release/10.15): 'TensorRT 10.15 supports operators in the inclusive range "
    "of opset 9 to opset 24'",
    "parser-11.5": "onnx-tensorrt release/11.5-GA and NVIDIA/TensorRT v11.5 release notes, Parsers: 'Added support for ONNX "
    "opset 25' (so 11.0-11.4 parse at most 24); TensorRT ONNX Opset Guide (11.x): maximum opset 25",
    "jetpack6": "JetPack 6.1 ships CUDA 12.6 and TensorRT 10.3 (https://docs.pytorch.org/TensorRT/v2.6.1/_sources/getting_started/jetpack.rst.txt)",
    "jetson-11": "TensorRT 10.x -> 11.x migration guide, Jetson/JetPack (11.3.0 and 11.4.1 editions): 11.0-11.3 do not support "
    "JetPack; 11.4.1 supports JetPack 7.2.2+ on Jetson AGX Orin and Thor "
    "(https://docs.nvidia.com/deeplearning/tensorrt/11.4.1/api/migration/tensorrt-10x-to-11x-jetson.html)",
    "jetpack7.0": "JetPack 7.0 (Jetson Linux 38.2) downloads page, for the Jetson AGX Thor developer kit "
    "(https://developer.nvidia.com/embedded/jetpack/downloads/archive-7.0); NVIDIA/TensorRT#4590: the default Thor image runs "
    "TensorRT 10.13.3.9 with CUDA 13.0 (https://github.com/NVIDIA/TensorRT/issues/4590)",
    "jetpack7.1": "JetPack 7.1 (Jetson Linux 38.4) downloads page: Jetson AGX Thor and the Jetson T4000 module "
    "(https://developer.nvidia.com/embedded/jetpack/downloads/archive-7.1)",
    "jetpack7.2": "JetPack 7.2 brings CUDA 13 to the Jetson Orin family (Orin had stayed on CUDA 12 through JetPack 6.x); TensorRT "
    "Edge-LLM's support matrix lists Jetson Orin on JetPack 7.2 (https://nvidia.github.io/TensorRT-Edge-LLM/0.11.1/user_guide/"
    "getting_started/support-matrix.html); Torch-TensorRT 2.12.1 builds Jetson Thor against TensorRT 10.16 "
    "(https://github.com/pytorch/tensorrt/releases/tag/v2.12.1)",
    "trt-attention-11.0": "onnx/onnx-tensorrt#1054, ONNX-TRT 11.0 GA: 'Added support for custom operators `TRT_Attention`, "
    "`TRT_MoE`, and `TRT_KVCacheUpdate`'",
    "packed-11.1": "IAttention's packed layouts: the TensorRT 11.0.0.114 and 11.4.0.106 Python bindings have AttentionIOForm "
    "(PADDED_BHND, PACKED_NHD) and IAttention.query_form/key_value_form/query_lengths/key_value_lengths, 10.14.1.48 has "
    "neither (tests/fixtures/trt/*.json); the ONNX parser takes them from ONNX through trt.TRT_Attention from 11.1: "
    "onnx/onnx-tensorrt#1057 and the TensorRT 11.1 release, Parsers: 'Updated TRT_Attention to support raggedness'; "
    "onnx-tensorrt docs/TRT_custom_ops.md: query_form/kv_form \"packed_nhd\", query_lengths/kv_lengths INT32 [batch + 1]",
    "parser-10.16": "no operators.md of onnx-tensorrt release/10.16 was read: 10.16 is held to 10.15's parser ceiling (opset 24), "
    "which every 10.x release since 10.15 keeps",
}


@dataclass(frozen=True)
class Release:
    """One TensorRT release (major.minor): its parser's opset ceiling and the JetPack that ships it."""

    version: TrtVersion
    max_opset: int
    opset_source: str  # a key of SOURCES
    jetpack: str | None = None  # e.g. "JetPack 6.1+"; None: no JetPack ships this release
    jetpack_source: str | None = None

    def __str__(self) -> str:
        return str(self.version)

    @property
    def label(self) -> str:
        return f"{self.version} ({self.jetpack})" if self.jetpack else str(self.version)


def _r(major: int, minor: int, max_opset: int, source: str, jetpack: str | None = None, jetpack_source: str | None = None) -> Release:
    return Release(TrtVersion(major, minor), max_opset, source, jetpack, jetpack_source)


@dataclass(frozen=True)
class JetPack:
    """One JetPack: the TensorRT it ships and the GPU architectures (``gpu_arch`` names) it runs on.

    ``and_later``: the TensorRT row also covers the later releases of its major (TensorRT 11.4.1
    "supports JetPack 7.2.2 or later"). ``note``: what the sources leave open ("unverified: ...").
    """

    version: str
    trt: TrtVersion
    archs: tuple[str, ...]
    sources: tuple[str, ...]
    and_later: bool = False
    note: str = ""


JETPACKS: tuple[JetPack, ...] = (
    JetPack("6.1", TrtVersion(10, 3), ("sm87",), ("jetpack6",)),
    JetPack("7.0", TrtVersion(10, 13), ("sm110",), ("jetpack7.0",)),
    JetPack("7.1", TrtVersion(10, 13), ("sm110",), ("jetpack7.1", "jetpack7.0"),
            note="unverified: the 7.1 page read does not list its TensorRT; 10.13 is 7.0's, carried over"),
    JetPack("7.2", TrtVersion(10, 16), ("sm87", "sm110"), ("jetpack7.2",),
            note="unverified: TensorRT 10.16 is the Thor build of Torch-TensorRT 2.12.1, not read from the JetPack 7.2 page"),
    JetPack("7.2.2", TrtVersion(11, 4), ("sm87", "sm110"), ("jetson-11",), and_later=True),
)  # fmt: skip


def jetson_archs(version: TrtVersion) -> tuple[str, ...]:
    """The GPU architectures some JetPack ships TensorRT ``version`` for (empty: no JetPack does)."""
    archs: list[str] = []
    for jp in JETPACKS:
        if jp.trt == version or (jp.and_later and jp.trt.major == version.major and jp.trt <= version):
            archs += [a for a in jp.archs if a not in archs]
    return tuple(archs)


def jetson_releases(arch: str) -> tuple[tuple[TrtVersion, TrtVersion | None], ...]:
    """``(lo, hi)`` TensorRT ranges the JetPacks ship for ``arch`` (hi None: and the later releases of that major)."""
    return tuple(dict.fromkeys((jp.trt, None if jp.and_later else jp.trt) for jp in JETPACKS if arch in jp.archs))


def _jetpack_label(version: TrtVersion) -> str | None:
    names = [jp.version + ("+" if jp.and_later or jp.version == "6.1" else "") for jp in JETPACKS if jp.trt == version]
    return f"JetPack {', '.join(names)}" if names else None


RELEASES: dict[TrtVersion, Release] = {r.version: r for r in (
    _r(10, 0, 20, "ops-10.0"), _r(10, 1, 20, "ops-10.0"), _r(10, 2, 20, "ops-10.0"),
    _r(10, 3, 20, "ops-10.0", _jetpack_label(TrtVersion(10, 3)), "jetpack6"),
    _r(10, 4, 20, "ops-10.0"), _r(10, 5, 20, "ops-10.0"), _r(10, 6, 20, "ops-10.0"), _r(10, 7, 20, "ops-10.0"), _r(10, 8, 20, "ops-10.0"),
    _r(10, 9, 22, "ops-10.9"), _r(10, 10, 22, "ops-10.9"),
    _r(10, 11, 23, "onnx-1.18"), _r(10, 12, 23, "onnx-1.18"), _r(10, 13, 23, "onnx-1.18", _jetpack_label(TrtVersion(10, 13)), "jetpack7.0"),
    _r(10, 14, 23, "onnx-1.18"), _r(10, 15, 24, "ops-10.15"), _r(10, 16, 24, "parser-10.16", _jetpack_label(TrtVersion(10, 16)), "jetpack7.2"),
    _r(11, 0, 24, "parser-11.5"), _r(11, 1, 24, "parser-11.5"), _r(11, 2, 24, "parser-11.5"), _r(11, 3, 24, "parser-11.5"),
    _r(11, 4, 24, "parser-11.5", _jetpack_label(TrtVersion(11, 4)), "jetson-11"),
    _r(11, 5, 25, "parser-11.5"),
)}  # fmt: skip


# The first release whose ONNX parser imports packed (ragged) query and key/value layouts into IAttention, through its
# trt.TRT_Attention custom op (SOURCES["packed-11.1"]; the op itself is 11.0's, without them); 10.x has no packed attention.
PACKED_ATTENTION = TrtVersion(11, 1)
TRT_ATTENTION_OP = TrtVersion(11, 0)  # the parser's trt.TRT_Attention custom op (SOURCES["trt-attention-11.0"])


def known_releases() -> str:
    """'10.0-10.16, 11.0-11.5': the releases of ``RELEASES``, one range per major."""
    majors: dict[int, list[TrtVersion]] = {}
    for v in RELEASES:
        majors.setdefault(v.major, []).append(v)
    return ", ".join(f"{min(vs)}-{max(vs)}" if len(vs) > 1 else str(vs[0]) for vs in majors.values())


def release(text: str | TrtVersion, flag: str = "--trt-version") -> Release:
    """The row of a TensorRT version (``10.3``, ``10.14.1.48.post1``, ``11``); a release not in ``RELEASES`` is a ConfigError listing them."""
    version = text if isinstance(text, TrtVersion) else parse_trt_version(str(text), flag)
    if version not in RELEASES:
        raise ConfigError(
            f"expected {flag} to name a TensorRT release the toolkit's tables cover ({known_releases()}), got {str(text).strip()!r} "
            f"(TensorRT {version} is not one of them); use one of those, e.g. {flag} 10.3 (JetPack 6), 10.13 (JetPack 7.0 on Thor), 10.14 or 11.4"
        )
    return RELEASES[version]


def release_for_target(target_name: str, covered: tuple[TrtVersion, ...], text: str | TrtVersion, flag: str = "--trt-version") -> Release:
    """``release(text)``, refused when ``--target`` has no build of it (``covered``: the target's ``trt_releases``;
    a Jetson target's are the ones a JetPack ships)."""
    row = release(text, flag)
    if row.version not in covered:
        builds = ", ".join(RELEASES[v].label for v in covered)
        why = "the release table names no JetPack that ships it; the JetPack releases are" if all(RELEASES[v].jetpack for v in covered) \
            else "it covers"
        raise ConfigError(f"--target {target_name} has no build of TensorRT {row.version}: {why} TensorRT {builds}; use {flag} with one of those")
    return row
