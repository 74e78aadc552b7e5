"""Padding-free on TensorRT 11: the packed encoder's ``trt-packed`` form (``trt.TRT_Attention`` -> IAttention, PACKED_NHD).

One export (module fixture) is checked three ways: its graph (what TensorRT's parser reads), check-trt per
release (11.x parses it; 10.14 refuses it by name), and ONNX Runtime running its decomposed twin, which must
equal the padded encoder on every mask pattern of ``test_packed`` (fp32 tolerance). The route policy refuses
``--encoder-form packed`` on every 10.x release in one line, before any heavy import.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from test_packed import CONFIG, MASKS, _check, _ids, _padded, seeded_encoder

from attn_export.checkpoint.export import export_encoder
from attn_export.checks.trt_compat import check_trt_compat
from attn_export.errors import ConfigError
from attn_export.export import ExportSpec
from attn_export.export.forms.trt_packed import decomposed_twin
from attn_export.layers.encoder import SentenceEncoder
from attn_export.runtime.ort import SessionFromOnnx
from attn_export.runtime.tensorrt.spec import ShapeProfile

PROFILE = ShapeProfile((1, 1), (8, 128), (32, 512))


encoder = pytest.fixture(scope="module")(seeded_encoder)  # the encoder test_packed judges, built once here


@pytest.fixture(scope="module")
def trt_packed(encoder: SentenceEncoder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trt-packed") / "packed_trt.onnx"
    result = export_encoder(encoder, path, ExportSpec(attention="trt-packed", encoder_form="packed"))
    assert result.fused_attention == CONFIG.num_hidden_layers, result.describe()
    return path


def test_every_layer_attends_its_real_rows_in_one_packed_iattention(trt_packed: Path) -> None:
    graph = onnx.load(str(trt_packed)).graph
    nodes = [n for n in graph.node if (n.domain, n.op_type) == ("trt", "TRT_Attention")]
    assert [n.name for n in nodes] == [f"packed_iattention_{i}" for i in range(CONFIG.num_hidden_layers)]
    for n in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        assert attrs["query_form"] == attrs["kv_form"] == b"packed_nhd" and attrs["TRT_decomposable"] == 1
        assert attrs["scale"] == 1.0, "Q comes pre-scaled: right whether or not the importer applies scale"
        assert list(n.input[3:6]) == ["", "", ""], "no attn_mask, past_key or past_value with a packed query"
        assert n.input[6] and n.input[7] and n.input[6] != n.input[7], "query_lengths and kv_lengths must be two tensors"
    assert not [n for n in graph.node if n.op_type == "Softmax"], "the attention is IAttention's, not decomposed around it"


@pytest.mark.parametrize("version", ["11.1", "11.4"])
def test_check_trt_passes_on_11(trt_packed: Path, version: str) -> None:
    report = check_trt_compat(trt_packed, version, PROFILE, "fp32")
    assert report and not report.errors, str(report)
    assert any(f.op == "trt.TRT_Attention" for f in report.findings), "check-trt must have read the packed attention"


def test_check_trt_refuses_it_by_name_on_10_14(trt_packed: Path) -> None:
    report = check_trt_compat(trt_packed, "10.14", PROFILE, "fp32")
    assert not report
    messages = {f.message for f in report.errors if f.op == "trt.TRT_Attention"}
    assert messages and all("needs TensorRT >= 11.0, target is 10.14" in m and "--encoder-form padded" in m for m in messages), str(report)


def test_check_trt_holds_the_packed_forms_to_11_1(trt_packed: Path) -> None:
    """11.0's parser has TRT_Attention, but its raggedness arrived in 11.1 (onnx/onnx-tensorrt#1057)."""
    report = check_trt_compat(trt_packed, "11.0", PROFILE, "fp32")
    assert not report and all("packed_nhd needs TensorRT >= 11.1" in f.message for f in report.errors), str(report)


def test_onnx_runtime_runs_the_twin_and_it_equals_the_padded_encoder_on_every_mask(encoder: SentenceEncoder, trt_packed: Path) -> None:
    """The deployed file loads through the runner's loader (ORT has no TRT_Attention kernel: it runs the twin)."""
    sess = SessionFromOnnx(str(trt_packed), intra_op_threads=1)()
    for name, mask in MASKS.items():
        ids = _ids(mask)
        ref_h, ref_e = _padded(encoder, ids, mask)
        h, e = sess.run(None, {"input_ids": ids, "attention_mask": mask})
        _check(f"trt-packed twin: {name}", h, e, ref_h, ref_e, mask)


def test_the_twin_replaces_every_trt_attention_and_nothing_else(trt_packed: Path) -> None:
    model = onnx.load(str(trt_packed))
    twin, replaced = decomposed_twin(model)
    assert replaced == CONFIG.num_hidden_layers
    assert not any(n.domain == "trt" for n in twin.graph.node) and "trt" not in {o.domain for o in twin.opset_import}
    kept = {n.name for n in model.graph.node if n.domain != "trt"}
    assert kept <= {n.name for n in twin.graph.node}, "the twin keeps every other node of the deployed graph"
    values = {o for n in model.graph.node for o in n.output}
    assert values <= {o for n in twin.graph.node for o in n.output}, "and every value name (what probes and comparisons read)"


def _trt_attention(inputs: list[str], **attrs: object) -> onnx.ModelProto:
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, ["T", 4, 64]) for n in "qkv"]
    vi += [helper.make_tensor_value_info(n, TensorProto.INT32, ["B1"]) for n in ("ql", "kl")]
    vi += [helper.make_tensor_value_info("ql64", TensorProto.INT64, ["B1"]), helper.make_tensor_value_info("m", TensorProto.BOOL, ["T", "T"])]
    node = helper.make_node("TRT_Attention", inputs, ["y"], name="attn", domain="trt", **attrs)
    used = [v for v in vi if v.name in inputs]
    graph = helper.make_graph([node], "g", used, [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("trt", 1)], ir_version=10)


PACKED = {"query_form": "packed_nhd", "kv_form": "packed_nhd", "TRT_decomposable": 0}


@pytest.mark.parametrize(("inputs", "attrs", "error"), [
    (["q", "k", "v", "", "", "", "ql", "kl"], PACKED, None),
    (["q", "k", "v", "m", "", "", "ql", "kl"], PACKED, "attn_mask is not supported with a packed query"),
    (["q", "k", "v", "", "", "", "ql", "ql"], PACKED, "are one tensor"),
    (["q", "k", "v", "", "", "", "ql64", "kl"], PACKED, "the parser takes INT32"),
    (["q", "k", "v"], PACKED, "needs query_lengths"),
    (["q", "k", "v", "", "", "", "ql", "kl"], {**PACKED, "query_form": "ragged"}, "is not an IO form"),
], ids=["fp16-packed", "mask", "shared-lengths", "int64-lengths", "no-lengths", "bad-form"])  # fmt: skip
def test_the_parser_rules_of_trt_attention(inputs: list[str], attrs: dict, error: str | None) -> None:
    report = check_trt_compat(_trt_attention(inputs, **attrs), "11.4", precision="fp16")
    errors = [f.message for f in report.errors]
    if error is None:
        assert report, str(report)
        assert any("packed IAttention" in f.message and "fused kernel" in f.message for f in report.findings), str(report)
    else:
        assert any(error in m for m in errors), str(report)


def test_an_fp32_iattention_that_cannot_decompose_is_an_error() -> None:
    model = _trt_attention(["q", "k", "v", "", "", "", "ql", "kl"], **PACKED)
    for v in (*model.graph.input, *model.graph.output):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT16:
            v.type.tensor_type.elem_type = TensorProto.FLOAT
    report = check_trt_compat(model, "11.4", precision="fp32")
    assert any("set TRT_decomposable=1" in f.message for f in report.errors), str(report)


@pytest.mark.parametrize(("target", "version"), [("tensorrt", "10.14"), ("tensorrt", None), ("tensorrt", "11.0"), ("jetson", "10.3"), ("ort-tensorrt", "10.9")])
def test_the_route_policy_refuses_packed_before_tensorrt_11_1_by_name(target: str, version: str | None) -> None:
    from attn_export.config.run import RunConfig

    with pytest.raises(ConfigError, match=r"TensorRT 1[01]\.\d+ has no packed attention; use --encoder-form padded, whose engine gets "
                                          "length-bucketed profiles"):  # fmt: skip
        RunConfig(checkpoint="minilm", target=target, trt_version=version, encoder_form="packed")


def test_the_packed_tensorrt_graph_is_float_only() -> None:
    """Its Q/DQ calibration would run in ONNX Runtime, which has no TRT_Attention kernel: refused in one line, before any work."""
    from attn_export.config.run import RunConfig

    with pytest.raises(ConfigError, match="--quantize int8 with --encoder-form packed on TensorRT: ONNX Runtime's calibrator cannot run"):
        RunConfig(checkpoint="minilm", target="tensorrt", trt_version="11.4", encoder_form="packed", quantize="int8")


def test_tensorrt_11_plans_the_packed_iattention() -> None:
    from attn_export.config.run import RunConfig
    from attn_export.pipeline.plan import make_plan

    plan = make_plan(RunConfig(checkpoint="minilm", target="tensorrt", trt_version="11.4", encoder_form="packed"))
    assert plan.fp32_spec is not None and (plan.fp32_spec.encoder_form, plan.fp32_spec.attention) == ("packed", "trt-packed")


def test_the_cli_refuses_packed_on_10_14_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from attn_export.cli.app import main

    assert main(["--checkpoint", "minilm", "--target", "tensorrt", "--trt-version", "10.14", "--encoder-form", "packed"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "TensorRT 10.14 has no packed attention" in err, err


def test_trt_packed_is_the_packed_encoders_form_only() -> None:
    with pytest.raises(ConfigError, match="--attention trt-packed attends the packed encoder's real tokens only"):
        ExportSpec(attention="trt-packed")
