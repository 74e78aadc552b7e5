"""The one vocabulary of precisions: its facts agree with the modules that read them, an unknown
name is refused with the allowed ones, and the engine's precision is decided by one function."""

from __future__ import annotations

import pytest

from attn_export.compress.registry import precisions as quantize_precisions
from attn_export.errors import ConfigError
from attn_export.runtime.tensorrt.spec import EngineSpec
from attn_export.targets.gpu_arch import ARCHS
from attn_export.vocab.precisions import ARCH_PRECISIONS, EIGHT_BIT, PRECISIONS, engine_precision, get_precision, precision_names


def test_the_table_order_and_its_facts():
    assert precision_names() == ("fp32", "fp16", "bf16", "int8", "fp8")
    assert precision_names(export_float=True) == ("fp32", "fp16", "bf16")
    assert {n: (p.bits, p.number_kind) for n, p in PRECISIONS.items()} == {
        "fp32": (32, "float"), "fp16": (16, "float"), "bf16": (16, "float"), "int8": (8, "int"), "fp8": (8, "float")}  # fmt: skip
    # the 8-bit formats are exactly what --quantize reaches through the registry, best first for auto
    assert set(EIGHT_BIT) == {n for n, p in PRECISIONS.items() if p.quantized} == set(quantize_precisions())
    # every precision but fp32 is a column of the GPU table, and every architecture fills it
    assert {n for n, p in PRECISIONS.items() if p.arch_column} <= set(ARCH_PRECISIONS)
    assert all(set(a.precisions) == set(ARCH_PRECISIONS) for a in ARCHS.values())


def test_an_unknown_precision_is_refused_with_the_allowed_ones():
    assert get_precision("fp8").bits == 8
    with pytest.raises(ConfigError, match=r"expected a precision in fp32, fp16, bf16, int8, fp8, got 'fp4'; use one of"):
        get_precision("fp4")
    with pytest.raises(ConfigError, match=r"expected engine precision in fp32, fp16, bf16, int8, fp8, got 'fp4'"):
        EngineSpec(precision="fp4")


@pytest.mark.parametrize(
    ("quantize", "float_precision", "engine"),
    [
        (None, "fp32", "fp32"),
        ("none", "fp16", "fp16"),
        ("int8", "fp32", "int8"),
        ("fp8", "fp16", "fp8"),
        ("auto", "fp32", "int8"),  # until selection says which 8-bit format shipped (tests/test_engine_precision.py)
    ],
)
def test_the_plans_engine_precision_rule(quantize, float_precision, engine):
    assert engine_precision(quantize, float_precision) == engine


@pytest.mark.parametrize("name", ["fp16", "int8", "fp8"])
def test_the_jetson_bundles_note_names_the_flags_trtexec_gets(name):
    from attn_export.deploy.jetson_bundle import _precision_note
    from attn_export.runtime.tensorrt.build_plan import precision_plan

    note = _precision_note(EngineSpec(precision=name), [], 2)
    args = precision_plan("10.3", "fp32" if name == "fp16" else name, engine_precision=name if name == "fp16" else None,
                          arch="sm89" if name == "fp8" else None).trtexec_args  # fmt: skip
    assert args and all(f"`{a}`" in note for a in args), (note, args)
