"""DeBERTa-v2/v3, added as one family file (``checkpoint/families/deberta_v2.py``) over a general disentangled
attention (``layers/disentangled.py``) and token convolution (``layers/token_conv.py``), against transformers'
own ``DebertaV2Model``.

Random-init models are built and saved by transformers (``save_pretrained``): hidden 32, 2 layers, 4 heads,
v3 settings (relative attention, 16 log position buckets up to 64 relative positions, c2p and p2c, a
LayerNorm'd relative table, shared keys, no absolute positions, no token types), and a v2-xlarge-like one
with the convolution after layer 0, absolute positions, token types and factorised embeddings
(``embed_proj``). The relative table is scaled up (transformers initialises it near 0, where a wrong
bucket would not show), and so are the query/key projections (at their init every score is ~1e-2 and the
softmax near uniform, where a wrong term would not show). The probe rows of 80, 20, 9 and 1 tokens reach the exact distances (< 8), the
log buckets and beyond ``max_relative_positions``. Compared over real tokens at the fp32 bar (cosine
>= 0.9999 on every row, max abs <= 1e-4): eager, and the exported ONNX in each attention form ONNX
Runtime CPU runs (padded: decomposed, ORT's MultiHeadAttention, the ONNX ``Attention`` op; packed:
decomposed and ORT's MultiHeadAttention).
"""

from __future__ import annotations

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
    hf_forward,
    model_cache,
    ours_forward,
    probe,
    transformers_module,
)

from attn_export.checkpoint.fidelity import check_fidelity
from attn_export.checkpoint.loader import encoder_parameter_count, load_bert_checkpoint
from attn_export.errors import CheckpointError, ExportError
from attn_export.layers.disentangled import DisentangledSelfAttention, log_bucket_position

PAD = 0  # DebertaV2Config's pad_token_id
V3 = dict(vocab_size=100, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, max_position_embeddings=96,
          relative_attention=True, position_buckets=16, max_relative_positions=64, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
          share_att_key=True, position_biased_input=False, type_vocab_size=0)  # fmt: skip
V2_CONV = {**V3, "conv_kernel_size": 3, "position_biased_input": True, "type_vocab_size": 2, "embedding_size": 16, "pos_att_type": "p2c|c2p"}
LENGTHS = (80, 20, 9, 1)
# name -> (transformers model class, config kwargs)
MODELS: dict[str, tuple[str, dict]] = {
    "v3": ("DebertaV2Model", V3),
    "v2-conv": ("DebertaV2Model", V2_CONV),
    "v3-seq": ("DebertaV2ForSequenceClassification", {**V3, "num_labels": 3}),
    "v3-token": ("DebertaV2ForTokenClassification", {**V3, "num_labels": 5}),
}


def build(name: str, seed: int = 0):
    """A random-init transformers DeBERTa-v2; LayerNorms, heads and the relative table moved off their init."""
    T = transformers_module()
    model_cls, kwargs = MODELS[name]
    torch.manual_seed(seed)
    model = getattr(T, model_cls)(T.DebertaV2Config(**kwargs)).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "LayerNorm" in pname:
                p.add_(0.1 * torch.randn_like(p))
            elif "classifier" in pname or "pooler" in pname:
                p.mul_(20.0)  # logits of a few units: label agreement means something
            elif "rel_embeddings" in pname:
                p.copy_(torch.randn_like(p))  # table rows that differ: a wrong bucket shows
            elif "query_proj.weight" in pname or "key_proj.weight" in pname:
                p.mul_(10.0)  # scores of a few units (not ~1e-2, a near-uniform softmax): a wrong term shows
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (transformers model, its saved folder), built once per module."""
    return model_cache(tmp_path_factory, build)



@pytest.mark.parametrize(("buckets", "max_position"), [(16, 64), (256, 512)])
def test_buckets_are_transformers_buckets(buckets, max_position):
    transformers_module()
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    relative = torch.arange(-1200, 1201)
    got = log_bucket_position(relative, buckets, max_position)
    assert torch.equal(got, make_log_bucket_position(relative, buckets, max_position).to(torch.long))
    assert int(got.max()) > buckets // 2, "the probe range reaches the log buckets"


def test_the_disentangled_terms_change_the_output(saved):
    """The test can fail: without the c2p/p2c terms (the scale kept) our encoder is off transformers' by far more than the bar."""
    hf, folder = saved("v3")
    ours = load_bert_checkpoint(folder)
    attns = [layer.self_attn for layer in ours.layers]
    assert all(isinstance(a, DisentangledSelfAttention) and a.relative is ours.relative for a in attns), "one relative table for every layer"
    ids, mask = probe(PAD, lengths=LENGTHS)
    ref = hf_forward(hf, ids, mask)[0]
    assert_close(ref, ours_forward(ours, ids, mask)[0], mask, "with the terms")
    for a in attns:
        a.relative = None
    cos, err = agreement(ref, ours_forward(ours, ids, mask)[0], mask)
    assert err > 100 * MAX_ABS, (cos, err)  # the residual stream keeps the cosine high; the values are off by 200x the bar


@pytest.mark.parametrize("name", list(MODELS))
def test_eager_matches_transformers(saved, name):
    hf, folder = saved(name)
    ours = load_bert_checkpoint(folder)
    conf = ours.config
    assert conf.family == "deberta-v2" and conf.disentangled is not None and conf.disentangled.terms == ("c2p", "p2c")
    assert conf.positions == ("absolute" if name == "v2-conv" else "none") and (ours.conv is not None) == (name == "v2-conv")
    assert encoder_parameter_count(conf) == sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())
    ids, mask = probe(PAD, lengths=LENGTHS)
    ref_hidden, ref_logits = hf_forward(hf, ids, mask)
    got = ours_forward(ours, ids, mask)
    assert (conf.head is None) == (ref_logits is None)
    assert_matches_transformers((ref_hidden, ref_logits), got, mask, name)


@pytest.mark.parametrize("form", ["padded", "packed"])
def test_eager_sdpa_and_packed_take_the_terms_too(saved, form):
    """``--attention-impl sdpa`` (the terms joined to the mask) padded and packed, on the model with the convolution."""
    from attn_export.layers.packed import PackedEncoder
    from attn_export.layers.projections import set_attention_impl_

    hf, folder = saved("v2-conv")
    ours = load_bert_checkpoint(folder)
    assert set_attention_impl_(ours, "sdpa") == 2
    model = ours if form == "padded" else PackedEncoder(ours).eval()
    ids, mask = probe(PAD, lengths=LENGTHS)
    assert_close(hf_forward(hf, ids, mask)[0], ours_forward(model, ids, mask)[0], mask, f"{form} sdpa hidden states")


@pytest.mark.parametrize("name", ["v3", "v2-conv"])
def test_a_layer_run_alone_computes_its_terms_itself(saved, name):
    """Layer N of a checkpoint (what ``--layers N``, low-rank and distillation fit) is exact without the encoder around it."""
    hf, folder = saved(name)
    ours = load_bert_checkpoint(folder)
    ids, mask = probe(PAD, lengths=LENGTHS)
    with torch.no_grad():
        states = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True).hidden_states
        got = ours.subject(1)(states[1], torch.from_numpy(mask))
    assert_close(states[2].numpy(), got.numpy(), mask, f"{name} layer 1 alone")


# (form, attention, model): the decomposed forms (the disentangled terms' own Gathers and MatMuls) run the convolution
# model in the default suite; the fused kernels take the terms as an additive bias, the path MPNet's default tests
# already run, so with a head they are slow-marked (each export is ~14 s of CPU)
FORMS = [
    ("padded", "decomposed", "v2-conv"),
    ("packed", "decomposed", "v2-conv"),
    pytest.param("padded", "ort-contrib", "v3-seq", marks=pytest.mark.slow),
    pytest.param("padded", "onnx-attention", "v3-seq", marks=pytest.mark.slow),
    pytest.param("packed", "ort-contrib", "v3-token", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("form", "attention", "name"), FORMS, ids=["padded-decomposed", "packed-decomposed", "padded-ort-contrib",
                                                                     "padded-onnx-attention", "packed-ort-contrib"])  # fmt: skip
def test_fp32_onnx_matches_transformers(saved, form, attention, name, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="the exported graph runs on pip install onnxruntime")
    from attn_export.checkpoint.export import export_encoder
    from attn_export.export.spec import ExportSpec

    hf, folder = saved(name)
    path = tmp_path / f"{name}.onnx"
    export_encoder(load_bert_checkpoint(folder), path, ExportSpec(encoder_form=form, attention=attention))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    batches = [probe(PAD, lengths=lengths, seed=seed) for lengths, seed in ((LENGTHS, 1), ((7, 3), 5))]  # another batch and length: dynamic axes
    assert_onnx_matches_transformers(session, hf, batches, f"{name} {form} {attention}")
    if attention == "decomposed":  # the form every TensorRT release builds: v2's convolution and buckets parse too
        assert_trt_parsable(path)


def test_the_long_seq_form_is_refused_and_the_plan_keeps_the_targets_form(saved, tmp_path):
    from attn_export.checkpoint.export import export_encoder
    from attn_export.config.run import RunConfig
    from attn_export.export.spec import ExportSpec
    from attn_export.pipeline.plan import make_plan

    _, folder = saved("v3")
    with pytest.raises(ExportError, match=r"long-seq .*relative position bias.*use --attention decomposed"):
        export_encoder(load_bert_checkpoint(folder), tmp_path / "x.onnx", ExportSpec(attention="long-seq"))
    assert not (tmp_path / "x.onnx").exists()
    plan = make_plan(RunConfig(checkpoint=str(folder), seq_len=512, encoder_form="padded"))  # long-seq for a BERT (test_mpnet)
    assert plan.fp32_spec.attention == "decomposed"


def test_fidelity_check_passes_and_records_the_family_bar(saved):
    _, folder = saved("v3-seq")
    result = check_fidelity(load_bert_checkpoint(folder), folder)
    assert result and result.family == "deberta-v2" and result.reference.startswith("transformers DebertaV2ForSequenceClassification")
    assert result.tolerance == {"min_cosine": MIN_COSINE, "max_abs": MAX_ABS}


def test_config_defaults_are_transformers_deberta_v2_config_defaults():
    T = transformers_module()
    from attn_export.checkpoint.families import family_for

    hf = T.DebertaV2Config()
    raw = {"model_type": "deberta-v2", **{k: getattr(hf, k) for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")}}
    conf = family_for(raw).read_config(raw, "config.json")
    got = (conf.hidden_act, conf.max_position_embeddings, conf.layer_norm_eps, conf.pad_token_id, conf.type_vocab_size, conf.positions, conf.embedding_size)
    assert got == (hf.hidden_act, hf.max_position_embeddings, hf.layer_norm_eps, hf.pad_token_id, hf.type_vocab_size, "absolute", None)
    dis = conf.disentangled
    assert dis is not None and (dis.relative, dis.terms, dis.scale_factor, dis.norm) == (hf.relative_attention, (), 1, False)
    assert (dis.span, dis.max_relative_positions) == (hf.max_position_embeddings, hf.max_position_embeddings)  # max_relative_positions -1


@pytest.mark.parametrize(
    ("change", "named"),
    [({"share_att_key": False}, r"share_att_key False \(deberta-v2 with separate position projections"),
     ({"pos_att_type": ["c2p", "p2p"]}, r"pos_att_type \['c2p', 'p2p'\] \(deberta-v2 with a relative attention term"),
     ({"pooler_hidden_act": "tanh"}, r"pooler_hidden_act 'tanh' \(deberta-v2 with a ContextPooler activation")],
    ids=["unshared-keys", "p2p", "pooler-act"],
)  # fmt: skip
def test_what_is_not_reproduced_is_refused_by_name_before_the_weights(tmp_path, monkeypatch, change, named):
    import json

    from attn_export.checkpoint import loader as loader_module

    T = transformers_module()
    folder = tmp_path / "ckpt"
    T.DebertaV2Config(**V3).save_pretrained(str(folder))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    monkeypatch.setattr(loader_module, "_weight_files", lambda d: pytest.fail("read the weights of a refused config"))
    with pytest.raises(CheckpointError, match=named) as info:
        load_bert_checkpoint(folder)
    assert "\n" not in str(info.value)


def test_an_unused_position_table_is_dropped_as_transformers_drops_it(saved, tmp_path):
    """v3 checkpoints keep ``embeddings.position_embeddings`` that ``position_biased_input: false`` leaves unused
    (``_keys_to_ignore_on_load_unexpected``): dropped, not refused; the model is unchanged."""
    import shutil

    from safetensors.torch import load_file, save_file

    hf, folder = saved("v3")
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({**tensors, "embeddings.position_embeddings.weight": torch.randn(96, 32)}, str(tmp_path / "model.safetensors"))
    ours = load_bert_checkpoint(tmp_path)
    assert ours.embeddings.position_embeddings is None
    ids, mask = probe(PAD, lengths=LENGTHS)
    assert_close(hf_forward(hf, ids, mask)[0], ours_forward(ours, ids, mask)[0], mask, "with an unused position table")
