"""The int8 dynamic route's unfused source is the fp32 graph with its fused QKV split, not a second export.

``export.passes.unfuse_qkv`` rewrites MatMul(x, W_qkv) + b -> Split(3) into three MatMul + Add. Checked on the
reference TransformerLayer (padding mask) and on a layer whose weights are shared across two calls: the rewritten graph
equals the ``fuse_qkv=False`` export output for output and names its GEMMs as that export does; shared weights stay one
initializer each; a pattern the pass does not know is left fused and reported, and the route then exports again.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from fixtures import feed_for, small_layer

from attn_export.compress.quant.gemm_groups import gemm_label
from attn_export.export import export_onnx
from attn_export.export.passes.unfuse_qkv import fused_qkv_left, unfuse_qkv
from attn_export.layers import MaskedLayer
from attn_export.targets.targets import export_spec_for


def _run(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)


def _labels(model: ir.Model) -> list[str]:
    return sorted(gemm_label(n) for n in model.graph if n.op_type == "MatMul" and n.inputs[1] is not None and n.inputs[1].const_value is not None)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    """(layer, fused export, fuse_qkv=False export) of the reference TransformerLayer with a padding mask."""
    tmp = tmp_path_factory.mktemp("unfuse")
    layer = small_layer(mask="padding")
    spec = export_spec_for("ort-cpu", "fp32")
    assert spec.fuse_qkv and not spec.resolved_linear_gemm
    export_onnx(layer, tmp / "fused.onnx", spec)
    export_onnx(layer, tmp / "unfused.onnx", dataclasses.replace(spec, fuse_qkv=False))
    return layer, tmp / "fused.onnx", tmp / "unfused.onnx"


def test_the_split_graph_is_the_unfused_export(exported, tmp_path: Path) -> None:
    layer, fused, unfused = exported
    model = ir.load(fused)
    assert fused_qkv_left(model) == 1, "the export fuses Q/K/V (the case has its trigger)"
    assert unfuse_qkv(model) == 1 and fused_qkv_left(model) == 0
    assert not any(n.op_type == "Split" for n in model.graph), "the Split that copied the fused product is gone"
    assert _labels(model) == _labels(ir.load(unfused)), "GEMMs named as the unfused export names them (gemm_groups reads them)"
    ir.save(model, tmp_path / "split.onnx")
    feed = feed_for(layer, 3, 11)
    for got, want in zip(_run(tmp_path / "split.onnx", feed), _run(unfused, feed)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_shared_weights_stay_shared(tmp_path: Path) -> None:
    """One layer run twice (ALBERT's shared layers): both fused GEMMs read one W_qkv, and both split GEMMs read one block each."""

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = small_layer(mask="padding").layer

        def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, need_weights: bool = False):
            return self.layer(self.layer(x, key_padding_mask), key_padding_mask), None

    module = MaskedLayer(Twice(), "padding").eval()
    export_onnx(module, tmp_path / "twice.onnx", export_spec_for("ort-cpu", "fp32"))
    model = ir.load(tmp_path / "twice.onnx")
    before = len(model.graph.initializers)
    assert unfuse_qkv(model) == 2 and fused_qkv_left(model) == 0
    blocks = [n.inputs[1].name for n in model.graph if n.op_type == "MatMul" and (n.inputs[1].name or "").endswith((".w_q", ".w_k", ".w_v"))]
    assert len(blocks) == 6 and len(set(blocks)) == 3, blocks
    assert len(model.graph.initializers) <= before + 3 + 1, "three weight blocks (and three bias blocks) replace the fused pair, once"
    ir.save(model, tmp_path / "split.onnx")
    feed = feed_for(module, 2, 9)
    np.testing.assert_allclose(_run(tmp_path / "split.onnx", feed)[0], _run(tmp_path / "twice.onnx", feed)[0], rtol=0, atol=1e-5)


def test_an_unknown_pattern_is_left_fused_and_reported(exported) -> None:
    """A Split along another axis is not Q/K/V's column blocks: the pass leaves it and ``fused_qkv_left`` says so."""
    _, fused, _ = exported
    model = ir.load(fused)
    split = next(n for n in model.graph if n.op_type == "Split")
    split.attributes["axis"] = ir.AttrInt64("axis", 1)
    assert unfuse_qkv(model) == 0 and fused_qkv_left(model) == 1
