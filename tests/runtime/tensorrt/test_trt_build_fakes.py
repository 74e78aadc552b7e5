"""build_engine, load_engine and TrtRunner against strict doubles of every supported TensorRT.

The doubles (``trt_fakes``) are generated from the manifests of the real bindings, so a
name, keyword or enum member that a version lacks fails here as it would on a GPU. Each
code path runs against every version its target allows: the jetson graph (weakly typed
fp16 on 10.x, strongly typed on 11.x), the tensorrt graph (strongly typed, >= 10.14),
DLA (only where TensorRT has it), hardware and version compatibility, and the failure
modes: a parser error, a build returning None, deserialisation returning None, a timing
cache TensorRT refuses, ``get_timing_cache()`` returning None.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from fixtures import small_layer
from onnx import TensorProto, helper
from trt_fakes import World, install, major_minor, manifest_versions

from attn_export.errors import ConfigError, EngineError
from attn_export.export import export_onnx
from attn_export.targets.targets import export_spec_for
from attn_export.runtime.tensorrt.sidecar import read_sidecar, sidecar_path_for, verify_engine_file
from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile

VERSIONS = manifest_versions()
PROFILE = ShapeProfile((1, 8), (2, 16), (4, 32))
STATIC = ShapeProfile((2, 16), (2, 16), (2, 16))


def _is11(version: str) -> bool:
    return major_minor(version)[0] >= 11


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """jetson: fp32 decomposed (opset 18); tensorrt: fp16 ONNX Attention (opset 23); fp16-decomposed."""
    layer = small_layer("transformer", "padding", d_model=32, heads=2)
    out = {}
    for name, spec in (
        ("jetson", export_spec_for("jetson", "fp16")),
        ("tensorrt", export_spec_for("tensorrt", "fp16")),
        ("fp16-decomposed", export_spec_for("tensorrt", "fp16", attention="decomposed", opset=18)),
    ):
        path = tmp_path_factory.mktemp(name) / "model.onnx"
        export_onnx(layer, path, spec)
        out[name] = str(path)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 4])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "double", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", 4])], initializer=[two])
    path = tmp_path_factory.mktemp("double") / "double.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    out["double"] = str(path)
    return out


def _build(monkeypatch, tmp_path, version: str, onnx_path: str, spec: EngineSpec, world: World | None = None, device: int = 0):  # type: ignore[no-untyped-def]
    from attn_export.runtime.tensorrt.build import build_engine

    trt = install(monkeypatch, version, world)
    result = build_engine(onnx_path, tmp_path / "out" / "m.engine", spec, device=device)
    return trt, result


@pytest.mark.parametrize("version", VERSIONS)
def test_jetson_graph_builds_on_every_version(graphs, tmp_path, monkeypatch, version: str) -> None:  # type: ignore[no-untyped-def]
    """10.x: weakly typed with BuilderFlag.FP16; 11.x: no FP16 flag exists, so fp32 strongly typed."""
    cache = tmp_path / "timing.cache"
    precision = "fp32" if _is11(version) else "fp16"
    spec = EngineSpec(precision=precision, profiles=PROFILE, workspace_bytes=1 << 30, timing_cache=str(cache))
    trt, result = _build(monkeypatch, tmp_path, version, graphs["jetson"], spec)
    world = trt._world
    flags = world.called("create_network")
    if _is11(version):
        assert flags == [1 << 0] and world.called("set_flag") == [] and result.strongly_typed  # STRONGLY_TYPED is 0 on 11.x
    else:
        assert flags == [0] and world.called("set_flag") == ["FP16"] and not result.strongly_typed
    assert world.called("set_memory_pool_limit") == [("WORKSPACE", 1 << 30)]
    assert world.called("add_optimization_profile")[0]["x"] == [[1, 8, 32], [2, 16, 32], [4, 32, 32]]
    assert world.called("IBuilderConfig.builder_optimization_level") == [3]
    assert [v.name for v in world.called("IBuilderConfig.profiling_verbosity")] == ["DETAILED"]
    assert world.called("set_timing_cache") == [{"origin": "fresh", "ignore_mismatch": True}]
    assert json.loads(cache.read_bytes().split(b"\n", 1)[1])["version"] == version  # written back after the build
    sidecar = read_sidecar(result.engine_path)
    assert (sidecar.tensorrt_version, sidecar.gpu_name, sidecar.compute_capability) == (version, "NVIDIA H200", "9.0")
    assert sidecar.profiles["key_padding_mask"]["max"] == [4, 32] and sidecar.input_names == ["x", "key_padding_mask"]
    verify_engine_file(result.engine_path, sidecar)
    assert result.attention_blocks == result.attention_fused == 1 and not result.warnings
    layers = json.loads((tmp_path / "out" / "m.engine.layers.json").read_text())
    assert layers["Layers"][0]["Name"].startswith("_gemm_mha_v2")


@pytest.mark.parametrize("version", [v for v in VERSIONS if major_minor(v) >= (10, 14)])
def test_tensorrt_graph_strongly_typed(graphs, tmp_path, monkeypatch, version: str) -> None:  # type: ignore[no-untyped-def]
    trt, result = _build(monkeypatch, tmp_path, version, graphs["tensorrt"], EngineSpec(precision="fp16", profiles=PROFILE))
    strongly = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    assert trt._world.called("create_network") == [strongly] == [1 if _is11(version) else 2]  # the real enum values
    assert trt._world.called("set_flag") == [] and result.strongly_typed and result.builder_flags == []


@pytest.mark.parametrize("version", VERSIONS)
def test_int8_qdq_flags_per_version(tmp_path, monkeypatch, version: str) -> None:  # type: ignore[no-untyped-def]
    from onnx import numpy_helper

    s = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    zp = numpy_helper.from_array(np.array(0, np.int8), "zp")
    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "w")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"]), helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"]),
             helper.make_node("MatMul", ["xd", "w"], ["y"])]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", 8])], initializer=[s, zp, w])
    path = tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=10), path)
    trt, result = _build(monkeypatch, tmp_path, version, str(path), EngineSpec(precision="int8", profiles=PROFILE))
    assert trt._world.called("set_flag") == ([] if _is11(version) else ["INT8", "FP16"])
    assert result.strongly_typed is _is11(version)


@pytest.mark.parametrize("version", VERSIONS)
def test_dla_only_where_tensorrt_has_it(graphs, tmp_path, monkeypatch, version: str) -> None:  # type: ignore[no-untyped-def]
    """DLA: 10.0-10.7 and 11.4+; 10.8-11.3 have none (NVIDIA's 10.x -> 11.x Jetson migration guide)."""
    graph, precision = (graphs["fp16-decomposed"], "fp16") if _is11(version) else (graphs["jetson"], "fp16")
    spec = EngineSpec(precision=precision, profiles=STATIC, dla_core=1)
    has_dla = major_minor(version) <= (10, 7) or major_minor(version) >= (11, 4)
    if not has_dla:
        with pytest.raises(ConfigError, match=r"--dla-core needs a TensorRT with DLA, got \d+\.\d+.*not in 10.8-11.3"):
            _build(monkeypatch, tmp_path, version, graph, spec)
        return
    trt, result = _build(monkeypatch, tmp_path, version, graph, spec)
    assert "GPU_FALLBACK" in trt._world.called("set_flag")
    assert trt._world.called("IBuilderConfig.default_device_type") == [trt.DeviceType.DLA]
    assert trt._world.called("IBuilderConfig.DLA_core") == [1] and read_sidecar(result.engine_path).dla_core == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_hardware_compatibility_levels(graphs, tmp_path, monkeypatch, version: str) -> None:  # type: ignore[no-untyped-def]
    precision = "fp32" if _is11(version) else "fp16"
    trt, result = _build(monkeypatch, tmp_path, version, graphs["jetson"], EngineSpec(precision=precision, profiles=PROFILE, hardware_compatibility="ampere+"))
    assert [v.name for v in trt._world.called("IBuilderConfig.hardware_compatibility_level")] == ["AMPERE_PLUS"]
    same = EngineSpec(precision=precision, profiles=PROFILE, hardware_compatibility="same-compute-capability")
    if major_minor(version) < (10, 9):
        with pytest.raises(ConfigError, match="needs TensorRT >= 10.9"):
            _build(monkeypatch, tmp_path, version, graphs["jetson"], same)
    else:
        trt, _ = _build(monkeypatch, tmp_path, version, graphs["jetson"], same)
        assert [v.name for v in trt._world.called("IBuilderConfig.hardware_compatibility_level")] == ["SAME_COMPUTE_CAPABILITY"]


@pytest.mark.parametrize("version", VERSIONS)
def test_version_compatible_engine_deserialises_and_loads(graphs, tmp_path, monkeypatch, version: str) -> None:  # type: ignore[no-untyped-def]
    """A version-compatible plan embeds the lean runtime: TensorRT returns None unless host code is allowed."""
    from attn_export.runtime.tensorrt.runner import EngineFromPath, TrtRunner

    precision = "fp32" if _is11(version) else "fp16"
    trt, result = _build(monkeypatch, tmp_path, version, graphs["double"], EngineSpec(precision=precision, profiles=PROFILE, version_compatible=True))
    assert "VERSION_COMPATIBLE" in trt._world.called("set_flag")
    assert trt._world.called("deserialize")[-1]["host_code_allowed"] is True
    assert read_sidecar(result.engine_path).version_compatible
    with TrtRunner(EngineFromPath(result.engine_path)) as runner:
        x = np.arange(2 * 8 * 4, dtype=np.float32).reshape(2, 8, 4)
        np.testing.assert_array_equal(runner.infer({"x": x})["y"], 2 * x)
    assert trt._world.called("deserialize")[-1]["host_code_allowed"] is True


@pytest.mark.parametrize("version", VERSIONS)
def test_runner_on_the_selected_gpu(graphs, tmp_path, monkeypatch, version: str) -> None:  # type: ignore[no-untyped-def]
    """device=1: the build, the sidecar and the runner all use GPU 1 (cudaSetDevice first)."""
    from attn_export.runtime.tensorrt.runner import EngineFromPath, TrtRunner

    world = World()
    precision = "fp32" if _is11(version) else "fp16"
    trt, result = _build(monkeypatch, tmp_path, version, graphs["double"], EngineSpec(precision=precision, profiles=PROFILE), world, device=1)
    assert world.called("build") == [{"device": 1}]
    assert (read_sidecar(result.engine_path).gpu_name, read_sidecar(result.engine_path).compute_capability) == ("NVIDIA L4", "8.9")
    world.current_device = 0  # another process or thread left GPU 0 current
    with TrtRunner(EngineFromPath(result.engine_path, device=1)) as runner:
        assert world.called("deserialize")[-1]["device"] == 1
        assert runner.input_names == ["x"] and runner.output_names == ["y"]
        for shape in ((2, 9, 4), (4, 32, 4), (1, 8, 4)):  # buffers grow and are reused
            x = np.random.default_rng(0).standard_normal(shape)  # float64 in: cast to the engine's float32
            np.testing.assert_array_equal(runner.infer({"x": x})["y"], 2 * x.astype(np.float32))
        with pytest.raises(EngineError, match=r"outside the engine's profile min \(1, 8, 4\) max \(4, 32, 4\)"):
            runner.infer({"x": np.zeros((5, 8, 4), np.float32)})
        with pytest.raises(ConfigError, match="missing inputs"):  # every runner checks its feed the same way
            runner.infer({})
    assert not trt._cudart._memory, "device buffers freed on deactivate"


@pytest.mark.parametrize("io_dtype", ["BF16", "FP8"])
@pytest.mark.parametrize("version", [VERSIONS[0], VERSIONS[-1]])
def test_runner_refuses_bf16_fp8_io_clearly(graphs, tmp_path, monkeypatch, version: str, io_dtype: str) -> None:  # type: ignore[no-untyped-def]
    from attn_export.runtime.tensorrt.runner import EngineFromPath, TrtRunner

    precision = "fp32" if _is11(version) else "fp16"
    _, result = _build(monkeypatch, tmp_path, version, graphs["double"], EngineSpec(precision=precision, profiles=PROFILE), World(io_dtype=io_dtype))
    with pytest.raises(EngineError, match=rf"engine I/O tensor 'x' is {io_dtype}, which has no numpy type.*float32/float16"):
        TrtRunner(EngineFromPath(result.engine_path)).activate()


@pytest.mark.parametrize("version", VERSIONS)
def test_deserialisation_none_writes_nothing(graphs, tmp_path, monkeypatch, version: str) -> None:  # type: ignore[no-untyped-def]
    precision = "fp32" if _is11(version) else "fp16"
    with pytest.raises(EngineError, match="TensorRT could not deserialise the engine just built"):
        _build(monkeypatch, tmp_path, version, graphs["double"], EngineSpec(precision=precision, profiles=PROFILE), World(deserialize_returns_none=True))
    assert not (tmp_path / "out" / "m.engine").exists() and not sidecar_path_for(tmp_path / "out" / "m.engine").exists()


@pytest.mark.parametrize("version", [VERSIONS[0], VERSIONS[-1]])
def test_build_returning_none_and_parser_errors(graphs, tmp_path, monkeypatch, version: str) -> None:  # type: ignore[no-untyped-def]
    precision = "fp32" if _is11(version) else "fp16"
    spec = EngineSpec(precision=precision, profiles=PROFILE)
    with pytest.raises(EngineError, match="TensorRT failed to build"):
        _build(monkeypatch, tmp_path, version, graphs["double"], spec, World(build_returns_none=True))
    world = World(parser_errors=[("/Mul", "Mul", "unsupported broadcast"), ("", "Foo", "no importer")])
    with pytest.raises(EngineError, match=r"rejected .* with 2 error\(s\): /Mul \(Mul\): unsupported broadcast \| node 1 \(Foo\): no importer"):
        _build(monkeypatch, tmp_path, version, graphs["double"], spec, world)


@pytest.mark.parametrize("version", VERSIONS)
def test_timing_cache_refused_or_missing(graphs, tmp_path, monkeypatch, version: str) -> None:  # type: ignore[no-untyped-def]
    """A cache from another TensorRT version, a damaged file, or no cache back: warnings, never a crash."""
    precision = "fp32" if _is11(version) else "fp16"
    cache = tmp_path / "timing.cache"
    spec = EngineSpec(precision=precision, profiles=PROFILE, timing_cache=str(cache))
    old = json.dumps({"device": 0, "entries": 5, "version": "10.0.0"}).encode()
    cache.write_bytes(b"FAKE-TRT-TIMING-CACHE\n" + old)  # recorded by another TensorRT
    trt, result = _build(monkeypatch, tmp_path, version, graphs["double"], spec)
    assert any("refused by this TensorRT" in w and "fresh cache" in w for w in result.warnings), result.warnings
    assert trt._world.called("set_timing_cache") == [{"origin": "file", "ignore_mismatch": True}, {"origin": "fresh", "ignore_mismatch": True}]
    assert json.loads(cache.read_bytes().split(b"\n", 1)[1])["version"] == version  # replaced by this version's cache
    cache.write_bytes(b"\x00garbage")  # damaged: create_timing_cache returns None
    _, result = _build(monkeypatch, tmp_path, version, graphs["double"], spec)
    assert any("refused by this TensorRT" in w for w in result.warnings) and cache.read_bytes().startswith(b"FAKE-TRT-TIMING-CACHE")
    before = cache.read_bytes()
    _, result = _build(monkeypatch, tmp_path, version, graphs["double"], spec, World(timing_cache_none=True))
    assert any("returned no timing cache" in w for w in result.warnings) and cache.read_bytes() == before
    _, result = _build(monkeypatch, tmp_path, version, graphs["double"], spec, World(timing_cache_refused=True))
    assert any("refused" in w for w in result.warnings) and read_sidecar(result.engine_path).tensorrt_version == version


def test_timing_cache_from_another_gpu_is_accepted(graphs, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """ignore_mismatch=True, as trtexec passes: a cache from GPU 1 is used on GPU 0."""
    version = VERSIONS[0]
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"FAKE-TRT-TIMING-CACHE\n" + json.dumps({"device": 1, "entries": 3, "version": version}).encode())
    _, result = _build(monkeypatch, tmp_path, version, graphs["double"], EngineSpec(precision="fp16", profiles=PROFILE, timing_cache=str(cache)))
    assert not result.warnings
    assert json.loads(cache.read_bytes().split(b"\n", 1)[1])["entries"] == 4  # the old entries kept, one more timed


def test_unfused_attention_is_a_warning_with_a_reason(graphs, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _, result = _build(monkeypatch, tmp_path, VERSIONS[0], graphs["jetson"], EngineSpec(precision="fp16", profiles=PROFILE), World(fused_attention=False))
    assert result.attention_fused == 0 and any("not fused" in w and "node_softmax" in w for w in result.warnings)


@pytest.mark.parametrize("version", [VERSIONS[0], "10.14.1.48.post1", VERSIONS[-1]])
def test_length_buckets_build_one_profile_each_and_the_runner_picks_the_smallest(graphs, tmp_path, monkeypatch, version: str) -> None:  # type: ignore[no-untyped-def]
    from attn_export.runtime.tensorrt.runner import EngineFromPath, TrtRunner

    precision = "fp32" if _is11(version) else "fp16"
    spec = EngineSpec(precision=precision, profiles=PROFILE, length_buckets=(16, 24, 32))
    trt, result = _build(monkeypatch, tmp_path, version, graphs["double"], spec)
    world = trt._world
    assert [p["x"] for p in world.called("add_optimization_profile")] == [
        [[1, 8, 4], [2, 16, 4], [4, 16, 4]], [[1, 17, 4], [2, 24, 4], [4, 24, 4]], [[1, 25, 4], [2, 32, 4], [4, 32, 4]]]
    sidecar = read_sidecar(result.engine_path)
    assert [p["x"]["max"] for p in sidecar.all_profiles()] == [[4, 16, 4], [4, 24, 4], [4, 32, 4]]
    assert sidecar.profiles == sidecar.all_profiles()[0]
    with TrtRunner(EngineFromPath(result.engine_path)) as runner:
        for shape, profile in (((2, 20, 4), 1), ((2, 22, 4), 1), ((1, 9, 4), 0), ((4, 32, 4), 2)):
            x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            np.testing.assert_array_equal(runner.infer({"x": x})["y"], 2 * x)
            assert runner.active_profile == profile
        assert world.called("set_optimization_profile_async") == [1, 0, 2]  # a switch only when the profile changes
        with pytest.raises(EngineError, match=r"no optimization profile of the engine holds shapes .*profile 2: x \(1, 25, 4\)\.\.\(4, 32, 4\)"):
            runner.infer({"x": np.zeros((5, 8, 4), np.float32)})


def test_length_buckets_refused_with_dla() -> None:
    with pytest.raises(ConfigError, match="DLA needs one static shape, got --length-buckets"):
        EngineSpec(precision="fp16", profiles=STATIC, length_buckets=(16,), dla_core=0)
