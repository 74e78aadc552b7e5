"""The packed (padding-free) encoder form equals the padded encoder, eager and exported, for every mask pattern."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from attn_export.checkpoint.export import export_encoder
from attn_export.errors import ConfigError
from attn_export.export import ExportSpec
from attn_export.export.passes.linear_gemm import gemm_to_linear
from attn_export.layers.encoder import EncoderConfig, SentenceEncoder
from attn_export.layers.packed import PackedEncoder, PackedIndex
from attn_export.layers.projections import set_attention_impl_
from attn_export.layers.transformer import TransformerLayer

CONFIG = EncoderConfig(vocab_size=2048, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,  # 2048 x 32: the word table is large enough for int8 rows
                       intermediate_size=64, max_position_embeddings=64)  # fmt: skip
ATOL_HIDDEN = 2e-5  # fp32: the packed form sums in another order (attention over W <= S keys)
ATOL_EMBEDDING = 2e-6


def _lengths_mask(lengths: list[int], seq: int) -> np.ndarray:
    return (np.arange(seq)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)


def _masks() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    holes = rng.integers(0, 2, (4, 12))
    holes[:, 0] = 1
    one_token = np.zeros((4, 12), np.int64)
    one_token[2, 5] = 1
    return {
        "no padding": np.ones((4, 12), np.int64),
        "right padding": _lengths_mask([12, 3, 1, 7], 12),
        "left padding": 1 - _lengths_mask([0, 9, 11, 4], 12),
        "holes": holes.astype(np.int64),
        "all rows padded but one token": one_token,
        "one-token rows": _lengths_mask([1, 1, 1, 1], 12),
        "a row with no token": _lengths_mask([5, 0, 1, 12], 12),
        "B=1": _lengths_mask([9], 12),
        "B=1, one token": _lengths_mask([1], 12),
        "no real token at all": np.zeros((3, 5), np.int64),
    }


MASKS = _masks()


def seeded_encoder() -> SentenceEncoder:
    """A small encoder with every gain and bias perturbed (shared with test_packed_trt)."""
    torch.manual_seed(0)
    enc = SentenceEncoder(CONFIG).eval()
    with torch.no_grad():  # LayerNorm gains/biases away from 1/0, so a wrong row shows
        for p in enc.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return enc


encoder = pytest.fixture(scope="module")(seeded_encoder)


def _ids(mask: np.ndarray, seed: int = 1) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(1, CONFIG.vocab_size, mask.shape)
    return np.where(mask > 0, ids, CONFIG.pad_token_id).astype(np.int64)


def _check(name: str, hidden: np.ndarray, emb: np.ndarray, ref_hidden: np.ndarray, ref_emb: np.ndarray, mask: np.ndarray) -> None:
    keep = mask.astype(bool)
    assert np.isfinite(hidden).all() and np.isfinite(emb).all(), f"{name}: non-finite outputs"
    assert hidden.shape == ref_hidden.shape and emb.shape == ref_emb.shape, f"{name}: shapes {hidden.shape}, {emb.shape}"
    err_h = float(np.abs(hidden[keep] - ref_hidden[keep]).max()) if keep.any() else 0.0
    err_e = float(np.abs(emb - ref_emb).max())
    assert err_h <= ATOL_HIDDEN, f"{name}: last_hidden_state at real tokens differs by {err_h:.3g} > {ATOL_HIDDEN}"
    assert err_e <= ATOL_EMBEDDING, f"{name}: sentence_embedding differs by {err_e:.3g} > {ATOL_EMBEDDING}"
    assert not np.any(hidden[~keep]), f"{name}: last_hidden_state is not zero at padded positions"


def _padded(encoder: SentenceEncoder, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        h, e = encoder(torch.from_numpy(ids), torch.from_numpy(mask))
    return h.numpy(), e.numpy()


@pytest.mark.parametrize("name", list(MASKS))
@pytest.mark.parametrize("impl", ["math", "sdpa"])
def test_eager_packed_equals_padded(encoder: SentenceEncoder, name: str, impl: str) -> None:
    mask = MASKS[name]
    ids = _ids(mask)
    ref_h, ref_e = _padded(encoder, ids, mask)
    packed = PackedEncoder(encoder)
    set_attention_impl_(packed, impl)
    try:
        with torch.no_grad():
            h, e = packed(torch.from_numpy(ids), torch.from_numpy(mask))
    finally:
        set_attention_impl_(encoder, "math")
    _check(f"{name} ({impl})", h.numpy(), e.numpy(), ref_h, ref_e, mask)


def test_index_addresses_every_real_token_once() -> None:
    mask = torch.from_numpy(MASKS["holes"])
    index = PackedIndex.from_mask(mask)
    t = int(mask.sum())
    assert index.rows.tolist() == torch.nonzero(mask.reshape(-1)).squeeze(1).tolist()
    assert index.width == int(mask.sum(1).max())
    slots = index.slot.reshape(-1)
    real = slots[slots < t]
    assert sorted(real.tolist()) == list(range(t)), "every real token must have exactly one attention slot"
    assert torch.equal(slots[index.back[:t]], torch.arange(t)), "each row must read its own slot back"
    assert index.back[t] == index.back[0], "the spare row reads what the first real token reads"


FORMS = {  # the packed graph's attention: decomposed (TensorRT), ORT's MHA with the key-count mask (CUDA), mask-free (CPU flash)
    "decomposed": ExportSpec(attention="decomposed", encoder_form="packed"),
    "ort-contrib": ExportSpec(attention="ort-contrib", encoder_form="packed"),
    "ort-contrib-mask-free": ExportSpec(attention="ort-contrib", encoder_form="packed", mask_free_attention=True),
    "ort-contrib-mask-free-unfused": ExportSpec(attention="ort-contrib", encoder_form="packed", mask_free_attention=True, fuse_qkv=False),
}


@pytest.fixture(scope="module", params=list(FORMS))
def exported(request: pytest.FixtureRequest, encoder: SentenceEncoder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("packed") / f"packed_{request.param}.onnx"
    result = export_encoder(encoder, path, FORMS[request.param])
    assert result.input_names == ["input_ids", "attention_mask"]
    assert result.output_names == ["last_hidden_state", "sentence_embedding"]
    assert result.mask_free_attention == (CONFIG.num_hidden_layers if "mask-free" in request.param else 0)
    return path


def _session(path: Path, optimized: Path | None = None):  # noqa: ANN202 - an onnxruntime.InferenceSession
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    if optimized is not None:
        so.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def test_exported_packed_equals_padded(encoder: SentenceEncoder, exported: Path) -> None:
    sess = _session(exported)  # one graph for every batch size, length and mask pattern
    for name, mask in MASKS.items():
        ids = _ids(mask)
        ref_h, ref_e = _padded(encoder, ids, mask)
        h, e = sess.run(None, {"input_ids": ids, "attention_mask": mask})
        _check(f"{exported.stem}: {name}", h, e, ref_h, ref_e, mask)


def test_exported_packed_graph_runs_rows_and_stays_plain(exported: Path, tmp_path: Path) -> None:
    """GEMMs are 2-D MatMuls on rows (what the int8 quantizer reads), and a plain session fuses no SkipLayerNormalization."""
    ops = [n.op_type for n in onnx.load(str(exported)).graph.node]
    assert "NonZero" in ops and "Gemm" not in ops
    assert ops.count("MatMul") >= 4 * CONFIG.num_hidden_layers  # QKV, O, FFN in, FFN out per layer
    optimized = tmp_path / "optimized.onnx"
    _session(exported, optimized)
    fused = [n.op_type for n in onnx.load(str(optimized)).graph.node]
    assert "SkipLayerNormalization" not in fused, "a plain ORT session fused SkipLayerNormalization into the packed graph"
    assert ("MultiHeadAttention" in fused) == ("ort-contrib" in exported.stem)
    mha_inputs = [len([i for i in n.input if i]) for n in onnx.load(str(optimized)).graph.node if n.op_type == "MultiHeadAttention"]
    if "ort-contrib" in exported.stem:  # q, k, v and the key counts; mask-free: q, k, v only (what the CPU flash kernel needs)
        assert mha_inputs == [3 if "mask-free" in exported.stem else 4] * CONFIG.num_hidden_layers, mha_inputs


def test_mask_free_attention_widens_q_and_k_only_and_masks_keys_through_an_appended_row(encoder: SentenceEncoder, tmp_path: Path) -> None:
    """Per head one Q channel at 1 and one K channel at 0; the padded key slots read the appended row (-10000 there)."""
    from attn_export.export.passes.mask_free_attention import MASKED_KEY

    path = tmp_path / "mask_free.onnx"
    export_encoder(encoder, path, FORMS["ort-contrib-mask-free-unfused"])
    graph = onnx.load(str(path)).graph
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    d, heads = CONFIG.hidden_size, CONFIG.num_attention_heads
    dh = d // heads
    q_w, k_w, v_w = (weights[f"encoder.layers.0.self_attn.w_{p}.weight"] for p in "qkv")  # MatMul (K, N) after gemm_to_linear
    q_b, k_b = weights["encoder.layers.0.self_attn.w_q.bias"], weights["encoder.layers.0.self_attn.w_k.bias"]
    assert q_w.shape == k_w.shape == (d, heads * (dh + 1)) and v_w.shape == (d, d)
    extra = np.arange(heads) * (dh + 1) + dh
    assert not q_w[:, extra].any() and not k_w[:, extra].any()
    assert np.all(q_b[extra] == 1.0) and not k_b[extra].any()
    np.testing.assert_array_equal(np.delete(q_w, extra, axis=1), encoder.layers[0].self_attn.w_q.weight.detach().numpy().T)
    masked = [a for n, a in weights.items() if n.endswith("_masked_key")]
    assert len(masked) == CONFIG.num_hidden_layers and all(np.all(m[0, extra] == MASKED_KEY) and np.count_nonzero(m) == heads for m in masked)
    mha = [n for n in graph.node if n.op_type == "MultiHeadAttention"]
    scale = [a.f for n in mha for a in n.attribute if a.name == "scale"]
    assert scale == pytest.approx([1 / np.sqrt(dh)] * CONFIG.num_hidden_layers), "the scale stays 1/sqrt(Dh), not 1/sqrt(Dh + 1)"


def test_mask_free_attention_is_exact_without_the_flash_kernel_too(encoder: SentenceEncoder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ONNX Runtime does not take its flash path (no L2 size known, or turned off), the unmasked kernel reads the same channels."""
    path = tmp_path / "mask_free.onnx"
    export_encoder(encoder, path, FORMS["ort-contrib-mask-free"])
    monkeypatch.setenv("ORT_DISABLE_FLASH_ATTENTION", "1")  # read when the kernel is built (contrib_ops/cpu/bert/multihead_attention.cc)
    sess = _session(path)
    for name in ("right padding", "holes", "all rows padded but one token", "a row with no token", "no real token at all"):
        mask = MASKS[name]
        ids = _ids(mask)
        ref_h, ref_e = _padded(encoder, ids, mask)
        h, e = sess.run(None, {"input_ids": ids, "attention_mask": mask})
        _check(f"no flash: {name}", h, e, ref_h, ref_e, mask)


_AVX2_RUN = """
import sys, numpy as np, onnxruntime as ort
so = ort.SessionOptions(); so.intra_op_num_threads = 2
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
d = np.load(sys.argv[2])
out = {}
for k in [k for k in d if k.startswith("ids")]:
    i = k[3:]
    out["h" + i], out["e" + i] = s.run(None, {"input_ids": d[k], "attention_mask": d["mask" + i]})
np.savez(sys.argv[3], **out)
"""


@pytest.mark.skipif(shutil.which("qemu-x86_64") is None, reason="qemu-user is not installed (apt-get install qemu-user)")
def test_mask_free_attention_is_exact_on_avx2_kernels_under_qemu(encoder: SentenceEncoder, tmp_path: Path) -> None:
    """ONNX Runtime's AVX2 kernels (qemu -cpu Haswell: no AVX-512) run the mask-free graph to the same tolerance."""
    path = tmp_path / "mask_free.onnx"
    export_encoder(encoder, path, FORMS["ort-contrib-mask-free"])
    names = ("right padding", "holes", "a row with no token", "no real token at all", "B=1, one token")
    feeds = {}
    for i, name in enumerate(names):
        feeds[f"ids{i}"], feeds[f"mask{i}"] = _ids(MASKS[name]), MASKS[name]
    np.savez(tmp_path / "feeds.npz", **feeds)
    (tmp_path / "run.py").write_text(_AVX2_RUN)
    proc = subprocess.run(["qemu-x86_64", "-cpu", "Haswell", os.path.realpath(sys.executable), str(tmp_path / "run.py"), str(path), str(tmp_path / "feeds.npz"),
                           str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=300)  # fmt: skip
    if proc.returncode != 0 and "qemu" in proc.stderr and not (tmp_path / "out.npz").exists():
        pytest.skip(f"qemu could not run Python here: {proc.stderr.strip().splitlines()[-1:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = np.load(tmp_path / "out.npz")
    for i, name in enumerate(names):
        mask = MASKS[name]
        ref_h, ref_e = _padded(encoder, feeds[f"ids{i}"], mask)
        _check(f"AVX2: {name}", out[f"h{i}"], out[f"e{i}"], ref_h, ref_e, mask)


def test_mask_free_attention_leaves_a_padded_graphs_attention_alone(encoder: SentenceEncoder, tmp_path: Path) -> None:
    """The padded form's MHA reads (B, S) projections, not row Gathers: nothing to rewrite, the mask stays."""
    result = export_encoder(encoder, tmp_path / "padded.onnx", ExportSpec(attention="ort-contrib", mask_free_attention=True))
    assert result.mask_free_attention == 0


@pytest.mark.parametrize("mask_free", [False, True], ids=["masked", "mask-free"])
def test_int8_dynamic_route_quantizes_the_packed_rows(encoder: SentenceEncoder, tmp_path: Path, mask_free: bool) -> None:
    from attn_export.compress.quant.onnx import quantize_dynamic_onnx

    fp32 = tmp_path / "packed.onnx"
    export_encoder(encoder, fp32, ExportSpec(attention="ort-contrib", encoder_form="packed", fuse_qkv=False, linear_gemm=False, mask_free_attention=mask_free))
    out = tmp_path / "packed.int8.onnx"
    result = quantize_dynamic_onnx(fp32, out, per_channel=True, quantize_embeddings=True, fuse=True)
    ops = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert ops.count("MatMulInteger") == 6 * CONFIG.num_hidden_layers, f"every Linear quantized, got {ops.count('MatMulInteger')}"
    assert result.embeddings["tables"], "the word/position tables of the packed graph are found and stored as int8 rows"
    sess = _session(out)
    for name in ("right padding", "a row with no token", "no real token at all"):
        mask = MASKS[name]
        ids = _ids(mask)
        _, ref_e = _padded(encoder, ids, mask)
        _, e = sess.run(None, {"input_ids": ids, "attention_mask": mask})
        assert np.isfinite(e).all()
        real = mask.sum(1) > 0
        cos = (e[real] * ref_e[real]).sum(-1)
        assert cos.size == 0 or cos.min() > 0.99, f"{name}: int8 packed cosine {cos.min():.4f} <= 0.99"


def test_gemm_to_linear_keeps_the_product(tmp_path: Path) -> None:
    import onnx_ir as ir
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["t", 5])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])  # fmt: skip
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    assert gemm_to_linear(model) == 1
    path = tmp_path / "mm.onnx"
    ir.save(model, path)
    assert [n.op_type for n in onnx.load(str(path)).graph.node] == ["MatMul", "Add"]
    x = rng.standard_normal((4, 3)).astype(np.float32)
    (y,) = _session(path).run(None, {"x": x})
    np.testing.assert_allclose(y, x @ w.T + b, rtol=1e-5, atol=1e-5)


def test_packed_form_refuses_what_it_cannot_run(encoder: SentenceEncoder) -> None:
    with pytest.raises(ConfigError, match="decomposed, ort-contrib, trt-packed for the packed encoder form"):
        ExportSpec(attention="long-seq", encoder_form="packed")
    with pytest.raises(ConfigError, match="encoder form"):
        ExportSpec(encoder_form="ragged")
    causal = SentenceEncoder(CONFIG)
    causal.layers[0] = TransformerLayer(CONFIG.hidden_size, CONFIG.num_attention_heads, d_ffn=CONFIG.intermediate_size, causal=True)
    with pytest.raises(ConfigError, match="bidirectional self-attention"):
        PackedEncoder(causal)


def test_a_local_window_is_applied_over_the_slots_positions(encoder: SentenceEncoder) -> None:
    """A windowed layer in the packed form windows by grid positions (|pos_i - pos_j| <= w), so it equals the padded
    model on every padding pattern, holes included; without that window it would not."""
    windowed = SentenceEncoder(CONFIG).eval()
    windowed.load_state_dict(encoder.state_dict())
    for layer in windowed.layers:
        layer.self_attn.window = 2
    packed = PackedEncoder(windowed).eval()
    worst = 0.0
    for name, mask in MASKS.items():
        ids, m = torch.from_numpy(_ids(mask)), torch.from_numpy(mask)
        with torch.no_grad():
            ref_h, ref_e = windowed(ids, m)
            h, e = packed(ids, m)
            global_h, _ = encoder(ids, m)
        keep = m.bool()
        _check(name, h.numpy(), e.numpy(), ref_h.numpy(), ref_e.numpy(), mask)
        worst = max(worst, float((global_h[keep] - ref_h[keep]).abs().max())) if keep.any() else worst
    assert worst > 100 * ATOL_HIDDEN, f"the window changed nothing (max abs {worst:.2e}): the test could not fail"


def test_fp16_packed_export_equals_the_padded_fp16_export(encoder: SentenceEncoder, tmp_path: Path) -> None:
    padded, packed = tmp_path / "padded16.onnx", tmp_path / "packed16.onnx"
    export_encoder(encoder, padded, ExportSpec(precision="fp16"))
    export_encoder(encoder, packed, ExportSpec(precision="fp16", encoder_form="packed"))
    ref_sess, sess = _session(padded), _session(packed)
    for name in ("right padding", "holes", "a row with no token", "no real token at all"):
        mask = MASKS[name]
        feed = {"input_ids": _ids(mask), "attention_mask": mask}
        (ref_e,) = ref_sess.run(["sentence_embedding"], feed)
        h, e = sess.run(None, feed)
        assert h.dtype == np.float16 and e.dtype == np.float32 and np.isfinite(e).all()
        err = float(np.abs(e - ref_e).max())
        assert err <= 2e-3, f"{name}: fp16 packed sentence_embedding differs from the padded fp16 export by {err:.3g}"



@pytest.fixture(scope="module")
def packed_for_tensorrt(encoder: SentenceEncoder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packed form as a TensorRT target would take it: decomposed attention (MultiHeadAttention is ONNX Runtime's)."""
    path = tmp_path_factory.mktemp("packed-trt") / "packed_decomposed.onnx"
    export_encoder(encoder, path, ExportSpec(attention="decomposed", encoder_form="packed"))
    return path


@pytest.mark.parametrize("version", ["10.3", "10.14", "11.4"])
def test_packed_decomposed_graph_passes_check_trt(packed_for_tensorrt: Path, version: str) -> None:
    """Its index math uses dtypes TensorRT's parser takes (NonZero/CumSum on float, no int64 Clip), so check-trt finds no
    error for each release. Whether TensorRT builds its data-dependent shapes (NonZero -> T rows) needs a GPU."""
    from attn_export.checks.trt_compat import check_trt_compat
    from attn_export.runtime.tensorrt.spec import ShapeProfile

    report = check_trt_compat(packed_for_tensorrt, version, ShapeProfile((1, 1), (8, 128), (32, 512)), "fp32")
    assert report and not report.errors, str(report)
