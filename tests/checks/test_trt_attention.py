"""Which attention form TensorRT can build: ``trt_attention_form`` and the check that backs it.

IAttention is not decomposable as the ONNX importer creates it, so an ONNX ``Attention``
node without a fused kernel most likely fails the build. The export therefore falls back
to the decomposed form for fp32, for int8 (whose attention stays fp32), for head sizes
outside 16-256 (multiples of 8) and for TensorRT < 10.14, and says why.
"""

from __future__ import annotations

import pytest
from fixtures import small_layer

from attn_export.checks.trt_attention import iattention_kernel, trt_attention_form
from attn_export.checks.trt_compat import check_trt_compat
from attn_export.errors import ConfigError
from attn_export.export import export_onnx
from attn_export.targets.targets import export_spec_for, get_target
from attn_export.runtime.tensorrt.spec import ShapeProfile, TrtVersion

PROFILE = ShapeProfile((1, 8), (2, 16), (4, 32))
DEFAULT_HEAD = 512 // 8  # the default layer: d_model 512, 8 heads


@pytest.mark.parametrize(
    ("precision", "head", "version", "strongly", "form", "why"),
    [
        ("fp16", DEFAULT_HEAD, "10.14", True, "onnx-attention", "fp16 IAttention with head size 64 has a fused kernel"),
        ("fp16", DEFAULT_HEAD, "11.4", False, "onnx-attention", "fused kernel"),  # 11 is always strongly typed
        ("fp32", DEFAULT_HEAD, "10.14", True, "decomposed", "fp32 IAttention has no fused kernel"),
        ("fp32", DEFAULT_HEAD, "10.14", False, "decomposed", "fp32 IAttention has no fused kernel"),  # fp32 engine: no lowering
        ("int8", DEFAULT_HEAD, "10.14", True, "decomposed", "the int8 graph keeps the attention itself in fp32"),
        ("int8", DEFAULT_HEAD, "11.0", True, "decomposed", "fp32 IAttention has no fused kernel"),
        ("fp16", 12, "10.14", True, "decomposed", "head size 12 is outside the fused kernels' 16-256 in multiples of 8"),
        ("fp16", 264, "11.0", True, "decomposed", "head size 264"),
        ("fp16", 260, "11.0", True, "decomposed", "head size 260"),
        ("fp16", None, "10.14", True, "decomposed", "head size unknown"),
        ("fp16", DEFAULT_HEAD, "10.3", True, "decomposed", "TensorRT 10.3 has no ONNX Attention importer"),
        ("fp16", DEFAULT_HEAD, "10.14", False, "decomposed", "a weakly typed build chooses the attention's precision"),
        ("fp16", 16, "10.14.1.48.post1", True, "onnx-attention", "head size 16"),
        ("fp16", 256, "10.14", True, "onnx-attention", "head size 256"),
    ],
)
def test_trt_attention_form(precision: str, head: int | None, version: str, strongly: bool, form: str, why: str) -> None:
    got, reason = trt_attention_form(precision, head, version, strongly_typed=strongly)
    assert got == form and why in reason, reason
    if form == "decomposed":
        assert "exporting the decomposed form" in reason


def test_quantized_attention_bmms_have_no_kernel_under_strong_typing() -> None:
    form, reason = trt_attention_form("int8", DEFAULT_HEAD, "10.14", strongly_typed=True, quantize_attention_bmm=True)
    assert form == "decomposed" and "int8 Q/K/V into IAttention under strong typing" in reason
    assert iattention_kernel("FLOAT16", 64, TrtVersion(10, 14), True, quantized=True)[0] is False
    with pytest.raises(ConfigError, match="expected precision fp32, fp16, bf16, int8 or fp8"):
        trt_attention_form("fp4", 64, "10.14", True)


@pytest.fixture(scope="module")
def default_layer_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str, str]]:
    """The default layer for --target tensorrt at each precision, in the form trt_attention_form picks."""
    layer = small_layer("transformer", "padding", d_model=2 * DEFAULT_HEAD, heads=2)  # the default layer's head size
    target = get_target("tensorrt")
    out, written = {}, {}
    for precision in ("fp32", "fp16", "int8"):
        form, reason = trt_attention_form(precision, DEFAULT_HEAD, target.trt_version, target.strongly_typed, target.quantize_attention_bmm)
        spec = export_spec_for(target, precision, attention=form)
        if spec not in written:  # int8 starts from the same fp32 graph
            written[spec] = tmp_path_factory.mktemp(precision) / "model.onnx"
            export_onnx(layer, written[spec], spec)
        out[precision] = (str(written[spec]), form, reason)
    return out


def test_default_layer_forms(default_layer_exports: dict) -> None:
    forms = {p: f for p, (_, f, _) in default_layer_exports.items()}
    assert forms == {"fp32": "decomposed", "fp16": "onnx-attention", "int8": "decomposed"}


@pytest.mark.parametrize("version", ["10.14", "11.0", "11.4"])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_default_layer_exports_build_by_the_rules(default_layer_exports: dict, precision: str, version: str) -> None:
    """Every form the export picks passes the check with no Attention error (int8: the float graph Q/DQ starts from)."""
    path, _, _ = default_layer_exports[precision]
    report = check_trt_compat(path, version, PROFILE, "fp32" if precision == "int8" else precision)
    assert report and not [f for f in report.findings if f.op == "Attention" and f.severity != "info"], str(report)
