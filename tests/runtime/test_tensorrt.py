"""TensorRT engines: the pure parts here (sidecar, load checks, profiles, fusion detection,
flags per version, preflight), the real builds where TensorRT and a GPU exist.

The ``tensorrt``/``gpu`` tests build fp16 and int8 engines for the default layer, compare
them with eager PyTorch within the default tolerances and check that attention fused.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest
from fixtures import eager, feed_for, small_layer

from attn_export.errors import CompatibilityError, ConfigError, EngineError, MissingDependencyError
from attn_export.export import export_onnx
from attn_export.export.targets import export_spec_for
from attn_export.runtime.trt_build import preflight, unfused_warning
from attn_export.runtime.trt_runner import check_shape_in_profile, ensure_runnable, load_engine
from attn_export.runtime.trt_sidecar import (
    EngineSidecar,
    check_compatible,
    detect_fused_attention,
    read_sidecar,
    sha256_file,
    verify_engine_file,
    write_sidecar,
)
from attn_export.runtime.trt_spec import EngineSpec, ShapeProfile, plan_build
from attn_export.validate import compare_outputs, tolerance_for

PROFILE = ShapeProfile((1, 8), (2, 16), (4, 32))
HAS_TRT = importlib.util.find_spec("tensorrt") is not None


def _engine(tmp_path, payload: bytes = b"\x01engine-bytes" * 64, **kw):  # type: ignore[no-untyped-def]
    path = tmp_path / "model.engine"
    path.write_bytes(payload)
    fields = dict(tensorrt_version="10.3.0.30", gpu_name="Orin", compute_capability="8.7", precision="fp16",
                  strongly_typed=False, builder_flags=["FP16"], profiles={"x": PROFILE.to_dict()}, onnx_sha256="ab",
                  engine_sha256=sha256_file(path), engine_size_bytes=len(payload))
    fields.update(kw)
    sidecar = EngineSidecar(**fields)
    write_sidecar(path, sidecar)
    return path, sidecar


def test_sidecar_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path, sidecar = _engine(tmp_path)
    assert read_sidecar(path) == sidecar
    verify_engine_file(path, sidecar)


def test_missing_or_malformed_sidecar(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a.engine").write_bytes(b"x")
    with pytest.raises(EngineError, match="no sidecar .*rebuild it with attn-export"):
        read_sidecar(tmp_path / "a.engine")
    (tmp_path / "a.engine.json").write_text("{not json")
    with pytest.raises(EngineError, match="not a valid engine sidecar"):
        read_sidecar(tmp_path / "a.engine")


def test_truncated_engine_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path, sidecar = _engine(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(EngineError, match="truncated"):
        verify_engine_file(path, sidecar)
    path.write_bytes(bytes(reversed(data)))
    with pytest.raises(EngineError, match="sha256"):
        verify_engine_file(path, sidecar)


def test_engine_for_another_gpu_or_version(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path, sidecar = _engine(tmp_path)
    assert check_compatible(sidecar, "10.3.0.30", "Orin", "8.7") == []
    with pytest.raises(EngineError, match=r"built for Orin \(sm 8.7\), running on NVIDIA H200 \(sm 9.0\).*rebuild it on the target"):
        ensure_runnable(path, sidecar, "10.3.0.30", "NVIDIA H200", "9.0")
    with pytest.raises(EngineError, match="built with TensorRT 10.3.0.30, running 10.14.1.48.*rebuild"):
        ensure_runnable(path, sidecar, "10.14.1.48", "Orin", "8.7")
    assert any("different GPU model" in p for p in check_compatible(sidecar, "10.3.0.30", "AGX Orin 64GB", "8.7"))


def test_compatibility_levels(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, amp = _engine(tmp_path, gpu_name="A100", compute_capability="8.0", hardware_compatibility="ampere+")
    assert check_compatible(amp, "10.3.0.30", "H200", "9.0") == []
    assert check_compatible(amp, "10.3.0.30", "T4", "7.5")
    _, same = _engine(tmp_path, gpu_name="L4", compute_capability="8.9", hardware_compatibility="same-compute-capability")
    assert check_compatible(same, "10.3.0.30", "RTX 4090", "8.9") == []
    _, vc = _engine(tmp_path, tensorrt_version="10.14.1", version_compatible=True)
    assert check_compatible(vc, "10.15.0", "Orin", "8.7") == [] and check_compatible(vc, "10.13.0", "Orin", "8.7")


def test_shape_outside_profile() -> None:
    check_shape_in_profile("x", (2, 16, 32), (1, 8, 32), (4, 32, 32))
    with pytest.raises(EngineError, match=r"input 'x' shape \(8, 16, 32\) is outside the engine's profile min \(1, 8, 32\) max \(4, 32, 32\)"):
        check_shape_in_profile("x", (8, 16, 32), (1, 8, 32), (4, 32, 32))


@pytest.mark.skipif(HAS_TRT, reason="TensorRT is installed here")
def test_tensorrt_missing_names_the_package(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path, _ = _engine(tmp_path)
    with pytest.raises(MissingDependencyError, match=r"pip install tensorrt \(or pip install 'attn-export\[gpu\]'\)"):
        load_engine(path)
    from attn_export.runtime.trt_build import build_engine

    with pytest.raises(MissingDependencyError, match="TensorRT is not installed"):
        build_engine(tmp_path / "m.onnx", tmp_path / "m.engine", EngineSpec())


def test_detect_fused_attention() -> None:
    detailed = {"Layers": [
        {"Name": "/layer/self_attn/w_qkv/MatMul", "LayerType": "CaskGemmMatrixMultiply", "TacticName": "sm90_xmma_gemm"},
        {"Name": "_gemm_mha_v2_myl3_6", "LayerType": "kgen", "TacticName": ""},
        {"Name": "__myl_MoveReshTran_myl3_7", "LayerType": "kgen", "TacticName": ""},
    ]}
    fused = detect_fused_attention(detailed, expected_blocks=1)
    assert fused.fused_layers == ["_gemm_mha_v2_myl3_6"] and fused.all_fused
    unfused = detect_fused_attention({"Layers": ["/MatMul", "node_softmax", "/MatMul_1"]}, expected_blocks=1)
    assert unfused.fused == 0 and unfused.softmax_layers == ["node_softmax"] and not unfused.all_fused
    assert detect_fused_attention({"Layers": []}, expected_blocks=0).all_fused


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    layer = small_layer("transformer", "padding", d_model=32, heads=2)
    out = {}
    for target in ("jetson", "tensorrt"):
        path = tmp_path_factory.mktemp(target) / "model.onnx"
        export_onnx(layer, path, export_spec_for(target, "fp16"))
        out[target] = str(path)
    return out


def test_preflight_plans_per_version(exports: dict[str, str]) -> None:
    jet = preflight(exports["jetson"], EngineSpec(precision="fp16", profiles=PROFILE), "10.3.0.30")
    assert jet.plan.builder_flags == ("FP16",) and not jet.plan.strongly_typed and jet.attention_blocks == 1
    trt = preflight(exports["tensorrt"], EngineSpec(precision="fp16", profiles=PROFILE), "10.14.1")
    assert trt.plan.strongly_typed and trt.plan.builder_flags == () and trt.attention_blocks == 1
    with pytest.raises(CompatibilityError, match="cannot be built with TensorRT 10.3"):
        preflight(exports["tensorrt"], EngineSpec(precision="fp16", profiles=PROFILE), "10.3.0.30")
    assert plan_build(EngineSpec(precision="fp16", dla_core=0, profiles=ShapeProfile((1, 8), (1, 8), (1, 8))), "10.3", "fp32", False).builder_flags == ("FP16", "GPU_FALLBACK")


def test_unfused_warning_gives_reason(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from onnx import TensorProto, helper

    from attn_export.export.trt_compat import check_trt_compat

    qkv = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, ["B", 2, "L", 12]) for n in "qkv"]
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], name="attn", softmax_precision=1)
    graph = helper.make_graph([node], "g", qkv, [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)])
    report = check_trt_compat(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10), "10.14")
    text = unfused_warning(0, 1, ["softmax_0"], report)
    assert "0 fused of 1" in text and "head size 12" in text and "softmax_0" in text


# --- with TensorRT and a GPU --------------------------------------------------------------


@pytest.fixture(scope="module")
def trt_gpu():  # type: ignore[no-untyped-def]
    trt = pytest.importorskip("tensorrt", reason="TensorRT is not installed (pip install tensorrt)")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    try:
        from attn_export.runtime.trt_runner import cudart

        cudart()
    except MissingDependencyError:
        pytest.skip("cuda-python is not installed (pip install cuda-python)")
    return trt


def _build_and_compare(tmp_path, trt, precision: str):  # type: ignore[no-untyped-def]
    from attn_export.runtime.tensorrt import EngineFromPath, TrtRunner, build_engine
    from attn_export.runtime.trt_spec import parse_trt_version

    layer = small_layer("transformer", "padding", d_model=512, heads=8)  # the default layer: head size 64
    new = parse_trt_version(trt.__version__) >= parse_trt_version("10.14")
    target = "tensorrt" if new else "jetson"
    onnx_path = tmp_path / "model.onnx"
    export_onnx(layer, onnx_path, export_spec_for(target, precision))
    if precision == "int8":
        from attn_export.compress.calib_data import ActivationSet
        from attn_export.compress.quant_static import quantize_static_onnx

        calib = feed_for(layer, 16, 64, seed=1, d_model=512)
        q_path = tmp_path / "int8.onnx"
        quantize_static_onnx(onnx_path, q_path, ActivationSet(calib["x"], calib["key_padding_mask"]))
        onnx_path = q_path
    spec = EngineSpec(precision=precision, profiles=ShapeProfile((1, 16), (4, 64), (8, 128)), timing_cache=str(tmp_path / "timing.cache"),
                      strongly_typed=True if target == "tensorrt" else None)
    result = build_engine(onnx_path, tmp_path / "model.engine", spec)
    feed = feed_for(layer, 4, 64, seed=2, d_model=512)
    with TrtRunner(EngineFromPath(result.engine_path)) as runner:
        out = runner.infer(feed)
        with pytest.raises(EngineError, match="outside the engine's profile"):
            runner.infer(feed_for(layer, 16, 64, seed=3, d_model=512))
    comparison = compare_outputs({"y": eager(layer, feed)}, out, tolerance_for(precision))
    assert comparison, str(comparison)
    return result


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_fp16_engine_matches_eager_and_fuses(tmp_path, trt_gpu) -> None:  # type: ignore[no-untyped-def]
    result = _build_and_compare(tmp_path, trt_gpu, "fp16")
    assert result.attention_fused >= result.attention_blocks == 1, result.warnings
    sidecar = read_sidecar(result.engine_path)
    assert sidecar.tensorrt_version == trt_gpu.__version__ and sidecar.precision == "fp16"
    write_sidecar(result.engine_path, dataclasses.replace(sidecar, gpu_name="Some Other GPU", compute_capability="7.5"))
    with pytest.raises(EngineError, match="rebuild it on the target"):
        load_engine(result.engine_path)


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_int8_engine_matches_eager(tmp_path, trt_gpu) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("attn_export.compress.quant_static", reason="the static Q/DQ quantizer is not available")
    result = _build_and_compare(tmp_path, trt_gpu, "int8")
    assert result.precision == "int8" and np.isfinite(result.build_seconds)


# --- the build sequence against a recording stand-in of the TensorRT Python API ----------


class _Rec:
    """Stand-in for the TensorRT objects build_engine touches; records what it is asked."""

    def __init__(self, **kw) -> None:  # type: ignore[no-untyped-def]
        self.__dict__.update(kw)


def _fake_trt(calls: dict, fused: bool):  # type: ignore[no-untyped-def]
    import enum
    import json
    import types

    class Flag(enum.IntEnum):
        FP16 = 0
        INT8 = 1
        GPU_FALLBACK = 2
        VERSION_COMPATIBLE = 3

    class Tensor:
        def __init__(self, name: str, shape: tuple) -> None:
            self.name, self.shape = name, shape

    class Network:
        num_inputs, num_outputs = 2, 1

        def get_input(self, i: int) -> Tensor:
            return [Tensor("x", (-1, -1, 32)), Tensor("key_padding_mask", (-1, -1))][i]

        def get_output(self, i: int) -> Tensor:
            return Tensor("y", (-1, -1, 32))

    class Config:
        def __init__(self) -> None:
            self.flags: list = []

        def set_flag(self, f) -> None:  # type: ignore[no-untyped-def]
            self.flags.append(f.name)
            calls["flags"] = self.flags

        def set_memory_pool_limit(self, pool, size) -> None:  # type: ignore[no-untyped-def]
            calls["workspace"] = size

        def add_optimization_profile(self, p) -> None:  # type: ignore[no-untyped-def]
            calls["profile"] = p.shapes

        def create_timing_cache(self, blob: bytes):  # type: ignore[no-untyped-def]
            calls["cache_in"] = blob
            return _Rec(serialize=lambda: b"cache-v2")

        def set_timing_cache(self, cache, ignore_mismatch: bool) -> bool:  # type: ignore[no-untyped-def]
            self.cache = cache
            return True

        def get_timing_cache(self):  # type: ignore[no-untyped-def]
            return self.cache

    class Profile:
        def __init__(self) -> None:
            self.shapes: dict = {}

        def set_shape(self, name, mn, opt, mx) -> None:  # type: ignore[no-untyped-def]
            self.shapes[name] = (mn, opt, mx)

    class Builder:
        def __init__(self, logger) -> None:  # type: ignore[no-untyped-def]
            pass

        def create_network(self, flags: int) -> Network:
            calls["network_flags"] = flags
            return Network()

        def create_builder_config(self) -> Config:
            return Config()

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network, config) -> bytes:  # type: ignore[no-untyped-def]
            return b"serialized-engine"

    class Logger:
        WARNING = 0

        def __init__(self, level: int = 0) -> None:
            self.level = level

    layers = [{"Name": "_gemm_mha_v2_myl0_1" if fused else "node_softmax", "LayerType": "kgen", "TacticName": ""}]
    inspector = _Rec(get_engine_information=lambda fmt: json.dumps({"Layers": layers, "Bindings": ["x", "key_padding_mask", "y"]}))
    engine = _Rec(create_engine_inspector=lambda: inspector)
    trt = types.SimpleNamespace(
        __version__="10.3.0.30", Logger=Logger, Builder=Builder, BuilderFlag=Flag, NetworkDefinitionCreationFlag=types.SimpleNamespace(STRONGLY_TYPED=0),
        OnnxParser=lambda network, logger: _Rec(parse_from_file=lambda path: True, num_errors=0),
        MemoryPoolType=types.SimpleNamespace(WORKSPACE="workspace"), ProfilingVerbosity=types.SimpleNamespace(DETAILED="detailed"),
        LayerInformationFormat=types.SimpleNamespace(JSON="json"), DeviceType=types.SimpleNamespace(DLA="dla"),
        HardwareCompatibilityLevel=types.SimpleNamespace(AMPERE_PLUS="ampere+"),
        Runtime=lambda logger: _Rec(deserialize_cuda_engine=lambda blob: engine),
    )
    return trt


@pytest.mark.parametrize("fused", [True, False])
def test_build_sequence_with_stand_in(exports, tmp_path, monkeypatch, fused: bool) -> None:  # type: ignore[no-untyped-def]
    import sys

    import attn_export.runtime.trt_build as trt_build

    calls: dict = {}
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_trt(calls, fused))
    monkeypatch.setattr(trt_build, "gpu_identity", lambda device=0: ("Orin", "8.7"))
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"cache-v1")
    spec = EngineSpec(precision="fp16", profiles=PROFILE, workspace_bytes=1 << 30, timing_cache=str(cache))
    result = trt_build.build_engine(exports["jetson"], tmp_path / "out" / "m.engine", spec)
    assert calls["network_flags"] == 0 and calls["flags"] == ["FP16"] and calls["workspace"] == 1 << 30
    assert calls["profile"]["x"] == ((1, 8, 32), (2, 16, 32), (4, 32, 32)) and calls["cache_in"] == b"cache-v1"
    assert cache.read_bytes() == b"cache-v2" and (tmp_path / "out" / "m.engine").read_bytes() == b"serialized-engine"
    sidecar = read_sidecar(result.engine_path)
    assert (sidecar.gpu_name, sidecar.compute_capability, sidecar.tensorrt_version) == ("Orin", "8.7", "10.3.0.30")
    assert sidecar.profiles["key_padding_mask"]["max"] == [4, 32] and sidecar.builder_flags == ["FP16"]
    verify_engine_file(result.engine_path, sidecar)
    assert result.attention_blocks == 1 and (result.attention_fused == 1) is fused
    assert bool(result.warnings) is not fused and all("not fused" in w for w in result.warnings)


def test_runner_buffers_with_stand_in(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """TrtRunner's shapes, buffers and copies, with host memory standing in for the GPU (y = 2x)."""
    import ctypes
    import sys
    import types

    import attn_export.runtime.trt_runner as trt_runner
    from attn_export.runtime.trt_runner import TrtRunner

    memory: dict[int, ctypes.Array] = {}

    def malloc(n: int):  # type: ignore[no-untyped-def]
        buf = ctypes.create_string_buffer(n)
        memory[ctypes.addressof(buf)] = buf
        return 0, ctypes.addressof(buf)

    def memcpy(dst: int, src: int, n: int, kind, stream):  # type: ignore[no-untyped-def]
        ctypes.memmove(dst, src, n)
        return (0,)

    rt = types.SimpleNamespace(
        cudaError_t=types.SimpleNamespace(cudaSuccess=0), cudaMalloc=malloc, cudaFree=lambda p: (memory.pop(p, None) and 0,),
        cudaMemcpyKind=types.SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2), cudaMemcpyAsync=memcpy,
        cudaStreamCreate=lambda: (0, 7), cudaStreamSynchronize=lambda s: (0,), cudaStreamDestroy=lambda s: (0,),
    )

    class Context:
        def __init__(self) -> None:
            self.shape, self.addr = None, {}

        def set_input_shape(self, name, shape) -> bool:  # type: ignore[no-untyped-def]
            self.shape = tuple(shape)
            return True

        def get_tensor_shape(self, name):  # type: ignore[no-untyped-def]
            return self.shape

        def set_tensor_address(self, name, ptr) -> None:  # type: ignore[no-untyped-def]
            self.addr[name] = ptr

        def execute_async_v3(self, stream_handle: int) -> bool:
            n = int(np.prod(self.shape))
            x = np.frombuffer((ctypes.c_float * n).from_address(self.addr["x"]), np.float32)
            np.frombuffer((ctypes.c_float * n).from_address(self.addr["y"]), np.float32)[:] = 2 * x
            return stream_handle == 7

    engine = types.SimpleNamespace(
        num_io_tensors=2, get_tensor_name=lambda i: ["x", "y"][i], get_tensor_mode=lambda n: "in" if n == "x" else "out",
        get_tensor_dtype=lambda n: "f32", get_tensor_shape=lambda n: (-1, -1, 4),
        get_tensor_profile_shape=lambda n, p: [(1, 1, 4), (2, 2, 4), (4, 8, 4)], create_execution_context=Context,
    )
    fake_trt = types.SimpleNamespace(TensorIOMode=types.SimpleNamespace(INPUT="in"), nptype=lambda t: np.float32)
    monkeypatch.setitem(sys.modules, "tensorrt", fake_trt)
    monkeypatch.setattr(trt_runner, "cudart", lambda: rt)
    with TrtRunner(engine) as runner:
        assert runner.input_names == ["x"] and runner.output_names == ["y"]
        for shape in ((2, 3, 4), (4, 8, 4), (1, 1, 4)):  # grows and reuses buffers
            x = np.random.default_rng(0).standard_normal(shape)  # float64 in: cast to the engine's float32
            np.testing.assert_array_equal(runner.infer({"x": x})["y"], 2 * x.astype(np.float32))
        with pytest.raises(EngineError, match=r"outside the engine's profile min \(1, 1, 4\) max \(4, 8, 4\)"):
            runner.infer({"x": np.zeros((5, 8, 4), np.float32)})
        with pytest.raises(ConfigError, match="missing inputs"):  # every runner checks feeds the same way
            runner.infer({})
        import torch

        t = torch.ones(2, 2, 4)
        np.testing.assert_array_equal(runner.infer({"x": t})["y"], np.full((2, 2, 4), 2, np.float32))
    assert not memory, "device buffers freed on deactivate"
