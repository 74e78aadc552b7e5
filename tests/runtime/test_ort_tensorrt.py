"""A new target is data plus one runtime module: ``--target ort-tensorrt`` (ONNX Runtime's TensorRT execution provider).

Every provider option the report tells a deployment to set is one ONNX Runtime documents
(``DOCUMENTED_OPTIONS``, kept with its source); without the TensorRT EP in this onnxruntime build the
artifacts are judged on ONNX Runtime CPU, and the report says so.
"""

from __future__ import annotations

import json

import onnx
import onnxruntime as ort
import pytest
from fixtures import small_layer
from onnx import TensorProto, helper

from attn_export.runtime.artifacts import onnx_runtime_for
from attn_export.config.run import RunConfig
from attn_export.errors import ConfigError
from attn_export.export import export_onnx
from attn_export.targets.targets import export_spec_for, get_target
from attn_export.pipeline.plan import make_plan
from attn_export.runtime.ort import ProviderSpec
from attn_export.runtime.ort_tensorrt import DOCUMENTED_OPTIONS, OPTIONS_SOURCE, deployment_options
from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile

SPEC = EngineSpec(precision="fp16", profiles=ShapeProfile((1, 1), (2, 16), (8, 64)), workspace_bytes=1 << 30)


def _qdq_graph(path) -> str:  # type: ignore[no-untyped-def]
    """x (B, S, 4) -> QuantizeLinear -> DequantizeLinear -> y: a Q/DQ model with dynamic batch and sequence."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", 4])
    inits = [helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]), helper.make_tensor("z", TensorProto.INT8, [], [0])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    onnx.save(helper.make_model(helper.make_graph(nodes, "qdq", [x], [y], inits), opset_imports=[helper.make_opsetid("", 18)]), path)
    return str(path)


def test_the_documented_option_set_keeps_its_source() -> None:
    assert "onnxruntime.ai/docs/execution-providers/TensorRT-ExecutionProvider.html" in OPTIONS_SOURCE
    assert "tensorrt_execution_provider_info.cc" in OPTIONS_SOURCE
    assert {"trt_engine_cache_enable", "trt_engine_cache_path", "trt_fp16_enable", "trt_int8_enable", "trt_max_workspace_size"} <= DOCUMENTED_OPTIONS
    assert "trt_fp8_enable" not in DOCUMENTED_OPTIONS and "trt_int8_calibration_cache" not in DOCUMENTED_OPTIONS  # not real options


def test_every_emitted_option_is_a_documented_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "model.onnx"
    export_onnx(small_layer("transformer", "padding", d_model=32, heads=2), path, export_spec_for("ort-tensorrt", "fp16"))
    for spec, model in ((SPEC, path), (EngineSpec(precision="int8", profiles=SPEC.profiles, hardware_compatibility="ampere+"), _qdq_graph(tmp_path / "q.onnx"))):
        out = deployment_options(model, spec)
        trt = out["provider_options"]["TensorrtExecutionProvider"]
        assert set(trt) <= DOCUMENTED_OPTIONS, set(trt) - DOCUMENTED_OPTIONS
        assert out["providers"] == ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
        assert trt["trt_engine_cache_enable"] and trt["trt_engine_cache_path"] == trt["trt_timing_cache_path"] == "trt_cache"
    # the runner's own TensorRT EP options (runtime/ort.py) are held to the same set
    assert set(ProviderSpec(fp16=True, engine_cache_dir="c", workspace_bytes=1 << 30).options_for("TensorrtExecutionProvider")) <= DOCUMENTED_OPTIONS


def test_fp16_float_graph_and_int8_qdq_graph_get_their_flags(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "model.onnx"
    export_onnx(small_layer("transformer", "padding", d_model=32, heads=2), path, export_spec_for("ort-tensorrt", "fp16"))
    fp16 = deployment_options(path, SPEC)["provider_options"]["TensorrtExecutionProvider"]
    assert fp16["trt_fp16_enable"] is True and fp16["trt_int8_enable"] is False and fp16["trt_max_workspace_size"] == 1 << 30
    assert fp16["trt_profile_min_shapes"] == "x:1x1x32,key_padding_mask:1x1" and fp16["trt_profile_max_shapes"] == "x:8x64x32,key_padding_mask:8x64"
    out = deployment_options(_qdq_graph(tmp_path / "q.onnx"), EngineSpec(precision="int8", profiles=SPEC.profiles))
    int8 = out["provider_options"]["TensorrtExecutionProvider"]
    assert int8["trt_int8_enable"] is True and "trt_int8_calibration_table_name" not in int8  # ORT: no table for a Q/DQ model
    assert "Q/DQ" in out["why"]["trt_int8_enable"] and int8["trt_profile_opt_shapes"] == "x:2x16x4"


def test_the_target_is_a_row_whose_route_policy_is_enforced() -> None:
    t = get_target("ort-tensorrt")
    assert t.providers[0] == "TensorrtExecutionProvider" and t.runtime == "onnxruntime" and t.explicit_quantization
    assert str(max(t.trt_releases)) == "10.9" and "sm87" not in t.gpu_archs and "sm90" in t.gpu_archs
    plan = make_plan(RunConfig(target="ort-tensorrt", quantize="int8"))
    assert plan.selections[0].candidates == ("int8-static",) and [d.kind for d in plan.deploy] == ["trt-check", "session-options"]
    with pytest.raises(ConfigError, match="ort-tensorrt target's route policy ships int8 by static only.*use --int8-mode static"):
        RunConfig(target="ort-tensorrt", quantize="int8", int8_mode="dynamic")
    with pytest.raises(ConfigError, match="ort-tensorrt target's route policy ships no fp8.*use --target tensorrt or jetson"):
        RunConfig(target="ort-tensorrt", quantize="fp8", gpu_arch="sm90")


def test_without_the_tensorrt_ep_the_artifacts_are_judged_on_a_named_stand_in() -> None:
    choice = onnx_runtime_for(get_target("ort-tensorrt"), qdq_reference=True)
    if "TensorrtExecutionProvider" in ort.get_available_providers():  # onnxruntime-gpu with TensorRT: the EP itself
        assert choice.providers[0] == "TensorrtExecutionProvider" and choice.stand_in is None
    else:
        assert choice.providers[-1] == "CPUExecutionProvider" and "TensorrtExecutionProvider is not in this onnxruntime build" in str(choice.stand_in)
        assert choice.record()["qdq"].startswith("reference Q/DQ arithmetic")  # explicit quantization, not ORT CPU's int8 kernels


def test_a_run_writes_the_session_options_into_the_report(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from attn_export.cli import main

    out = tmp_path / "run"
    code = main(["--d-model", "32", "--heads", "2", "--target", "ort-tensorrt", "--repeats", "1", "--warmup", "0", "--threads", "1",
                 "--quiet", "--out", str(out)])  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    assert code == 0 and report["verdict"]["passed"], report["verdict"]
    deployed = report["selection"]["deploy"]
    options = deployed["session_options"]["provider_options"]["TensorrtExecutionProvider"]
    assert set(options) <= DOCUMENTED_OPTIONS and options["trt_fp16_enable"] is False and deployed["trt_check"]["passed"]
    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        assert any(n.startswith("stand-in: ort-tensorrt artifacts were validated on ONNX Runtime's CPUExecutionProvider") for n in report["notes"])


def test_the_options_say_the_eps_engines_are_not_attested(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """No documented EP option sets the builder's profiling verbosity, so the report says why this target is not attested."""
    assert not {o for o in DOCUMENTED_OPTIONS if "verbosity" in o or "inspector" in o or o.endswith("_profiling")}
    out = deployment_options(_qdq_graph(tmp_path / "q.onnx"), EngineSpec(precision="int8", profiles=SPEC.profiles))
    assert out["attestation"].startswith("not attested: ONNX Runtime's TensorRT EP builds its engines inside the session")
