"""The engine attestation on recorded detailed inspector JSON, and the strict doubles' inspector.

The fixtures (tests/fixtures/trt/inspector/README.md) are one small int8 encoder three ways: all
as planned, one GEMM silently FP32, attention unfused. The doubles answer the inspector calls each
release's bindings have, and only those.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from trt_fakes import World, install, major_minor, manifest_versions

from attn_export.runtime.tensorrt.attest import (
    ATTEST_BITS,
    Attestation,
    EngineExpectation,
    PlannedGemm,
    attest_engine,
    attest_file,
    layer_precision,
    read_layers,
)
from attn_export.vocab.precisions import PRECISIONS

INSPECTOR = Path(__file__).resolve().parents[2] / "fixtures" / "trt" / "inspector"
EXPECT = EngineExpectation.from_dict(json.loads((INSPECTOR / "expectation.json").read_text()))


def _load(name: str) -> dict:
    return json.loads((INSPECTOR / name).read_text())


def test_all_int8_engine_is_attested() -> None:
    att = attest_file(str(INSPECTOR / "all_int8.json"), EXPECT)
    assert att and att.passed and att.violations == []
    assert [g.group for g in att.groups] == [f"layers.{i}.{r}" for i in (0, 1) for r in ("qkv", "attn_out", "ffn1", "ffn2")]
    assert all(g.actual == ["int8"] and g.ok for g in att.groups)
    assert att.fused_attention == att.attention_blocks == 2 and att.standalone_softmax == [] and att.unlocated_gemms == []
    assert att.layers_by_precision == {"int32": 1, "int8": 8, "fp16": 9}  # the embedding reads int32 ids; MHA, kgen and pooling run fp16


def test_one_gemm_silently_fp32_fails_naming_the_layer() -> None:
    att = attest_engine(_load("one_gemm_fp32.json"), EXPECT)
    assert not att and len(att.violations) == 1
    assert att.violations[0] == "GEMM group layers.1.ffn2: int8 requested, engine layer '/layers_1/ffn_out/MatMul_myl0_15' runs fp32"
    bad = [g for g in att.groups if not g.ok]
    assert [(g.group, g.requested, g.actual) for g in bad] == [("layers.1.ffn2", "int8", ["fp32"])]


def test_unfused_attention_fails_naming_attention() -> None:
    att = attest_engine(_load("attention_unfused.json"), EXPECT)
    assert not att and len(att.violations) == 1
    assert att.violations[0].startswith("attention not fused: 0 fused attention kernel(s) for 2 attention block(s), standalone softmax layer "
                                        "'__myl_AddMaxSubExpSumDiv_myl0_3'")  # fmt: skip
    assert all(g.ok for g in att.groups)  # the planned GEMMs still run int8: the attention BMMs are not the plan's GEMMs
    assert len(att.standalone_softmax) == 2


def test_unfused_attention_passes_where_the_table_says_it_does_not_fuse() -> None:
    expect = EngineExpectation(EXPECT.precision, EXPECT.gemms, EXPECT.attention_blocks, fused_attention=False)
    assert attest_engine(_load("attention_unfused.json"), expect)


def test_a_wider_16_bit_gemm_fails_and_fp32_requests_never_do() -> None:
    fp16 = [PlannedGemm(g.node, g.group, "fp16" if g.group == "layers.1.ffn2" else g.precision) for g in EXPECT.gemms]
    att = attest_engine(_load("one_gemm_fp32.json"), EngineExpectation("int8", tuple(fp16), 2, True))
    assert att.violations == ["GEMM group layers.1.ffn2: fp16 requested, engine layer '/layers_1/ffn_out/MatMul_myl0_15' runs fp32"]
    fp32 = [PlannedGemm(g.node, g.group, "fp32" if g.group == "layers.1.ffn2" else g.precision) for g in EXPECT.gemms]
    assert attest_engine(_load("one_gemm_fp32.json"), EngineExpectation("int8", tuple(fp32), 2, True))


def test_a_float_engine_without_a_table_holds_every_gemm_to_its_precision() -> None:
    att = attest_engine(_load("one_gemm_fp32.json"), EngineExpectation("fp16", (), 2, True))
    assert [v.split(",")[0] for v in att.violations] == ["GEMM group /layers_1/ffn_out/MatMul_myl0_15: fp16 requested"]
    assert not attest_engine(_load("all_int8.json"), EngineExpectation("int8", (), 2, True)).groups  # 8-bit without a table: counted only


def test_an_engine_whose_layers_name_no_planned_gemm_is_not_a_pass() -> None:
    renamed = [PlannedGemm(f"other_{g.node}", g.group, g.precision) for g in EXPECT.gemms]
    att = attest_engine(_load("all_int8.json"), EngineExpectation("int8", tuple(renamed), 2, True))
    assert not att and att.groups == [] and len(att.unlocated_gemms) == 12
    assert att.violations[0].startswith("none of the 12 planned GEMMs is named by the metadata of the engine's 8 GEMM layer(s)")
    partly = attest_engine(_load("all_int8.json"), EngineExpectation("int8", (*EXPECT.gemms, PlannedGemm("node_MatMul_99", "head", "int8")), 2, True))
    assert partly and partly.unlocated_gemms == ["node_MatMul_99"] and "(1 planned GEMMs not in the layers' metadata)" in partly.describe()


def test_tensorrt_11_spelling_reads_the_same() -> None:
    """11.x splits Format/Datatype into Format and DataType and replaces Bindings by I/O Tensors."""
    info = copy.deepcopy(_load("one_gemm_fp32.json"))
    for layer in info["Layers"]:
        for tensor in layer["Inputs"] + layer["Outputs"]:
            tensor["DataType"] = tensor.pop("Format/Datatype")
            tensor["Format"] = "Row major linear FP32 format (kLINEAR)"  # a format word must not decide the type
    info["I/O Tensors"] = [{"Name": n, "IOMode": "Input", "DataType": "Int32"} for n in info.pop("Bindings")]
    assert attest_engine(info, EXPECT).to_dict() == attest_engine(_load("one_gemm_fp32.json"), EXPECT).to_dict()


def test_layer_precision_reads_tactics_then_types() -> None:
    assert layer_precision({"TacticName": "sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32", "Inputs": [{"Format/Datatype": "Half"}]}) == "fp8"
    assert layer_precision({"TacticName": "sm80_xmma_gemm_bf16bf16_bf16f32_f32", "Inputs": []}) == "bf16"
    assert layer_precision({"Inputs": [{"Format/Datatype": "BFloat16"}]}) == "bf16"  # not "Float"
    assert layer_precision({"Inputs": [{"Format/Datatype": "Row major Int8 format"}]}) == "int8"
    assert layer_precision({"Inputs": [{"Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}]}) == "fp16"
    assert layer_precision({"Inputs": []}) == "unknown"


def test_layer_names_only_json_is_refused() -> None:
    with pytest.raises(ValueError, match="detailed profiling verbosity"):
        read_layers({"Layers": ["node_MatMul_6", "_gemm_mha_v2_myl0_2"], "Bindings": []})
    with pytest.raises(ValueError, match="'Layers' list"):
        read_layers(["not", "an", "inspector", "object"])


def test_attestation_round_trips_and_records_the_override() -> None:
    att = attest_engine(_load("one_gemm_fp32.json"), EXPECT)
    att.allowed_by = "--accept-engine-mismatch"
    back = Attestation.from_dict(json.loads(json.dumps(att.to_dict())))
    assert back == att and back.passed and not back
    assert "accepted by --accept-engine-mismatch" in back.describe()


def test_the_bits_repeated_for_the_device_are_vocab_bits() -> None:
    assert {p: ATTEST_BITS[p] for p in PRECISIONS} == {p: v.bits for p, v in PRECISIONS.items()}


# -- the strict doubles' inspector -------------------------------------------------------------------------


def _engine(trt, verbosity=None):  # type: ignore[no-untyped-def]
    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    network, config = builder.create_network(0), builder.create_builder_config()
    if verbosity is not None:
        config.profiling_verbosity = verbosity
    plan = builder.build_serialized_network(network, config)
    return trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(plan)


@pytest.mark.parametrize("version", manifest_versions())
def test_the_double_returns_detailed_layers_only_when_built_detailed(monkeypatch, version: str) -> None:  # type: ignore[no-untyped-def]
    trt = install(monkeypatch, version, World(inspector=_load("one_gemm_fp32.json")))
    inspector = _engine(trt, trt.ProfilingVerbosity.DETAILED).create_engine_inspector()
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    assert not attest_engine(info, EXPECT)
    assert json.loads(inspector.get_layer_information(0, trt.LayerInformationFormat.JSON)) == info["Layers"][0]
    default = json.loads(_engine(trt).create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
    with pytest.raises(ValueError, match="detailed profiling verbosity"):
        read_layers(default)  # TensorRT's default verbosity lists names only: the build must ask for DETAILED
    assert json.loads(_engine(trt, trt.ProfilingVerbosity.NONE).create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))["Layers"] == []


@pytest.mark.parametrize("version", manifest_versions())
def test_the_double_rejects_inspector_calls_the_release_lacks(monkeypatch, version: str) -> None:  # type: ignore[no-untyped-def]
    trt = install(monkeypatch, version, World(inspector=_load("all_int8.json")))
    inspector = _engine(trt, trt.ProfilingVerbosity.DETAILED).create_engine_inspector()
    with pytest.raises(TypeError, match="LayerInformationFormat"):
        inspector.get_engine_information(trt.ProfilingVerbosity.DETAILED)  # the wrong enum
    with pytest.raises(TypeError, match="missing argument 'format'"):
        inspector.get_layer_information(0)
    with pytest.raises(AttributeError, match="no attribute 'engine'"):
        inspector.engine  # noqa: B018 - 8.x's property; 10.x and 11.x have execution_context only
    with pytest.raises(AttributeError, match="VERBOSE"):
        trt.ProfilingVerbosity.VERBOSE  # noqa: B018 - 8.x's deprecated name for DETAILED
    with pytest.raises(AttributeError, match="no attribute 'get_engine_information_json'"):
        inspector.get_engine_information_json()
    if major_minor(version) < (10, 8):
        with pytest.raises(AttributeError, match="FP4"):
            trt.DataType.FP4  # noqa: B018 - FP4 engines (TensorRT#4590's request) exist from 10.8 on
    else:
        assert trt.DataType.FP4.name == "FP4"
