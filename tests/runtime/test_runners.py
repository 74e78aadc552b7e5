"""Runners share one interface: eager and ONNX Runtime give the same outputs for the same feed."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures import feed_for, small_layer

from attn_export.errors import ConfigError, MissingDependencyError
from attn_export.export import ExportSpec, export_onnx
from attn_export.runtime import EagerRunner, OrtRunner, Runner, SessionFromOnnx, available_providers
from attn_export.validate import compare_outputs, tolerance_for


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    layer = small_layer("transformer", "padding")
    path = tmp_path_factory.mktemp("rt") / "m.onnx"
    export_onnx(layer, path, ExportSpec())
    return layer, path


def test_runners_are_interchangeable(exported):
    layer, path = exported
    feed = feed_for(layer, 2, 9)
    runners: list[Runner] = [
        EagerRunner(layer, layer.input_names, ["y"]),
        OrtRunner(SessionFromOnnx(path, providers=["cpu"], intra_op_threads=1)),
    ]
    outs = []
    for r in runners:
        with r:
            assert r.input_names == ["x", "key_padding_mask"] and r.output_names == ["y"]
            outs.append(r.infer(feed))
            assert r.last_inference_time is not None and r.last_inference_time > 0
    result = compare_outputs(outs[0], outs[1], tolerance_for("fp32"))
    assert result, str(result)
    assert "PASS" in str(result)


def test_ort_runner_casts_inputs_and_checks_names(exported):
    layer, path = exported
    feed = feed_for(layer, 2, 9)
    feed64 = {"x": feed["x"].astype(np.float64), "key_padding_mask": feed["key_padding_mask"].astype(np.int64)}
    with OrtRunner(SessionFromOnnx(path)) as r:
        np.testing.assert_allclose(r.infer(feed64)["y"], r.infer(feed)["y"], atol=1e-6)
        with pytest.raises(ConfigError, match="missing inputs"):
            r.infer({"x": feed["x"]})


@pytest.mark.skipif("CUDAExecutionProvider" in available_providers(), reason="onnxruntime-gpu is installed")
def test_missing_gpu_provider_is_a_clear_error(exported):
    _, path = exported
    with pytest.raises(MissingDependencyError, match="pip install onnxruntime-gpu"):
        SessionFromOnnx(path, providers=["cuda"])


def test_unknown_provider_and_missing_model(tmp_path):
    with pytest.raises(ConfigError, match="unknown ONNX Runtime provider"):
        SessionFromOnnx(tmp_path / "m.onnx", providers=["FooExecutionProvider"])
    with pytest.raises(ConfigError, match="does not exist"):
        OrtRunner(SessionFromOnnx(tmp_path / "m.onnx")).activate()


def test_provider_options_for_gpu_providers():
    from attn_export.runtime import ProviderSpec

    spec = ProviderSpec(fp16=True, engine_cache_dir="/tmp/cache", workspace_bytes=1 << 30)
    trt = spec.options_for("TensorrtExecutionProvider")
    assert trt["trt_fp16_enable"] is True and trt["trt_engine_cache_enable"] is True
    assert trt["trt_engine_cache_path"] == "/tmp/cache" and trt["trt_max_workspace_size"] == 1 << 30
    assert spec.options_for("CUDAExecutionProvider")["gpu_mem_limit"] == 1 << 30
    assert spec.options_for("CPUExecutionProvider") == {}
