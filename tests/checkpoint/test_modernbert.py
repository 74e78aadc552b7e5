"""ModernBERT, added as one family file (``checkpoint/families/modernbert.py``) over general layers (rotary positions:
``layers/rotary.py``; pre-norm GeGLU layers: ``layers/prenorm.py``; the reference window mask), against transformers'
own ``ModernBertModel`` and its task models.

Random-init models are built and saved by transformers (``save_pretrained``), eager attention: hidden 32, 4 heads,
3 layers with ``global_attn_every_n_layers`` 2 (layers 0 and 2 global, layer 1 local), ``local_attention`` 8 (a
window of |i - j| <= 4), rotary bases 160000 / 10000 as ModernBertConfig's defaults. Q/K/V are scaled up from
transformers' init (std 0.02 gives near-uniform attention, where a wrong position or window would not show) and the
LayerNorm weights moved off 1. The probe batch has rows of 40, 23, 9 and 1 tokens: far longer than the window.
Compared over real tokens at the fp32 bar (cosine >= 0.9999 on every row, max abs <= 1e-4): the eager
re-implementation, the exported ONNX in each attention form ONNX Runtime CPU runs (padded: decomposed, ORT's
MultiHeadAttention, the ONNX ``Attention`` op, long-seq; packed: decomposed and ORT's MultiHeadAttention), and the
CLI's checkpoint path.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hf_models import (
    MAX_ABS,
    MIN_COSINE,
    agreement,
    assert_close,
    assert_matches_transformers,
    assert_onnx_matches_transformers,
    assert_trt_parsable,
    char_tokenizer,
    hf_forward,
    model_cache,
    ours_forward,
    probe,
    transformers_module,
)

from attn_export.checkpoint.fidelity import check_fidelity
from attn_export.checkpoint.loader import encoder_parameter_count, load_bert_checkpoint
from attn_export.errors import CheckpointError
from attn_export.layers.rotary import RotaryEmbedding

PAD = 0
SPECIAL_IDS = dict(pad_token_id=PAD, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)  # inside the tiny vocabulary
SIZES = dict(vocab_size=100, hidden_size=32, num_attention_heads=4, num_hidden_layers=3, intermediate_size=48,
             global_attn_every_n_layers=2, local_attention=8, **SPECIAL_IDS)  # fmt: skip
LENGTHS = (40, 23, 9, 1)
# name -> (transformers model class, config kwargs)
MODELS: dict[str, tuple[str, dict]] = {
    "modernbert": ("ModernBertModel", SIZES),
    "modernbert-seq": ("ModernBertForSequenceClassification", {**SIZES, "num_labels": 3}),
    "modernbert-seq-mean": ("ModernBertForSequenceClassification", {**SIZES, "num_labels": 3, "classifier_pooling": "mean"}),
    "modernbert-token": ("ModernBertForTokenClassification", {**SIZES, "num_labels": 5}),
    "modernbert-biased": ("ModernBertModel", {**SIZES, "attention_bias": True, "mlp_bias": True, "norm_bias": True}),
}


def build(name: str, seed: int = 0):
    """A random-init transformers ModernBERT (eager attention); Q/K/V scaled up, LayerNorms and heads moved off their init."""
    T = transformers_module()
    model_cls, kwargs = MODELS[name]
    torch.manual_seed(seed)
    model = getattr(T, model_cls)(T.ModernBertConfig(**kwargs, attn_implementation="eager")).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.add_(0.1 * torch.randn_like(p))
            elif "Wqkv" in pname:
                p.mul_(15.0)  # scores of a few units: attention far from uniform, so positions and the window show
            elif "classifier" in pname:
                p.mul_(20.0)  # logits of a few units: label agreement means something
            elif pname.endswith("bias"):
                p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (transformers model, its saved folder), built once per module."""
    return model_cache(tmp_path_factory, build)



def _left_padded(ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same rows with their padding on the left: transformers' positions are still arange(S)."""
    ids2, mask2 = np.full_like(ids, PAD), np.zeros_like(mask)
    for r, n in enumerate(mask.sum(1)):
        ids2[r, ids.shape[1] - n:], mask2[r, ids.shape[1] - n:] = ids[r, :n], 1
    return ids2, mask2


def test_rotary_is_transformers_rotary():
    """``RotaryEmbedding`` against transformers' ``ModernBertRotaryEmbedding`` + ``apply_rotary_pos_emb``, both bases, bit for bit."""
    T = transformers_module()
    from transformers.models.modernbert.modeling_modernbert import ModernBertRotaryEmbedding, apply_rotary_pos_emb

    config = T.ModernBertConfig(**SIZES)
    hf = ModernBertRotaryEmbedding(config)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 300, 8, generator=g), torch.randn(2, 4, 300, 8, generator=g)  # (B, H, L, Dh) as transformers holds them
    positions = torch.arange(300)
    for kind, theta in (("full_attention", 160_000.0), ("sliding_attention", 10_000.0)):
        cos, sin = hf(q, positions.unsqueeze(0), kind)
        ref_q, ref_k = apply_rotary_pos_emb(q, k, cos, sin)
        flat = lambda x: x.transpose(1, 2).reshape(2, 300, 32)  # noqa: E731 - (B, L, D), the layout our projections give
        got_q, got_k = RotaryEmbedding(8, theta)(flat(q), flat(k), positions)
        assert torch.equal(got_q, flat(ref_q)) and torch.equal(got_k, flat(ref_k)), kind


def test_rotary_angles_survive_a_half_precision_model():
    """An fp16 export casts the model: the rotary frequencies must stay float32, or an angle at position 8000 is off by radians."""
    positions = torch.arange(8000, 8192)
    half = torch.nn.Sequential(RotaryEmbedding(64, 160_000.0)).half()[0]
    cos, sin = half.cos_sin(positions)
    ref_cos, ref_sin = RotaryEmbedding(64, 160_000.0).cos_sin(positions)
    assert cos.dtype == torch.float32 and torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)


@pytest.mark.parametrize("name", list(MODELS))
def test_eager_matches_transformers(saved, name):
    hf, folder = saved(name)
    ours = load_bert_checkpoint(folder)
    conf = ours.config
    assert (conf.family, conf.positions, conf.layer_kind, conf.local_layers, conf.window_of(1)) == ("modernbert", "rotary", "pre-norm-glu", (1,), 4)
    assert (conf.rope_theta, conf.local_rope_theta) == (160_000.0, 10_000.0)
    assert encoder_parameter_count(conf) == sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())
    ids, mask = probe(PAD, lengths=LENGTHS)
    ref_hidden, ref_logits = hf_forward(hf, ids, mask)
    got = ours_forward(ours, ids, mask)
    assert (conf.head is None) == (ref_logits is None)
    assert_matches_transformers((ref_hidden, ref_logits), got, mask, name)


@pytest.mark.parametrize("change", ["no rotary", "no window", "one theta"])
def test_rotary_and_window_change_the_output(saved, change):
    """The tests can fail: without rotary positions, without the local window, or with the global base on local
    layers, our encoder misses the bar (max abs by more than 10x; the first two the cosine bar too)."""
    hf, folder = saved("modernbert")
    ours = load_bert_checkpoint(folder)
    for layer in ours.layers:
        att = layer.self_attn
        if change == "no rotary":
            att.rotary = None
        elif change == "no window":
            att.window = None
        elif att.window is not None:
            att.rotary = ours.layers[0].self_attn.rotary
    ids, mask = probe(PAD, lengths=LENGTHS)
    cos, err = agreement(hf_forward(hf, ids, mask)[0], ours_forward(ours, ids, mask)[0], mask)
    assert err > 10 * MAX_ABS and (cos < MIN_COSINE or change == "one theta"), (change, cos, err)


@pytest.mark.parametrize("form", ["padded", "packed"])
def test_eager_sdpa_and_left_padding(saved, form):
    """``--attention-impl sdpa`` (the window joined to the mask), padded and packed, on right and left padding."""
    from attn_export.layers.packed import PackedEncoder
    from attn_export.layers.projections import set_attention_impl_

    hf, folder = saved("modernbert-token")
    ours = load_bert_checkpoint(folder)
    assert set_attention_impl_(ours, "sdpa") == 3
    model = ours if form == "padded" else PackedEncoder(ours).eval()
    right = probe(PAD, lengths=LENGTHS)
    for ids, mask in (right, _left_padded(*right)):
        ref_hidden, ref_logits = hf_forward(hf, ids, mask)
        got = ours_forward(model, ids, mask)
        assert_close(ref_hidden, got[0], mask, f"{form} sdpa hidden states")
        assert_close(ref_logits, got[2], mask, f"{form} sdpa logits")


@pytest.mark.parametrize("index", [1, 2])
def test_a_layer_run_alone_is_exact(saved, index):
    """Layer N of a checkpoint (``--layers N``: local layer 1, global layer 2) rotates and windows by itself.

    transformers' ``hidden_states[i]`` is layer i's input; the last one is after ``final_norm``, so
    the last layer's own output is compared through the final norm."""
    hf, folder = saved("modernbert")
    ours = load_bert_checkpoint(folder)
    ids, mask = probe(PAD, lengths=LENGTHS)
    with torch.no_grad():
        states = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True).hidden_states
        got = ours.subject(index)(states[index], torch.from_numpy(mask))
        if index == len(ours.layers) - 1:
            got = ours.final_norm(got)
    assert_close(states[index + 1].numpy(), got.numpy(), mask, f"layer {index} alone")


# the default suite exports the two new paths (long-seq: the window in the O(L) Loop; packed: the window and rotary
# over compact slots); the other forms are @slow (each export is several CPU seconds)
_SLOW = pytest.mark.slow
FORMS = [pytest.param("padded", "decomposed", marks=_SLOW), pytest.param("padded", "ort-contrib", marks=_SLOW),
         pytest.param("padded", "onnx-attention", marks=_SLOW), ("padded", "long-seq"),
         pytest.param("packed", "decomposed", marks=_SLOW), ("packed", "ort-contrib")]  # fmt: skip
_IDS = ["padded-decomposed", "padded-ort-contrib", "padded-onnx-attention", "padded-long-seq", "packed-decomposed", "packed-ort-contrib"]


@pytest.mark.parametrize(("form", "attention"), FORMS, ids=_IDS)
def test_fp32_onnx_matches_transformers(saved, form, attention, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="the exported graph runs on pip install onnxruntime")
    from attn_export.checkpoint.export import export_encoder
    from attn_export.export.spec import ExportSpec

    name = {"packed": "modernbert-token", "long-seq": "modernbert-seq-mean"}.get(form if form == "packed" else attention, "modernbert")
    hf, folder = saved(name)
    ours = load_bert_checkpoint(folder)
    path = tmp_path / "encoder.onnx"
    result = export_encoder(ours, path, ExportSpec(encoder_form=form, attention=attention))
    if attention == "long-seq":  # the local layer in the O(L) query-block Loop, the global ones in the unpadded flash kernel
        assert result.attention_blocks == 3 and sum(n for k, n in result.attention_kernels.items() if k.startswith("chunked")) == 1, result.attention_kernels
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    right = probe(PAD, lengths=LENGTHS)
    batches = [right, _left_padded(*right), probe(PAD, lengths=(17, 3), seed=5)]  # left padding; another batch and length
    assert_onnx_matches_transformers(session, hf, batches, f"{form} {attention}")
    if (form, attention) == ("padded", "decomposed"):  # the form every TensorRT release builds: rotary and GeGLU parse
        assert_trt_parsable(path)


def test_fidelity_check_passes_and_records_the_family_bar(saved):
    _, folder = saved("modernbert-seq-mean")
    result = check_fidelity(load_bert_checkpoint(folder), folder)
    assert result and result.family == "modernbert" and result.reference.startswith("transformers ModernBertForSequenceClassification")
    assert result.tolerance == {"min_cosine": MIN_COSINE, "max_abs": MAX_ABS}


def test_config_defaults_are_transformers_modernbert_config_defaults():
    T = transformers_module()
    from attn_export.checkpoint.families import family_for

    hf = T.ModernBertConfig()
    conf = family_for({"model_type": "modernbert"}).read_config({"model_type": "modernbert"}, "config.json")
    got = (conf.vocab_size, conf.hidden_size, conf.intermediate_size, conf.num_hidden_layers, conf.num_attention_heads, conf.hidden_act,
           conf.max_position_embeddings, conf.layer_norm_eps, conf.pad_token_id, conf.local_attention, conf.attention_bias, conf.mlp_bias, conf.norm_bias)  # fmt: skip
    assert got == (hf.vocab_size, hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers, hf.num_attention_heads, hf.hidden_activation,
                   hf.max_position_embeddings, hf.norm_eps, hf.pad_token_id, hf.local_attention, hf.attention_bias, hf.mlp_bias, hf.norm_bias)  # fmt: skip
    assert conf.local_layers == tuple(i for i, t in enumerate(hf.layer_types) if t == "sliding_attention")
    assert conf.window_of(1) == hf.sliding_window
    assert (conf.rope_theta, conf.local_rope_theta) == (hf.rope_parameters["full_attention"]["rope_theta"], hf.rope_parameters["sliding_attention"]["rope_theta"])


@pytest.mark.parametrize(
    "raw",
    [{"global_attn_every_n_layers": 4, "global_rope_theta": 5e4, "local_rope_theta": 2e3, "num_hidden_layers": 9},  # 4.x, as the Hub's checkpoints
     {"layer_types": ["full_attention", "full_attention", "sliding_attention"], "num_hidden_layers": 3,
      "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e5}, "sliding_attention": {"rope_type": "default", "rope_theta": 7e3}}}],
    ids=["4.x-keys", "5.x-keys"],
)  # fmt: skip
def test_layer_types_and_bases_are_read_as_transformers_reads_them(raw):
    T = transformers_module()
    from attn_export.checkpoint.families import family_for

    hf = T.ModernBertConfig(**raw)
    conf = family_for({"model_type": "modernbert", **raw}).read_config({"model_type": "modernbert", **raw}, "config.json")
    assert conf.local_layers == tuple(i for i, t in enumerate(hf.layer_types) if t == "sliding_attention")
    assert (conf.rope_theta, conf.local_rope_theta) == (hf.rope_parameters["full_attention"]["rope_theta"], hf.rope_parameters["sliding_attention"]["rope_theta"])


def test_a_scaled_rope_type_is_refused_by_name_before_the_weights(saved, tmp_path, monkeypatch):
    from attn_export.checkpoint import loader as loader_module

    _, folder = saved("modernbert")
    raw = json.loads((folder / "config.json").read_text())
    raw["rope_parameters"]["full_attention"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 160000.0}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    monkeypatch.setattr(loader_module, "_weight_files", lambda d: pytest.fail("read the weights of a refused config"))
    with pytest.raises(CheckpointError, match=r"rope_parameters.full_attention: .*scaled rope type\) is not supported") as info:
        load_bert_checkpoint(tmp_path)
    assert "\n" not in str(info.value)


def _char_tokenizer(folder) -> int:
    """A character-level WordPiece tokenizer.json with the tiny config's special ids ([PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3)."""
    return char_tokenizer(folder, ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"], "[CLS]", "[SEP]", "[UNK]", pad=(PAD, "[PAD]"))


@pytest.mark.slow
def test_the_cli_checkpoint_path_passes_on_a_tiny_modernbert(tmp_path):
    """``attn-export --checkpoint DIR``: the fidelity check at load, the export (padded and packed) and the judge, as a user runs it."""
    from attn_export.cli import main

    T = transformers_module()
    folder = tmp_path / "modernbert"
    folder.mkdir()
    vocab = _char_tokenizer(folder)
    torch.manual_seed(0)
    T.ModernBertModel(T.ModernBertConfig(**{**SIZES, "vocab_size": vocab})).eval().save_pretrained(str(folder))
    run = ["--repeats", "1", "--warmup", "0", "--batch", "2", "--seq-len", "16", "--max-texts", "16", "--threads", "1", "--quiet"]
    assert main(["--checkpoint", str(folder), "--out", str(tmp_path / "out"), *run]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    model = report["model"]
    assert model["family"] == "modernbert" and model["reference"].startswith("transformers ModernBertModel")
    assert model["fidelity"]["passed"] and model["fidelity"]["outputs"]["last_hidden_state"]["min_cosine"] >= MIN_COSINE
    assert report["verdict"]["passed"], report["verdict"]
