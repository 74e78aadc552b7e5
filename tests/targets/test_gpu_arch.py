"""GPU architectures as data: every row sourced, FP8 only from SM 8.9, int8 the 8-bit of Ampere and Jetson Orin."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attn_export.errors import ConfigError
from attn_export.targets.gpu_arch import (
    ARCHS,
    PRECISIONS,
    SOURCES,
    archs_with,
    best_8bit,
    default_arch,
    parse_gpu_arch,
    require_precision,
    support_table,
    supports,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "targets.md"


def test_every_row_is_complete_and_sourced() -> None:
    for arch in ARCHS.values():
        assert set(arch.precisions) == set(PRECISIONS), arch.name
        assert arch.sources and all(s in SOURCES for s in arch.sources), (arch.name, arch.sources)
        assert parse_gpu_arch(arch.name) == arch.name and arch.name == f"sm{arch.cc[0]}{arch.cc[1]}"
    for key, text in SOURCES.items():
        assert "http" in text or "release/" in text or "Changelog" in text, f"source {key} names no document: {text}"


def test_fp8_only_from_ada_on() -> None:
    assert archs_with("fp8") == ["sm89", "sm90", "sm100", "sm103", "sm110", "sm120"]
    assert all(ARCHS[a].cc >= (8, 9) for a in archs_with("fp8"))
    assert archs_with("fp4") == ["sm100", "sm103", "sm120"]


@pytest.mark.parametrize("version", ["10.3", "10.14", "11.4"])
@pytest.mark.parametrize("arch", ["sm89", "sm90"])
def test_fp8_accepted_on_ada_and_hopper(arch: str, version: str) -> None:
    s = supports(arch, "fp8", version)
    assert s and s.status == "yes" and "matrix" in s.sources, s


@pytest.mark.parametrize(("arch", "version"), [("sm87", "10.3"), ("sm87", "11.4"), ("sm80", "10.14"), ("sm86", "11.4"), ("sm75", "10.3")])
def test_fp8_refused_without_fp8_tensor_cores(arch: str, version: str) -> None:
    s = supports(arch, "fp8", version)
    assert not s and s.status == "no" and "sm89, sm90" in s.reason, s
    with pytest.raises(ConfigError) as err:
        require_precision(arch, "fp8", version)
    msg = str(err.value)
    assert "\n" not in msg and arch in msg and "sm89" in msg and "--quantize int8" in msg, msg


def test_release_rules() -> None:
    # Blackwell has kernels from 10.8, FP4 explicit quantization too
    assert supports("sm100", "fp8", "10.3").status == "no" and "10.8" in supports("sm100", "fp8", "10.3").reason
    assert supports("sm100", "fp8", "10.8") and supports("sm120", "fp4", "10.14") and not supports("sm90", "fp4", "10.14")
    # Jetson Orin: JetPack 6 is 10.3, 11.0-11.3 have no JetPack build, 11.4.1 needs JetPack 7.2.2
    assert supports("sm87", "int8", "10.3") and supports("sm87", "int8", "11.4")
    assert supports("sm87", "int8", "11.1").status == "no" and "JetPack" in supports("sm87", "int8", "11.1").reason
    assert supports("sm87", "int8", "10.14").status == "unverified"
    assert supports("sm75", "int8", "11.4").status == "unverified" and supports("sm75", "int8", "10.14")
    with pytest.raises(ConfigError, match="expected a precision"):
        supports("sm90", "int4", "10.14")


@pytest.mark.parametrize(
    ("arch", "version", "best"),
    [("sm90", "10.14", "fp8"), ("sm89", "10.3", "fp8"), ("sm100", "11.4", "fp8"), ("sm87", "10.3", "int8"), ("sm87", "11.4", "int8"), ("sm80", "11.4", "int8")],
)
def test_best_8bit(arch: str, version: str, best: str) -> None:
    got, why = best_8bit(arch, version)
    assert got == best and arch in why, why
    if best == "int8":
        assert "not fp8" in why, why


def test_best_8bit_refuses_a_release_without_the_gpu() -> None:
    with pytest.raises(ConfigError, match="no 8-bit format runs on --gpu-arch sm100 with TensorRT 10.3"):
        best_8bit("sm100", "10.3")


def test_parse_and_defaults() -> None:
    assert [parse_gpu_arch(t) for t in ("sm90", "SM_90", "9.0", "90", "sm_87")] == ["sm90", "sm90", "sm90", "sm90", "sm87"]
    with pytest.raises(ConfigError, match=r"unknown --gpu-arch 'sm70'; choose one of sm75 \(Turing\)"):
        parse_gpu_arch("sm70")
    assert default_arch(True, "10.3") == "sm87" and default_arch(False, "10.14") is None


def test_docs_table_is_the_data() -> None:
    text = DOCS.read_text()
    table = support_table()
    assert table in text, "docs/targets.md lacks the generated GPU x TensorRT table; paste gpu_arch.support_table()"
    assert re.search(r"\| sm87 .*\| int8 \| unverified \| unverified \| int8 \| int8 \|", table), table
    assert re.search(r"\| sm90 .*\| fp8 \| fp8 \| fp8 \| fp8 \| fp8 \|", table) and re.search(r"\| sm110 .*\| – \| fp8 \(caveat\) \| unverified \| fp8 \| fp8 \|", table), table
