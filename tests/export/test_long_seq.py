"""The long-seq form: eager accuracy for every mask kind (fp32, <= 1e-4), fully masked rows give
zeros (never NaN), only documented ONNX Runtime ops in the graph, and ``--attention auto``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from fixtures import eager, feed_for, run_onnx, small_layer
from torch import nn

from attn_export.errors import ConfigError, ExportError
from attn_export.export import ExportSpec, export_module, export_onnx
from attn_export.targets.form_choice import LONG_SEQ_MIN_LEN, choose_attention_form
from attn_export.layers import MaskedLayer, MultiHeadAttention, SelfAttention, build_layer

TOL = 1e-4
# The kernels ONNX Runtime documents (docs/ContribOperators.md) that the lowering may emit.
MS_OPS = {"MultiHeadAttention", "GroupQueryAttention"}
KERNEL = {  # mask kind -> the kernel the lowering must pick
    "none": "MultiHeadAttention (flash)",
    "padding": "unpadded MultiHeadAttention",
    "causal": "GroupQueryAttention (causal flash)",
    "window": "chunked Loop",
}


def _export(tmp_path, layer, **spec):
    return export_onnx(layer, tmp_path / "ls.onnx", ExportSpec(attention="long-seq", **spec))


def _assert_close(got: np.ndarray, ref: np.ndarray, tol: float = TOL) -> None:
    assert np.isfinite(got).all(), "non-finite output"
    err = np.abs(got - ref)
    assert err.max() <= tol, f"max abs {err.max():.3g} at {np.unravel_index(err.argmax(), err.shape)}"


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One long-seq export per mask kind (d_model 64, 2 heads), shared by the tests below."""
    cache = {}

    def get(mask: str):
        if mask not in cache:
            layer = small_layer("transformer", mask, heads=2)
            path = tmp_path_factory.mktemp(f"ls_{mask}") / "ls.onnx"
            cache[mask] = layer, export_onnx(layer, path, ExportSpec(attention="long-seq", long_seq_block=4))
        return cache[mask]

    return get


@pytest.mark.parametrize("mask", ["none", "padding", "causal", "window"])
def test_matches_eager_and_picks_the_kernel(exported, mask):
    layer, result = exported(mask)
    assert result.attention_blocks == 1 and any(k.startswith(KERNEL[mask]) for k in result.attention_kernels), result.describe()
    for batch, seq in [(3, 7), (1, 1), (2, 1), (1, 7), (1, 4096)]:
        feed = feed_for(layer, batch, seq, seed=seq, fully_masked_row=batch - 1 if batch > 1 else None)
        if mask == "padding" and seq == 4096:
            feed["key_padding_mask"][:, 3584:] = 0  # right padding, 1/8
        _assert_close(run_onnx(result.path, feed), eager(layer, feed))


def test_fully_masked_sequences_give_zeros_at_every_batch_size(tmp_path):
    layer = small_layer("self-attention", "padding")
    result = _export(tmp_path, layer)
    for batch in (1, 3):
        feed = feed_for(layer, batch, 9, seed=1)
        feed["key_padding_mask"][-1] = 0  # the last sequence has no token at all
        got, ref = run_onnx(result.path, feed), eager(layer, feed)
        _assert_close(got, ref)
        bias = layer.layer.w_o.bias.detach().numpy()
        np.testing.assert_array_equal(got[-1], np.broadcast_to(bias, got[-1].shape))  # attention output exactly 0


def test_left_padding_and_gaps_are_unpadded_too(exported):
    layer, result = exported("padding")
    feed = feed_for(layer, 3, 11, seed=2)
    kpm = np.ones((3, 11), dtype=np.int32)
    kpm[0, :4] = 0  # left padding
    kpm[1, [1, 5, 6, 10]] = 0  # holes anywhere
    feed["key_padding_mask"] = kpm
    _assert_close(run_onnx(result.path, feed), eager(layer, feed))


class _Combined(nn.Module):
    """Self-attention with a structural mask *and* key padding: the chunked fallback."""

    def __init__(self, causal: bool, window: int | None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn = SelfAttention(32, 2, causal=causal, window=window).eval()

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor) -> torch.Tensor:
        return self.attn(x, key_padding_mask, need_weights=False)[0]


@pytest.mark.parametrize("causal,window", [(True, None), (False, 2), (True, 3)])
def test_structural_mask_with_padding_has_fully_masked_rows_as_zeros(tmp_path, causal, window):
    model = _Combined(causal, window)
    x = torch.randn(2, 13, 32)
    kpm = torch.ones(2, 13, dtype=torch.int32)
    kpm[0, :5] = 0  # left padding: with a causal/window mask the first query rows see no key
    kpm[1, 9:] = 0
    axes = {"x": {0: "batch", 1: "seq"}, "key_padding_mask": {0: "batch", 1: "seq"}}
    spec = ExportSpec(attention="long-seq", long_seq_block=4)
    result = export_module(model, tmp_path / "c.onnx", spec, (x, kpm), ["x", "key_padding_mask"], ["y"], axes)
    assert list(result.attention_kernels) == ["chunked Loop (query block 4)"]
    with torch.no_grad():
        ref = model(x, kpm).numpy()
    got = run_onnx(result.path, {"x": x.numpy(), "key_padding_mask": kpm.numpy()})
    _assert_close(got, ref)
    bias = model.attn.w_o.bias.detach().numpy()
    np.testing.assert_array_equal(got[0, 0], bias)  # row 0 keeps no key: attention output exactly 0


@pytest.mark.parametrize("mask", ["padding", "causal"])
def test_forced_chunked_strategy_matches_eager(tmp_path, mask):
    layer = small_layer("transformer", mask)
    result = _export(tmp_path, layer, long_seq_strategy="chunked", long_seq_block=5)
    feed = feed_for(layer, 3, 23, seed=4, fully_masked_row=2)  # 23 rows: the last block is partial
    _assert_close(run_onnx(result.path, feed), eager(layer, feed))


@pytest.mark.parametrize("name,mask", [("mha", "padding"), ("mha", "causal"), ("block-sparse", "padding"), ("self-attention", "window")])
def test_other_layers(tmp_path, name, mask):
    layer = small_layer(name, mask)
    result = _export(tmp_path, layer)
    feed = feed_for(layer, 3, 19, seed=5, fully_masked_row=1)
    _assert_close(run_onnx(result.path, feed), eager(layer, feed))


def test_graph_has_only_documented_ort_ops(exported):
    for mask in ("none", "padding", "causal", "window"):
        model = onnx.load(exported(mask)[1].path)
        domains = {o.domain for o in model.opset_import}
        assert domains <= {"", "ai.onnx", "com.microsoft"}, domains
        for node in _all_nodes(model.graph):
            assert node.domain in ("", "ai.onnx") or (node.domain == "com.microsoft" and node.op_type in MS_OPS), node
        onnx.checker.check_model(model, full_check=True)


def test_linears_become_gemm_for_long_seq_only(tmp_path, exported):
    layer, result = exported("padding")
    assert result.linear_gemms == 4  # QKV, output projection, FFN in, FFN out
    ops = [n.op_type for n in onnx.load(result.path).graph.node]
    assert ops.count("Gemm") == 4 and "MatMul" not in ops
    assert not ExportSpec().resolved_linear_gemm and ExportSpec(linear_gemm=True).resolved_linear_gemm
    off = export_onnx(layer, tmp_path / "o.onnx", ExportSpec(attention="long-seq", linear_gemm=False))
    assert off.linear_gemms == 0 and [n.op_type for n in onnx.load(off.path).graph.node].count("MatMul") == 4
    feed = feed_for(layer, 2, 9, seed=6)
    _assert_close(run_onnx(off.path, feed), eager(layer, feed))


def test_fp16_long_seq_runs_attention_in_float32(tmp_path):
    layer = small_layer("transformer", "padding")
    result = _export(tmp_path, layer, precision="fp16")
    model = onnx.load(result.path)
    mha = [n for n in _all_nodes(model.graph) if n.op_type == "MultiHeadAttention"]
    assert mha and result.linear_gemms == 0  # fp16 Linears stay MatMul + Add
    feed = feed_for(layer, 2, 17, seed=7, fully_masked_row=1)
    got = run_onnx(result.path, feed, dtype=np.float16)
    _assert_close(got, eager(layer, feed), tol=5e-2)


def test_dense_query_key_mask_is_refused(tmp_path):
    class DenseMask(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = MultiHeadAttention(32, 2).eval()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            keep = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu()  # an arbitrary (L, L) mask
            return self.mha(x, mask=keep, need_weights=False)[0]

    with pytest.raises(ExportError, match="use --attention decomposed"):
        export_module(DenseMask(), tmp_path / "x.onnx", ExportSpec(attention="long-seq"), (torch.randn(1, 6, 32),), ["x"], ["y"], {"x": {1: "seq"}})


@pytest.mark.parametrize(
    "kwargs,match",
    [(dict(long_seq_block=0), "long_seq_block"), (dict(long_seq_strategy="flash"), "long_seq_strategy")],
)
def test_spec_validation(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ExportSpec(attention="long-seq", **kwargs)


# --- --attention auto ---------------------------------------------------------------------------


def test_auto_picks_long_seq_on_ort_cpu_from_the_threshold():
    assert choose_attention_form("ort-cpu", LONG_SEQ_MIN_LEN)[0] == "long-seq"
    assert choose_attention_form("ort-cpu", 8192, "causal")[0] == "long-seq"
    form, reason = choose_attention_form("ort-cpu", LONG_SEQ_MIN_LEN - 1)
    assert form == "decomposed" and str(LONG_SEQ_MIN_LEN) in reason
    assert choose_attention_form("ort-cpu", 256, threshold=128)[0] == "long-seq"


@pytest.mark.parametrize("target,form", [("tensorrt", "onnx-attention"), ("jetson", "decomposed"), ("ort-cuda", "ort-contrib")])
def test_auto_keeps_the_target_form_elsewhere(target, form):
    chosen, reason = choose_attention_form(target, 16384)
    assert chosen == form and reason


def test_auto_keeps_linear_memory_layers():
    assert choose_attention_form("ort-cpu", 16384, layer="block-sparse")[0] == "decomposed"


@pytest.mark.parametrize(
    "args,kwargs,match",
    [(("ort-cpu", 0), {}, "max_seq_len"), (("ort-cpu", 512, "diagonal"), {}, "mask"), (("ort-cpu", 512), {"layer": "rnn"}, "layer"), (("tpu", 512), {}, "target")],
)
def test_auto_validates_its_inputs(args, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        choose_attention_form(*args, **kwargs)


def test_masked_layer_mha_masks_are_unchanged_for_the_other_forms(tmp_path):
    layer = MaskedLayer(build_layer("mha", 32, 2, mask="causal"), "causal")
    result = export_onnx(layer, tmp_path / "m.onnx", ExportSpec(attention="ort-contrib"))
    feed = feed_for(layer, 2, 10, seed=8, d_model=32)
    _assert_close(run_onnx(result.path, feed), eager(layer, feed))
