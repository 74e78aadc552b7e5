"""An fp8 engine gets a sidecar: the sidecar's precision field takes every precision of the
vocabulary an engine is built in (it took fp32/fp16/int8 only, so an fp8 build failed after
TensorRT had built the engine, when the sidecar was written)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from trt_fakes import install, major_minor, manifest_versions

from attn_export.runtime.tensorrt.sidecar import EngineSidecar, read_sidecar
from attn_export.runtime.tensorrt.spec import ENGINE_PRECISIONS, EngineSpec, ShapeProfile

PROFILE = ShapeProfile((1, 8), (2, 16), (4, 32))
# FP8 Q/DQ (FLOAT8E4M3FN zero points) needs opset 19; the fakes of releases from 10.x on parse it
VERSIONS = [v for v in manifest_versions() if major_minor(v) >= (10, 0)]


def _fp8_qdq_graph(path) -> str:  # type: ignore[no-untyped-def]
    s = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    zp = helper.make_tensor("zp", TensorProto.FLOAT8E4M3FN, [], [0.0])
    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "w")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"]), helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"]),
             helper.make_node("MatMul", ["xd", "w"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "q8", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", 8])], initializer=[s, zp, w])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=10), path)
    return str(path)


def test_sidecar_precision_field_takes_every_engine_precision() -> None:
    field = EngineSidecar.model_fields["precision"].annotation
    assert set(field.__args__) == set(ENGINE_PRECISIONS)


@pytest.mark.parametrize("version", VERSIONS)
def test_fp8_engine_build_writes_a_sidecar_that_says_fp8(tmp_path, monkeypatch, version: str) -> None:  # type: ignore[no-untyped-def]
    from attn_export.runtime.tensorrt.build import build_engine

    install(monkeypatch, version)
    engine = tmp_path / "out" / "m.engine"
    result = build_engine(_fp8_qdq_graph(tmp_path / "q8.onnx"), engine, EngineSpec(precision="fp8", profiles=PROFILE))
    assert result.precision == "fp8"
    assert read_sidecar(engine).precision == "fp8"
