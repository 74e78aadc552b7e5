"""trtexec command lines: the exact flags per TensorRT version, precision and option."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from attn_export.errors import ConfigError
from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile
from attn_export.runtime.tensorrt.trtexec import onnx_io_dims, shell_line, trtexec_command

PROFILE = ShapeProfile((1, 16), (8, 128), (32, 512))
INPUTS = {"x": ["batch", "seq", 512], "key_padding_mask": ["batch", "seq"]}
SHAPES = [
    "--minShapes=x:1x16x512,key_padding_mask:1x16",
    "--optShapes=x:8x128x512,key_padding_mask:8x128",
    "--maxShapes=x:32x512x512,key_padding_mask:32x512",
]


def _cmd(spec: EngineSpec, version: str, graph_float: str = "fp32", has_qdq: bool = False) -> list[str]:
    return trtexec_command("model.onnx", "model.engine", spec, version, inputs=INPUTS, graph_float=graph_float, has_qdq=has_qdq)


def test_jetson_fp16_full_line() -> None:
    spec = EngineSpec(precision="fp16", profiles=PROFILE, workspace_bytes=2 << 30, timing_cache="timing.cache")
    assert _cmd(spec, "10.3") == [
        "trtexec", "--onnx=model.onnx", "--saveEngine=model.engine", "--fp16", *SHAPES,
        "--memPoolSize=workspace:2048M", "--timingCacheFile=timing.cache", "--builderOptimizationLevel=3",
        "--profilingVerbosity=detailed", "--exportLayerInfo=model.engine.layers.json", "--skipInference",
    ]


def test_int8_weakly_typed_on_10x() -> None:
    cmd = _cmd(EngineSpec(precision="int8", profiles=PROFILE), "10.3", has_qdq=True)
    assert cmd[3:5] == ["--int8", "--fp16"] and "--stronglyTyped" not in cmd


def test_fp16_graph_is_strongly_typed() -> None:
    cmd = _cmd(EngineSpec(precision="fp16", profiles=PROFILE), "10.14", graph_float="fp16")
    assert "--stronglyTyped" in cmd and "--fp16" not in cmd and "--int8" not in cmd
    cmd = _cmd(EngineSpec(precision="fp16", profiles=PROFILE), "11", graph_float="fp16")
    assert not {"--stronglyTyped", "--fp16", "--int8"} & set(cmd), cmd  # 11.x types every network: "no longer needed"


def test_tensorrt_11_has_no_precision_flags() -> None:
    cmd = _cmd(EngineSpec(precision="int8", profiles=PROFILE), "11.0", has_qdq=True)
    assert not {"--stronglyTyped", "--int8", "--fp16"} & set(cmd), cmd
    with pytest.raises(ConfigError, match=r"TensorRT 11[.0-9]* removed BuilderFlag.FP16"):
        _cmd(EngineSpec(precision="fp16", profiles=PROFILE), "11")


def test_int8_needs_qdq() -> None:
    with pytest.raises(ConfigError, match="int8 engines need Q/DQ"):
        _cmd(EngineSpec(precision="int8", profiles=PROFILE), "10.3")


def test_dla_and_compatibility_flags() -> None:
    static = ShapeProfile((1, 128), (1, 128), (1, 128))
    dla = _cmd(EngineSpec(precision="fp16", profiles=static, dla_core=0, optimization_level=5), "10.3")
    assert "--useDLACore=0" in dla and "--allowGPUFallback" in dla and "--builderOptimizationLevel=5" in dla
    assert "--minShapes=x:1x128x512,key_padding_mask:1x128" in dla
    compat = _cmd(EngineSpec(precision="fp16", profiles=PROFILE, hardware_compatibility="ampere+", version_compatible=True), "10.14")
    assert "--hardwareCompatibilityLevel=ampere+" in compat and "--versionCompatible" in compat
    same = _cmd(EngineSpec(precision="fp16", profiles=PROFILE, hardware_compatibility="same-compute-capability"), "10.14")
    assert "--hardwareCompatibilityLevel=sameComputeCapability" in same
    with pytest.raises(ConfigError, match="needs TensorRT >= 10.9"):
        _cmd(EngineSpec(precision="fp16", profiles=PROFILE, hardware_compatibility="same-compute-capability"), "10.3")


def test_spec_validation() -> None:
    with pytest.raises(ConfigError, match="DLA needs static shapes"):
        EngineSpec(precision="fp16", profiles=PROFILE, dla_core=0)
    with pytest.raises(ConfigError, match="DLA cannot run attention"):
        EngineSpec(precision="fp16", dla_core=0, gpu_fallback=False)
    with pytest.raises(ConfigError, match="min-shape <= --opt-shape"):
        ShapeProfile.parse("8x16", "1x16", "32x16")
    with pytest.raises(ConfigError, match="--max-shape as BATCHxSEQ"):
        ShapeProfile.parse("1x16", "8x128", "32by512")


def test_dynamic_without_profile_is_an_error() -> None:
    with pytest.raises(ConfigError, match="dynamic dims; pass --min-shape"):
        _cmd(EngineSpec(precision="fp16"), "10.3")


def test_reads_inputs_from_onnx(tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = numpy_helper.from_array(np.zeros((8, 8), np.float16), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", "seq", 8])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)], initializer=[w])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    assert onnx_io_dims(path) == ({"x": ["batch", "seq", 8]}, "fp16", False)
    cmd = trtexec_command(path, tmp_path / "m.engine", EngineSpec(precision="fp16", profiles=PROFILE), "10.14")
    assert "--stronglyTyped" in cmd and "--minShapes=x:1x16x8" in cmd
    assert shell_line(["trtexec", "--onnx=a b.onnx"]) == "trtexec '--onnx=a b.onnx'"


# --- every line against the option list of the target's trtexec ---------------------------

import itertools  # noqa: E402

from trt_fakes import TRTEXEC_VERSIONS, trtexec_options, unknown_flags  # noqa: E402


def test_fixtures_record_their_source() -> None:
    for version in TRTEXEC_VERSIONS:
        data = trtexec_options(version)
        src = data["source"]
        assert src["repository"] == "https://github.com/NVIDIA/TensorRT" and src["branch"] == f"release/{version}"
        assert len(src["commit"]) == 40 and src["path"] == "samples/common/sampleOptions.cpp"
        assert {"--onnx", "--saveEngine", "--stronglyTyped", "--timingCacheFile", "--memPoolSize"} <= set(data["options"])
    assert "--fp16" in trtexec_options("10.3")["options"] and "--fp16" not in trtexec_options("11.0")["options"]


def test_a_flag_the_target_lacks_is_caught() -> None:
    assert unknown_flags(["trtexec", "--fp16", "--int8", "--stronglyTyped"], "11.0") == ["--fp16", "--int8"]
    assert unknown_flags(["trtexec", "--hardwareCompatibilityLevel=sameComputeCapability"], "10.3") == ["--hardwareCompatibilityLevel=sameComputeCapability"]
    assert unknown_flags(["trtexec", "--decomposableAttentions=attn"], "10.3") == ["--decomposableAttentions"]


def _specs(version: str):  # type: ignore[no-untyped-def]
    static = ShapeProfile((1, 128), (1, 128), (1, 128))
    for precision, hw, vc, dla, cache, workspace in itertools.product(
        ("fp32", "fp16", "int8"), ("none", "ampere+", "same-compute-capability"), (False, True), (None, 0), (None, "t.cache"), (None, 1 << 30)
    ):
        try:
            spec = EngineSpec(precision=precision, profiles=static if dla is not None else PROFILE, hardware_compatibility=hw,
                              version_compatible=vc, dla_core=dla, timing_cache=cache, workspace_bytes=workspace)
        except ConfigError:
            continue
        yield spec


@pytest.mark.parametrize("version", TRTEXEC_VERSIONS)
def test_every_line_uses_flags_the_target_trtexec_has(version: str) -> None:
    lines = 0
    for spec in _specs(version):
        for graph_float, has_qdq in (("fp32", False), ("fp16", False), ("fp32", True)):
            try:
                cmd = _cmd(spec, version, graph_float=graph_float, has_qdq=has_qdq)
            except ConfigError:
                continue
            lines += 1
            assert unknown_flags(cmd, version) == [], shell_line(cmd)
    assert lines > 50


def test_dla_lines_only_for_a_trtexec_with_dla() -> None:
    static = ShapeProfile((1, 128), (1, 128), (1, 128))
    assert "--useDLACore=0" in _cmd(EngineSpec(precision="fp16", profiles=static, dla_core=0), "10.3")
    for version in ("10.14", "11.0"):
        with pytest.raises(ConfigError, match="--dla-core needs a TensorRT with DLA"):
            _cmd(EngineSpec(precision="fp16", profiles=static, dla_core=0), version, graph_float="fp16")
