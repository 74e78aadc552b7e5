"""TensorRT engines: the pure parts here (sidecar, load checks, profiles, fusion detection,
flags per version, preflight), the real builds where TensorRT and a GPU exist.

The ``tensorrt``/``gpu`` tests build fp16 and int8 engines for the default layer, compare
them with eager PyTorch within the default tolerances and check that attention fused.
The build and load sequences themselves run against strict doubles of every supported
TensorRT version in ``test_trt_build_fakes.py``.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from fixtures import eager, feed_for, small_layer

from attn_export.errors import CompatibilityError, EngineError, MissingDependencyError
from attn_export.export import export_onnx
from attn_export.targets.targets import export_spec_for
from attn_export.outdir.manifest import sha256_file
from attn_export.runtime.tensorrt.build import preflight, unfused_warning
from attn_export.runtime.tensorrt.build_plan import plan_build
from attn_export.runtime.tensorrt.runner import check_shape_in_profile, ensure_runnable, load_engine
from attn_export.runtime.tensorrt.sidecar import (
    EngineSidecar,
    check_compatible,
    detect_fused_attention,
    read_sidecar,
    verify_engine_file,
    write_sidecar,
)
from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile
from attn_export.validate import compare_outputs, tolerance_for

PROFILE = ShapeProfile((1, 8), (2, 16), (4, 32))
HAS_TRT = importlib.util.find_spec("tensorrt") is not None


def _engine(tmp_path, payload: bytes = b"\x01engine-bytes" * 64, **kw):  # type: ignore[no-untyped-def]
    path = tmp_path / "model.engine"
    path.write_bytes(payload)
    fields = dict(tensorrt_version="10.3.0.30", gpu_name="Orin", compute_capability="8.7", precision="fp16",
                  strongly_typed=False, builder_flags=["FP16"], profiles={"x": PROFILE.to_dict()}, onnx_sha256="ab" * 32,
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
    with pytest.raises(EngineError, match="not valid JSON"):
        read_sidecar(tmp_path / "a.engine")


def _one_line_error(path, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(EngineError, match=match) as info:
        read_sidecar(path)
    assert "\n" not in str(info.value) and info.value.__cause__ is None, str(info.value)


def test_sidecar_schema_rejects_bad_fields(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    path, sidecar = _engine(tmp_path)
    good = sidecar.to_dict()
    cases = [
        ({"engine_size_bytes": "1234"}, r"engine_size_bytes: Input should be a valid integer"),  # strict: no str -> int
        ({"precision": "fp4"}, r"precision: Input should be 'fp32', 'fp16', 'bf16', 'int8' or 'fp8'"),
        ({"compute_capability": "sm90"}, r"compute_capability: String should match pattern"),
        ({"engine_sha256": "zz"}, r"engine_sha256: String should match pattern"),
        ({"tensorrt_version": "ten"}, r"tensorrt_version: Value error, expected a TensorRT version"),
        ({"profiles": {"x": {"min": [1, "8"]}}}, r"profiles.x.min.1: Input should be a valid integer"),
        ({"strongly_typed": "yes"}, r"strongly_typed: Input should be a valid boolean"),
        ({"gpu": "H200"}, r"gpu: Extra inputs are not permitted"),
        ({"schema": 99}, r"schema 99, newer than this attn-export"),
    ]
    for change, match in cases:
        sidecar_path = tmp_path / "model.engine.json"
        sidecar_path.write_text(json.dumps({**good, **change}))
        _one_line_error(path, match)
    sidecar_path.write_text(json.dumps({k: v for k, v in good.items() if k != "gpu_name"}))
    _one_line_error(path, r"gpu_name: Field required")
    sidecar_path.write_text("[1, 2]")
    _one_line_error(path, r"not a valid engine sidecar: <top level>: Input should be a valid dictionary")
    sidecar_path.write_bytes(b'{"gpu_name": "\xff\xfe"}')
    _one_line_error(path, r"is not UTF-8 text \(byte 0xff at offset 14\)")
    sidecar_path.write_bytes(json.dumps(good).encode()[:40])
    _one_line_error(path, r"not valid JSON \(Unterminated string")


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
def test_tensorrt_missing_names_the_package(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import sys

    monkeypatch.setitem(sys.modules, "tensorrt", None)  # absent, even after a test imported the bindings against the stub library
    path, _ = _engine(tmp_path)
    with pytest.raises(MissingDependencyError, match=r"pip install tensorrt \(or pip install 'attn-export\[gpu\]'\)"):
        load_engine(path)
    from attn_export.runtime.tensorrt.build import build_engine

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
    from attn_export.checks.trt_compat import check_trt_compat

    layer = small_layer("transformer", "none", d_model=24, heads=2)  # head size 12: no fused fp16 MHA
    path = tmp_path / "m.onnx"
    export_onnx(layer, path, export_spec_for("jetson", "fp32"))
    report = check_trt_compat(path, "10.3", PROFILE, "fp16")
    text = unfused_warning(0, 1, ["softmax_0"], report)
    assert "0 fused of 1" in text and "head size 12" in text and "softmax_0" in text


# --- with TensorRT and a GPU --------------------------------------------------------------


@pytest.fixture(scope="module")
def trt_gpu():  # type: ignore[no-untyped-def]
    trt = pytest.importorskip("tensorrt", reason="TensorRT is not installed (pip install tensorrt)")
    import torch  # a dependency of the package, not an optional backend

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    try:
        from attn_export.runtime.tensorrt.runner import cudart

        cudart()
    except MissingDependencyError:
        pytest.skip("cuda-python is not installed (pip install cuda-python)")
    return trt


def _build_and_compare(tmp_path, trt, precision: str):  # type: ignore[no-untyped-def]
    from attn_export.runtime.tensorrt import EngineFromPath, TrtRunner, build_engine
    from attn_export.runtime.tensorrt.spec import parse_trt_version

    layer = small_layer("transformer", "padding", d_model=512, heads=8)  # the default layer: head size 64
    from attn_export.checks.trt_attention import trt_attention_form

    new = parse_trt_version(trt.__version__) >= parse_trt_version("10.14")
    target = "tensorrt" if new else "jetson"
    onnx_path = tmp_path / "model.onnx"
    overrides = {}
    if target == "tensorrt":  # IAttention only where it has a fused kernel, as the pipeline exports it
        overrides["attention"] = trt_attention_form(precision, 64, trt.__version__, strongly_typed=True)[0]
    export_onnx(layer, onnx_path, export_spec_for(target, precision, **overrides))
    if precision == "int8":
        from attn_export.compress.calib.data import ActivationSet
        from attn_export.compress.quant.static import quantize_static_onnx

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
    write_sidecar(result.engine_path, sidecar.model_copy(update={"gpu_name": "Some Other GPU", "compute_capability": "7.5"}))
    with pytest.raises(EngineError, match="rebuild it on the target"):
        load_engine(result.engine_path)


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_int8_engine_matches_eager(tmp_path, trt_gpu) -> None:  # type: ignore[no-untyped-def]
    result = _build_and_compare(tmp_path, trt_gpu, "int8")
    assert result.precision == "int8" and np.isfinite(result.build_seconds)


