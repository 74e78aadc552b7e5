"""Static TensorRT check: ops/opsets per version, Attention's mask, Q/DQ, int64, profiles, MHA rules.

Small graphs are built with onnx.helper where a single rule is under test; the toolkit's
own exports for each TensorRT target (fp32, fp16 and int8 Q/DQ) must pass for that target.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fixtures import small_layer
from onnx import TensorProto, helper, numpy_helper

from attn_export.checks.trt_attention import trt_attention_form
from attn_export.checks.trt_compat import check_trt_compat
from attn_export.errors import CompatibilityError, ConfigError
from attn_export.export import export_onnx
from attn_export.targets.targets import export_spec_for
from attn_export.runtime.tensorrt.spec import ShapeProfile

PROFILE = ShapeProfile((1, 8), (2, 16), (4, 32))


def _attention_model(mask_shape: list | None, head: int = 16, dtype: int = TensorProto.FLOAT16, seq: str | int = "L") -> onnx.ModelProto:
    qkv = [helper.make_tensor_value_info(n, dtype, ["B", 2, seq, head]) for n in "qkv"]
    inputs, names = list(qkv), ["q", "k", "v"]
    if mask_shape is not None:
        inputs.append(helper.make_tensor_value_info("mask", dtype, mask_shape))
        names.append("mask")
    node = helper.make_node("Attention", names, ["y"], name="attn", softmax_precision=1)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", dtype, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


def _qdq_model(zero_point: int | None, zp_type: int = TensorProto.INT8, scale: list[float] | None = None) -> onnx.ModelProto:
    scale = scale or [0.05]
    inits = [numpy_helper.from_array(np.array(scale if len(scale) > 1 else scale[0], np.float32), "s"),
             numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32), "w")]
    q_inputs = ["x", "s"]
    if zero_point is not None:
        zp_np = np.int8 if zp_type == TensorProto.INT8 else np.uint8
        zp = np.full(len(scale), zero_point, zp_np) if len(scale) > 1 else np.array(zero_point, zp_np)
        inits.append(numpy_helper.from_array(zp, "zp"))
        q_inputs.append("zp")
    axis = {"axis": 2} if len(scale) > 1 else {}
    nodes = [helper.make_node("QuantizeLinear", q_inputs, ["xq"], name="q", **axis),
             helper.make_node("DequantizeLinear", ["xq", *q_inputs[1:]], ["xd"], name="dq", **axis),
             helper.make_node("MatMul", ["xd", "w"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=10)


def _errors(report) -> list[str]:  # type: ignore[no-untyped-def]
    return [f.message for f in report.errors]


def test_attention_needs_10_14() -> None:
    model = _attention_model(["B", 1, "L", "L"])
    old, new = check_trt_compat(model, "10.3"), check_trt_compat(model, "10.14")
    assert not old and any("Attention needs TensorRT >= 10.14" in m for m in _errors(old))
    assert any("opset 23 is outside" in m for m in _errors(old))
    assert new, str(new)
    assert check_trt_compat(model, "11"), "TensorRT 11 parses Attention too"


def test_broadcast_query_mask_flagged() -> None:
    report = check_trt_compat(_attention_model(["B", 1, 1, "L"]), "10.14")
    assert not report
    (err,) = report.errors
    assert err.node == "attn" and err.op == "Attention" and "[B, 1, Lq, Lk]" in err.message
    assert "attn (Attention)" in str(report)


def test_mask_dtype_and_rank() -> None:
    bad_rank = check_trt_compat(_attention_model(["B", "L"]), "10.14")
    assert any("attn_mask is 2D" in m for m in _errors(bad_rank))
    model = _attention_model(["B", 1, "L", "L"])
    model.graph.input[3].type.tensor_type.elem_type = TensorProto.FLOAT
    assert any("attn_mask is FLOAT but Q is FLOAT16" in m for m in _errors(check_trt_compat(model, "10.14")))


def test_attention_without_a_fused_kernel_is_an_error() -> None:
    """IAttention is not decomposable as imported: no fused kernel means no engine (an ERROR, not a warning)."""
    good = check_trt_compat(_attention_model(None, head=64), "10.14")
    assert good and not [w for w in good.warnings if w.op == "Attention"]
    assert not [w for w in good.warnings if "IR version" in w.message]
    for version in ("10.14", "11"):
        odd = check_trt_compat(_attention_model(None, head=12), version)
        (err,) = [f for f in odd.errors if f.op == "Attention"]
        assert "head size 12" in err.message and "not decomposable" in err.message and "--attention decomposed" in err.message
        fp32 = check_trt_compat(_attention_model(None, head=64, dtype=TensorProto.FLOAT), version, precision="fp32")
        assert any("fp32 IAttention has no fused kernel" in f.message for f in fp32.errors), str(fp32)


def test_weakly_typed_fp32_attention_is_a_warning() -> None:
    """A fp32 graph built with --fp16 on 10.x: the builder picks the precision, so it may or may not build."""
    report = check_trt_compat(_attention_model(None, head=64, dtype=TensorProto.FLOAT), "10.14", precision="fp16")
    assert report and any(w.op == "Attention" and "weakly typed" in w.message for w in report.warnings), str(report)


def test_no_softmax_precision_claim() -> None:
    """The importer never reads softmax_precision: no finding may promise a fp32 softmax inside IAttention."""
    model = _attention_model(None, head=64)
    del model.graph.node[0].attribute[:]
    report = check_trt_compat(model, "10.14")
    assert report and not any("softmax_precision" in f.message or "fp32 inside" in f.message for f in report.findings), str(report)


@pytest.mark.parametrize(
    ("zp", "zp_type", "scale", "expect"),
    [
        (3, TensorProto.INT8, None, "asymmetric quantization (zero point 3 != 0)"),
        (128, TensorProto.UINT8, None, "uint8 (asymmetric) quantization"),
        (0, TensorProto.INT8, [0.1] * 8, "per-channel Q/DQ on an activation"),
    ],
)
def test_qdq_rules(zp: int | None, zp_type: int, scale: list[float] | None, expect: str) -> None:
    report = check_trt_compat(_qdq_model(zp, zp_type, scale), "10.3")
    assert not report and any(expect in m for m in _errors(report)), str(report)


def test_symmetric_qdq_passes() -> None:
    report = check_trt_compat(_qdq_model(0), "10.3")
    assert report, str(report)
    assert report.precision == "int8"


def test_qdq_without_zero_point_or_with_a_computed_scale_passes() -> None:
    """TensorRT takes a QuantizeLinear without a zero point, and a scale computed in the graph."""
    assert check_trt_compat(_qdq_model(None), "10.3"), str(check_trt_compat(_qdq_model(None), "10.3"))
    model = _qdq_model(0)
    model.graph.node.insert(0, helper.make_node("Abs", ["s0"], ["s"], name="scale_from_graph"))
    model.graph.initializer[0].name = "s0"
    report = check_trt_compat(model, "10.3")
    assert report and not any("scale" in f.message for f in report.findings), str(report)


def test_unsupported_ops() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    outs = [helper.make_tensor_value_info(n, t, None) for n, t in (("q", TensorProto.UINT8), ("s", TensorProto.FLOAT), ("z", TensorProto.UINT8))]
    dq = helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], name="dyn")
    contrib = helper.make_node("Gelu", ["x"], ["g"], name="ms_gelu", domain="com.microsoft")
    graph = helper.make_graph([dq, contrib], "g", [x], [*outs, helper.make_tensor_value_info("g", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    errs = _errors(check_trt_compat(model, "10.14"))
    assert any("DynamicQuantizeLinear is not supported" in m and "static symmetric Q/DQ" in m for m in errs)
    assert any("com.microsoft.Gelu has no TensorRT importer" in m for m in errs)


def test_int64_into_float_op() -> None:
    a = helper.make_tensor_value_info("a", TensorProto.INT64, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.INT64, [3, 2])
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"], name="mm64")], "g", [a, b],
                              [helper.make_tensor_value_info("c", TensorProto.INT64, None)])
    report = check_trt_compat(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), "10.3")
    assert any("int64 tensor 'a'" in m and "MatMul" in m and "int32" in m for m in _errors(report))


def test_profile_against_static_dims() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", "width"])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    errs = _errors(check_trt_compat(model, "10.3", PROFILE))
    assert any("static batch of 1" in m for m in errs) or any("dynamic dim 2" in m for m in errs)


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError, match="expected --trt to name TensorRT 10.x or 11.x"):
        check_trt_compat(_qdq_model(0), "8.6")
    with pytest.raises(ConfigError, match="does not exist"):
        check_trt_compat("/nonexistent/model.onnx", "10.3")


@pytest.fixture(scope="module")
def own_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], str]:
    """(target, precision) -> the small layer's export for it, made on first use: a pair no test reads (tensorrt-decomposed
    fp16, where IAttention has a kernel) costs no torch.onnx export."""
    layer = small_layer("transformer", "padding", d_model=32, heads=2)

    class Exports(dict):
        def __missing__(self, key: tuple[str, str]) -> str:
            target, precision = key
            path = tmp_path_factory.mktemp(f"{target}-{precision}") / "model.onnx"
            spec = export_spec_for("tensorrt", precision, attention="decomposed") if target == "tensorrt-decomposed" else export_spec_for(target, precision)
            export_onnx(layer, path, spec)
            self[key] = str(path)
            return self[key]

    return Exports()


@pytest.mark.parametrize(("target", "versions"), [("tensorrt", ("10.14", "10.15", "11")), ("jetson", ("10.3", "10.14", "11"))])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_own_exports_pass_their_target(own_exports: dict, target: str, versions: tuple[str, ...], precision: str) -> None:
    for version in versions:
        key = (target, precision)
        if target == "tensorrt" and trt_attention_form(precision, 16, version, strongly_typed=True)[0] == "decomposed":
            key = ("tensorrt-decomposed", precision)  # the form the export picks where IAttention has no kernel
        report = check_trt_compat(own_exports[key], version, PROFILE, precision)
        assert report, str(report)


def test_tensorrt_fp32_attention_export_is_refused(own_exports: dict) -> None:
    report = check_trt_compat(own_exports[("tensorrt", "fp32")], "10.14", PROFILE, "fp32")
    assert not report and any(f.op == "Attention" and "no fused kernel" in f.message for f in report.errors), str(report)


def test_tensorrt_export_fails_on_jetson(own_exports: dict) -> None:
    report = check_trt_compat(own_exports[("tensorrt", "fp16")], "10.3", PROFILE)
    assert not report
    with pytest.raises(CompatibilityError, match="cannot be built with TensorRT 10.3.*check-trt"):
        report.raise_if_failed()


def test_own_int8_qdq_export_passes(own_exports: dict, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from attn_export.compress.quant import static as quant_static
    from attn_export.compress.calib.data import ActivationSet

    rng = np.random.default_rng(0)
    calib = ActivationSet(rng.standard_normal((8, 16, 32)).astype(np.float32), np.ones((8, 16), np.int32))
    out = tmp_path / "int8.onnx"
    quant_static.quantize_static_onnx(own_exports[("jetson", "fp32")], out, calib)
    report = check_trt_compat(out, "10.3", PROFILE, "int8")
    assert report, str(report)
    assert report.precision == "int8" and any(n.op_type == "QuantizeLinear" for n in onnx.load(out).graph.node)


def test_check_trt_cli(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import typer
    from typer.testing import CliRunner

    from attn_export.cli.check_trt import register

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # a second command keeps check-trt a named subcommand
    model = tmp_path / "attn.onnx"
    onnx.save(_attention_model(["B", 1, 1, "L"]), model)
    runner = CliRunner()
    bad = runner.invoke(app, ["check-trt", str(model), "--trt", "10.3"])
    lines = bad.output.strip().splitlines()
    assert bad.exit_code == 1 and lines[0].startswith(f"{model}: TensorRT 10.3")
    assert any(line.startswith("ERROR") and "attn (Attention)" in line and "needs TensorRT >= 10.14" in line for line in lines)
    good = runner.invoke(app, ["check-trt", str(_write(tmp_path, _qdq_model(0))), "--trt", "10.3", "--json", str(tmp_path / "r.json")])
    assert good.exit_code == 0 and (tmp_path / "r.json").is_file()
    from attn_export.cli import main

    assert main(["check-trt", str(tmp_path / "nope.onnx")]) == 2  # one line on stderr, "attn-export: error: ..."
    assert main(["check-trt", str(model), "--min-shape", "1xx"]) == 2


def _write(tmp_path, model: onnx.ModelProto):  # type: ignore[no-untyped-def]
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return path


# --- the support table: every row with its version and source; version-gated types --------


def test_every_row_says_what_it_was_checked_against() -> None:
    from attn_export.checks.trt_support import OP_SUPPORT, OPSET_SOURCES
    from attn_export.runtime.tensorrt.spec import TrtVersion

    for op, row in OP_SUPPORT.items():
        assert isinstance(row.checked, TrtVersion) and row.source, op
        if row.since is not None and row.since > TrtVersion(10, 0):
            assert str(row.since) in row.source and ("CHANGELOG" in row.source or "Changelog" in row.source or "release notes" in row.source), (op, row.source)
            assert row.checked >= row.since, op
        for since, types, _, source in row.later:
            assert types and str(since) in source and "CHANGELOG" in source, (op, source)
    assert all(src for _, src in OPSET_SOURCES.values())


def _single_op(op: str, inputs: list[tuple[str, int]], opset: int, out_type: int = TensorProto.FLOAT, **attrs: object) -> onnx.ModelProto:
    vis = [helper.make_tensor_value_info(n, t, [2, 4]) for n, t in inputs]
    node = helper.make_node(op, [n for n, _ in inputs], ["y"], name="n", **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info("y", out_type, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


@pytest.mark.parametrize(
    ("model", "too_old", "new_enough", "match"),
    [
        (lambda: _single_op("Pow", [("x", TensorProto.FLOAT), ("e", TensorProto.INT32)], 18), "10.3", "10.8", "INT32 from TensorRT 10.8"),
        (lambda: _single_op("Pow", [("x", TensorProto.INT32), ("e", TensorProto.INT32)], 18, TensorProto.INT32), "10.8", "10.12", "INT32 from TensorRT 10.12"),
        (lambda: _single_op("Swish", [("x", TensorProto.FLOAT)], 24), "10.14", "11.0", "Swish needs TensorRT >= 11.0"),
        (lambda: _single_op("DFT", [("x", TensorProto.FLOAT)], 20), "11.0", "11.2", "DFT needs TensorRT >= 11.2"),
    ],
)
def test_version_gated_rows(model, too_old: str, new_enough: str, match: str) -> None:  # type: ignore[no-untyped-def]
    old, new = check_trt_compat(model(), too_old), check_trt_compat(model(), new_enough)
    assert any(match in m for m in _errors(old)), str(old)
    assert not [f for f in new.errors if f.op in ("Pow", "Swish", "DFT")], str(new)


def test_fp4_dequantize_needs_10_8() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT4E2M1, [2, 4])
    s = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    graph = helper.make_graph([helper.make_node("DequantizeLinear", ["x", "s"], ["y"], name="dq4")], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[s])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=11)
    assert any("FLOAT4E2M1 from TensorRT 10.8" in m for m in _errors(check_trt_compat(model, "10.3")))
    assert not [f for f in check_trt_compat(model, "10.8").errors if f.op == "DequantizeLinear"]  # (opset 23 is a separate finding)
