"""Targets: each one fixes opset, attention form and how fp16/int8 are expressed.

The fp16 tests export real graphs and check the precision islands per target: on
``tensorrt`` the graph is fp16 with LayerNorm in fp32 and the softmax inside IAttention in
fp32 (softmax_precision=FLOAT); on ``jetson`` the graph stays fp32 and fp16 is a build flag.
"""

from __future__ import annotations

import onnx
import pytest
from fixtures import small_layer

from attn_export.errors import ConfigError
from attn_export.export import export_onnx, summarize_graph
from attn_export.targets.targets import DEFAULT_TARGET, TARGETS, export_spec_for, get_target
from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile
from attn_export.runtime.tensorrt.trtexec import trtexec_command


def test_every_row_is_consistent_data() -> None:
    """The columns the pipeline reads instead of a target's name: each row's values are ones the tables know."""
    from attn_export.targets.gpu_arch import ARCHS
    from attn_export.targets.trt_releases import parse_trt_version

    for t in TARGETS.values():
        assert all(a in ARCHS for a in t.gpu_archs) and t.providers[-1] == "CPUExecutionProvider", t.name
        assert (t.trt_version is None) == (not t.trt_releases), t.name
        if t.trt_version is not None:
            assert parse_trt_version(t.trt_version) in t.trt_releases and t.gpu_archs, t.name
        assert all(route for p in t.route_preference for route in t.routes(p)), t.name
        assert bool(t.emulation) == (t.runtime == "tensorrt"), t.name  # ONNX Runtime only emulates TensorRT itself


@pytest.mark.parametrize(
    ("options", "expect"),
    [
        ({"target": "ort-cpu", "quantize": "fp8"}, "the ort-cpu target's route policy ships no fp8; FP8 Q/DQ runs on TensorRT .*; use --target tensorrt or jetson"),
        ({"target": "tensorrt", "quantize": "int8", "int8_mode": "weight-only"}, "ships int8 by static only; .*MatMulNBits.*; use --int8-mode static"),
        ({"target": "tensorrt", "gpu_arch": "sm87"}, "--target tensorrt does not cover --gpu-arch sm87 .*; use --target jetson"),
        ({"target": "ort-cuda", "trt_version": "10.3"}, "--trt-version applies to TensorRT targets; use --target tensorrt or jetson or ort-tensorrt"),
        ({"target": "tensorrt", "bundle": "b"}, "--bundle writes a Jetson bundle; add --target jetson"),
    ],
)
def test_a_flag_the_row_does_not_cover_is_one_line_from_the_row(options: dict[str, object], expect: str) -> None:
    from attn_export.config.run import RunConfig

    with pytest.raises(ConfigError, match=expect) as err:
        RunConfig(**options)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


def test_table_choices() -> None:
    assert {"ort-cpu", "ort-cuda", "tensorrt", "jetson"} <= set(TARGETS) and DEFAULT_TARGET == "ort-cpu"
    trt, jet = get_target("tensorrt"), get_target("jetson")
    assert (trt.opset, trt.attention, trt.fp16_mode, trt.int8_mode) == (23, "onnx-attention", "graph", "qdq-strong")
    assert (jet.opset, jet.attention, jet.fp16_mode, jet.int8_mode) == (18, "decomposed", "builder-flag", "qdq+flag")
    assert jet.opset <= 20 and jet.trt_version == "10.3" and trt.trt_version == "10.14"
    assert get_target("ort-cuda").attention == "ort-contrib" and get_target("ort-cpu").trt_version is None
    assert trt.strongly_typed and not jet.strongly_typed


def test_unknown_target_lists_choices() -> None:
    with pytest.raises(ConfigError, match="unknown --target 'tensorrt-11'.*ort-cpu, ort-cuda, tensorrt, jetson"):
        get_target("tensorrt-11")


@pytest.mark.parametrize(
    ("target", "precision", "graph"),
    [("tensorrt", "fp16", "fp16"), ("jetson", "fp16", "fp32"), ("jetson", "int8", "fp32"), ("ort-cpu", "fp16", "fp16"), ("tensorrt", "fp32", "fp32")],
)
def test_export_spec_for(target: str, precision: str, graph: str) -> None:
    spec = export_spec_for(target, precision)
    t = get_target(target)
    assert (spec.attention, spec.resolved_opset, spec.precision) == (t.attention, t.opset, graph)


def test_bad_precision() -> None:
    with pytest.raises(ConfigError, match="expected --precision"):
        export_spec_for("jetson", "int4")


@pytest.fixture(scope="module")
def fp16_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = {}
    for target in ("tensorrt", "jetson"):
        path = tmp_path_factory.mktemp(target) / "model.onnx"
        export_onnx(small_layer("transformer", "padding", d_model=32, heads=2), path, export_spec_for(target, "fp16"))
        out[target] = str(path)
    return out


def test_tensorrt_fp16_islands(fp16_exports: dict[str, str]) -> None:
    summary = summarize_graph(fp16_exports["tensorrt"])
    assert summary.opset == 23 and summary.fused_ops == {"Attention": 1}
    assert "FLOAT16" in summary.dtypes_of_floats
    norms = [i for i in summary.islands if i.op == "LayerNormalization"]
    assert len(norms) == 2 and all(i.input_dtype == i.output_dtype == "FLOAT" for i in norms)
    attn = next(n for n in onnx.load(fp16_exports["tensorrt"]).graph.node if n.op_type == "Attention")
    softmax_precision = next(a.i for a in attn.attribute if a.name == "softmax_precision")
    assert softmax_precision == onnx.TensorProto.FLOAT  # softmax in fp32 inside IAttention


def test_jetson_fp16_is_fp32_graph_plus_flag(fp16_exports: dict[str, str]) -> None:
    summary = summarize_graph(fp16_exports["jetson"])
    assert summary.opset == 18 and summary.fused_attention == 0 and summary.attention_blocks == 1
    assert summary.dtypes_of_floats == ["FLOAT"]  # no fp16 in the graph: fp16 is TensorRT's choice at build
    spec = EngineSpec(precision="fp16", profiles=ShapeProfile((1, 8), (2, 16), (4, 32)))
    cmd = trtexec_command(fp16_exports["jetson"], "m.engine", spec, "10.3")
    assert "--fp16" in cmd and "--stronglyTyped" not in cmd
