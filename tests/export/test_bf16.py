"""bf16 for TensorRT (sm80 and later): exported like fp16 (bf16 weights and activations, softmax and
LayerNorm in fp32 islands), judged against eager on ONNX Runtime CPU through rounding Casts
(``runtime/emulate.py``: ORT CPU has no bf16 MatMul), held to its own tolerance row; Jetson Orin
(sm87) and Turing (sm75) refuse it in one line from the architecture table; a weakly typed build
sets ``BuilderFlag.BF16`` (the strict doubles of the recorded TensorRT bindings)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from fixtures import eager, feed_for, small_layer
from trt_fakes import install, major_minor, manifest_versions

from attn_export.errors import ConfigError
from attn_export.export import ExportSpec, export_onnx, summarize_graph
from attn_export.runtime.ort import OrtRunner, SessionFromOnnx
from attn_export.runtime.tensorrt.build_plan import precision_plan
from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile
from attn_export.validate import accuracy
from attn_export.validate.tolerances import tolerance_for
from attn_export.vocab.precisions import PRECISIONS

PROFILE = ShapeProfile((1, 8), (2, 16), (4, 32))


@pytest.fixture(scope="module")
def bf16_graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, str]:
    layer = small_layer("transformer", "padding")
    path = tmp_path_factory.mktemp("bf16") / "model.onnx"
    export_onnx(layer, path, ExportSpec(precision="bf16"))
    return layer, str(path)


def _run(path: str, feed: dict[str, np.ndarray]) -> np.ndarray:
    with OrtRunner(SessionFromOnnx(path)) as runner:
        return runner.infer(feed)["y"]


def test_bf16_graph_has_bf16_weights_and_fp32_islands(bf16_graph):
    _, path = bf16_graph
    summary = summarize_graph(path)
    assert "BFLOAT16" in summary.dtypes_of_floats and "FLOAT16" not in summary.dtypes_of_floats
    assert {i.op for i in summary.islands} >= {"Softmax", "LayerNormalization"} and summary.island_dtypes_ok
    graph = onnx.load(path).graph
    weights = [t for t in graph.initializer if len(t.dims) == 2]
    assert weights and all(t.data_type == onnx.TensorProto.BFLOAT16 for t in weights)
    # numpy has no bf16: the graph takes and returns float32, cast at its edges, so every runner can feed it
    assert [(v.name, v.type.tensor_type.elem_type) for v in (graph.input[0], *graph.output)] == [("x", 1), ("y", 1)]


def test_ort_cpu_has_no_bf16_matmul_so_the_judge_emulates_it(bf16_graph):
    """The evidence behind runtime/emulate.py: a plain ORT CPU session refuses the bf16 graph. If a
    new onnxruntime runs it, judge it natively and drop the emulation."""
    _, path = bf16_graph
    with pytest.raises(Exception, match=r"NOT_IMPLEMENTED.*MatMul"):
        ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert "onnxruntime" not in PRECISIONS["bf16"].runtimes


@pytest.mark.parametrize(("name", "mask"), [("transformer", "padding"), ("self-attention", "causal")])
def test_bf16_judged_against_eager_with_its_own_row(tmp_path, name, mask):
    layer = small_layer(name, mask)
    path = str(tmp_path / "m.onnx")
    export_onnx(layer, path, ExportSpec(precision="bf16"))
    feed = feed_for(layer, batch=4, seq=33, seed=5)
    got, ref = _run(path, feed), eager(layer, feed)
    acc = accuracy(ref, got)
    assert not tolerance_for(PRECISIONS["bf16"].tolerance_key).violations(acc), acc
    assert acc.rel_l2 > 1e-3  # bf16's 8-bit mantissa shows: the emulation does round (an fp32 run gives ~1e-7)
    # the emulation's error is bf16's: torch's own bf16 run of the layer strays from fp32 as far (not 10x less or more)
    half = small_layer(name, mask).to(torch.bfloat16)
    half.load_state_dict({k: v.to(torch.bfloat16) for k, v in layer.state_dict().items()})
    args = [torch.from_numpy(feed[n]) for n in layer.input_names]
    with torch.no_grad():
        torch_bf16 = half(*[a.to(torch.bfloat16) if a.is_floating_point() else a for a in args]).float().numpy()
    assert 0.5 < acc.rel_l2 / accuracy(ref, torch_bf16).rel_l2 < 2


@pytest.mark.parametrize(
    ("target", "arch", "trt", "expect"),
    [
        pytest.param("tensorrt", "sm75", "10.14", "--precision bf16 cannot run on --gpu-arch sm75 with TensorRT 10.14: sm75 (Turing: T4) has no bf16", id="turing"),
        pytest.param("jetson", "sm87", "10.3", "--precision bf16 cannot run on --gpu-arch sm87 with TensorRT 10.3: the sources do not settle bf16", id="orin"),
    ],
)
def test_orin_and_turing_refuse_bf16_in_one_line(tmp_path, capsys, target, arch, trt, expect):
    from attn_export.cli import main

    out = tmp_path / "run"
    code = main(["--d-model", "32", "--heads", "4", "--precision", "bf16", "--target", target, "--trt-version", trt,
                 "--gpu-arch", arch, "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"attn-export: error: {expect}"), err
    assert err[0].endswith("use --precision fp16 or fp32") and not out.exists()


@pytest.mark.parametrize("arch", ["sm80", "sm86", "sm89", "sm90", "sm100", "sm120"])
def test_ampere_and_later_plan_bf16(arch):
    from attn_export.config.run import RunConfig
    from attn_export.pipeline.plan import make_plan

    cfg = RunConfig(precision="bf16", target="tensorrt", gpu_arch=arch)
    precision = make_plan(cfg).engine_precision()  # the plan decides the engine's precision, once
    assert cfg.export_spec().precision == "bf16" and precision == "bf16" and cfg.engine_spec(precision).precision == "bf16"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("args", "expect"), [
    ({"target": "ort-cpu"}, "--precision bf16 runs on tensorrt only, got --target ort-cpu (onnxruntime); use --precision fp16"),
    ({"target": "tensorrt"}, "--precision bf16 needs the GPU it runs on: pass --gpu-arch (sm80, sm86"),
])  # fmt: skip
def test_bf16_needs_tensorrt_and_a_gpu_that_has_it(args, expect):
    from attn_export.config.run import RunConfig

    with pytest.raises(ConfigError, match="^" + expect.replace("(", r"\(").replace(")", r"\)")):
        RunConfig(precision="bf16", **args)


def test_build_plan_sets_bf16_flag_weakly_and_none_strongly():
    weak = precision_plan("10.3", "fp32", engine_precision="bf16", arch="sm86")
    assert weak.builder_flags == ("BF16",) and weak.trtexec_args == ("--bf16",) and not weak.strongly_typed
    strong = precision_plan("10.14", "bf16", arch="sm90")
    assert strong.strongly_typed and strong.builder_flags == () and strong.float_type == "bf16"
    with pytest.raises(ConfigError, match="removed BuilderFlag.BF16: the bf16 precision must be in the graph; export with --precision bf16"):
        precision_plan("11.4", "fp32", engine_precision="bf16")
    with pytest.raises(ConfigError, match="--precision bf16 cannot run on --gpu-arch sm75"):
        precision_plan("10.14", "bf16", arch="sm75")


@pytest.mark.parametrize("version", manifest_versions())
def test_engine_build_sets_builder_flag_bf16_on_the_strict_doubles(bf16_graph, tmp_path, monkeypatch, version):
    """10.x weakly typed: BuilderFlag.BF16 (a member of every recorded 10.x binding); 11.x: strongly typed, no flag exists."""
    from attn_export.runtime.tensorrt.build import build_engine

    _, path = bf16_graph
    trt11 = major_minor(version) >= (11, 0)
    trt = install(monkeypatch, version)
    spec = EngineSpec(precision="bf16", profiles=PROFILE, strongly_typed=None if trt11 else False)
    result = build_engine(path, tmp_path / "m.engine", spec)
    assert trt._world.called("set_flag") == ([] if trt11 else ["BF16"])
    assert result.strongly_typed is trt11
