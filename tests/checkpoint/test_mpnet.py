"""MPNet, added as one family file (``checkpoint/families/mpnet.py``) over a general relative position bias
(``layers/position_bias.py``), against transformers' own ``MPNetModel``.

Random-init models are built and saved by transformers (``save_pretrained``): hidden 64, 2 layers,
4 heads, 32 relative attention buckets, the bias table scaled up (transformers initialises it
near 0, where a wrong bucket would not show). The probe batch has rows of 150, 20, 9 and 1 tokens:
relative distances in the exact buckets, the log-spaced ones and beyond ``max_distance`` 128.
Compared over real tokens at the fp32 bar (cosine >= 0.9999 on every row, max abs <= 1e-4): the
eager re-implementation, the exported ONNX in each attention form ONNX Runtime CPU runs (padded:
decomposed, ORT's MultiHeadAttention, the ONNX ``Attention`` op; packed: decomposed and ORT's
MultiHeadAttention) and the CLI's normal checkpoint path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

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
from attn_export.errors import CheckpointError, ExportError
from attn_export.layers.position_bias import RelativePositionBias, relative_position_bucket

PAD = 1  # MPNetEmbeddings' padding_idx
SIZES = dict(vocab_size=100, hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128,
             max_position_embeddings=160, relative_attention_num_buckets=32)  # fmt: skip
LENGTHS = (150, 20, 9, 1)
# name -> (transformers model class, config kwargs)
MODELS: dict[str, tuple[str, dict]] = {
    "mpnet": ("MPNetModel", SIZES),
    "mpnet-seq": ("MPNetForSequenceClassification", {**SIZES, "num_labels": 3}),
    "mpnet-token": ("MPNetForTokenClassification", {**SIZES, "num_labels": 5}),
}


def build(name: str, seed: int = 0):
    """A random-init transformers MPNet; LayerNorms, heads and the relative bias table moved off their init."""
    T = transformers_module()
    model_cls, kwargs = MODELS[name]
    torch.manual_seed(seed)
    model = getattr(T, model_cls)(T.MPNetConfig(**kwargs)).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "LayerNorm" in pname:
                p.add_(0.1 * torch.randn_like(p))
            elif "classifier" in pname:
                p.mul_(20.0)  # logits of a few units: label agreement means something
            elif "relative_attention_bias" in pname:
                p.copy_(3.0 * torch.randn_like(p))  # a score bias of a few units per bucket: a wrong bucket shows
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (transformers model, its saved folder), built once per module."""
    return model_cache(tmp_path_factory, build)



def test_buckets_are_transformers_buckets():
    transformers_module()
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    relative = torch.arange(-300, 301)
    got = relative_position_bucket(relative, 32, 128)
    assert torch.equal(got, MPNetEncoder.relative_position_bucket(relative, num_buckets=32, max_distance=128))
    # every bucket is reached over +-300 but 16: distance 0 is the lower half's bucket 0, so the upper half starts at 1
    assert set(got.tolist()) == set(range(32)) - {16}


def test_the_bias_changes_the_output(saved):
    """The test can fail: without the bias (its table zeroed) our encoder is off transformers' by far more than the bar."""
    hf, folder = saved("mpnet")
    ours = load_bert_checkpoint(folder)
    with torch.no_grad():
        ours.position_bias.relative_attention_bias.weight.zero_()
    ids, mask = probe(PAD, lengths=LENGTHS)
    cos, err = agreement(hf_forward(hf, ids, mask)[0], ours_forward(ours, ids, mask)[0], mask)
    assert cos < MIN_COSINE and err > 10 * MAX_ABS, (cos, err)


@pytest.mark.parametrize("name", list(MODELS))
def test_eager_matches_transformers(saved, name):
    hf, folder = saved(name)
    ours = load_bert_checkpoint(folder)
    conf = ours.config
    assert (conf.family, conf.positions, conf.pad_token_id, conf.type_vocab_size, conf.relative_attention_buckets) == ("mpnet", "padded", 1, 0, 32)
    assert all(layer.position_bias is ours.position_bias for layer in ours.layers), "one bias table for every layer"
    pooler = hf.base_model.pooler  # AutoModel's, unused by last_hidden_state
    dropped = 0 if pooler is None else sum(p.numel() for p in pooler.parameters())
    assert encoder_parameter_count(conf) == sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters()) - dropped
    ids, mask = probe(PAD, lengths=LENGTHS)
    ref_hidden, ref_logits = hf_forward(hf, ids, mask)
    got = ours_forward(ours, ids, mask)
    assert (conf.head is None) == (ref_logits is None)
    assert_matches_transformers((ref_hidden, ref_logits), got, mask, name)


@pytest.mark.parametrize("form", ["padded", "packed"])
def test_eager_sdpa_takes_the_bias_too(saved, form):
    """``--attention-impl sdpa``: PyTorch's fused kernel with the bias joined to the mask, padded and packed."""
    from attn_export.layers.packed import PackedEncoder
    from attn_export.layers.projections import set_attention_impl_

    hf, folder = saved("mpnet")
    ours = load_bert_checkpoint(folder)
    assert set_attention_impl_(ours, "sdpa") == 2
    model = ours if form == "padded" else PackedEncoder(ours).eval()
    ids, mask = probe(PAD, lengths=LENGTHS)
    assert_close(hf_forward(hf, ids, mask)[0], ours_forward(model, ids, mask)[0], mask, f"{form} sdpa hidden states")


def test_a_layer_run_alone_computes_the_bias_itself(saved):
    """Layer N of a checkpoint (what ``--layers N``, low-rank and distillation fit) is exact without the encoder around it."""
    hf, folder = saved("mpnet")
    ours = load_bert_checkpoint(folder)
    ids, mask = probe(PAD, lengths=LENGTHS)
    with torch.no_grad():
        states = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True).hidden_states
        got = ours.subject(1)(states[1], torch.from_numpy(mask))
    assert_close(states[2].numpy(), got.numpy(), mask, "layer 1 alone")


FORMS = [("padded", "decomposed"), ("padded", "ort-contrib"), ("padded", "onnx-attention"), ("packed", "decomposed"), ("packed", "ort-contrib")]


@pytest.mark.parametrize(("form", "attention"), FORMS, ids=[f"{f}-{a}" for f, a in FORMS])
def test_fp32_onnx_matches_transformers(saved, form, attention, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="the exported graph runs on pip install onnxruntime")
    from attn_export.checkpoint.export import export_encoder
    from attn_export.export.spec import ExportSpec

    name = "mpnet-token" if form == "packed" else "mpnet"
    hf, folder = saved(name)
    ours = load_bert_checkpoint(folder)
    path = tmp_path / "encoder.onnx"
    export_encoder(ours, path, ExportSpec(encoder_form=form, attention=attention))
    if attention == "decomposed":
        assert_trt_parsable(path)  # the bias's bucket maths on floats: TensorRT clamps no int64
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    batches = [probe(PAD, lengths=lengths, seed=seed) for lengths, seed in ((LENGTHS, 1), ((7, 3), 5))]  # another batch and length: dynamic axes
    assert_onnx_matches_transformers(session, hf, batches, f"{form} {attention}")


def test_the_long_seq_form_is_refused_and_auto_keeps_the_targets_form(saved, tmp_path):
    from attn_export.checkpoint.export import export_encoder
    from attn_export.export.spec import ExportSpec
    from attn_export.targets.form_choice import choose_attention_form

    _, folder = saved("mpnet")
    with pytest.raises(ExportError, match=r"long-seq .*relative position bias.*use --attention decomposed"):
        export_encoder(load_bert_checkpoint(folder), tmp_path / "x.onnx", ExportSpec(attention="long-seq"))
    assert not (tmp_path / "x.onnx").exists()
    assert choose_attention_form("ort-cpu", 512)[0] == "long-seq"  # the rule the bias overrides
    form, why = choose_attention_form("ort-cpu", 512, score_bias=True)
    assert form == "decomposed" and "relative position bias" in why


def test_the_plan_keeps_the_targets_form_at_512_tokens(tmp_path):
    """``--seq-len 512`` on ort-cpu picks long-seq for a BERT; for an MPNet the plan keeps decomposed (config.json is all it reads)."""
    from attn_export.config.run import RunConfig
    from attn_export.pipeline.plan import make_plan

    T = transformers_module()
    small = dict(vocab_size=100, hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=64)
    forms = {}
    for name, config in (("bert", T.BertConfig(**small, max_position_embeddings=512)), ("mpnet", T.MPNetConfig(**small, max_position_embeddings=514))):
        config.save_pretrained(str(tmp_path / name))
        plan = make_plan(RunConfig(checkpoint=str(tmp_path / name), seq_len=512, encoder_form="padded"))
        forms[name] = plan.fp32_spec.attention
    assert forms == {"bert": "long-seq", "mpnet": "decomposed"}


def test_cli_refuses_long_seq_with_exit_2_and_one_line(saved, tmp_path, capsys):
    from attn_export.cli import main

    _, folder = saved("mpnet")
    assert main(["--checkpoint", str(folder), "--attention", "long-seq", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "relative position bias; use --attention decomposed" in err, err
    assert not (tmp_path / "out").exists()


def test_fidelity_check_passes_and_records_the_family_bar(saved):
    _, folder = saved("mpnet-seq")
    result = check_fidelity(load_bert_checkpoint(folder), folder)
    assert result and result.family == "mpnet" and result.reference.startswith("transformers MPNetForSequenceClassification")
    assert result.tolerance == {"min_cosine": MIN_COSINE, "max_abs": MAX_ABS}


def test_config_defaults_are_transformers_mpnet_config_defaults():
    T = transformers_module()
    from attn_export.checkpoint.families import family_for

    hf = T.MPNetConfig()
    raw = {"model_type": "mpnet", **{k: getattr(hf, k) for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")}}
    conf = family_for(raw).read_config(raw, "config.json")
    got = (conf.hidden_act, conf.max_position_embeddings, conf.layer_norm_eps, conf.relative_attention_buckets, conf.pad_token_id)
    assert got == (hf.hidden_act, hf.max_position_embeddings, hf.layer_norm_eps, hf.relative_attention_num_buckets, hf.pad_token_id)
    assert conf.max_tokens == hf.max_position_embeddings - 2


def test_another_bucket_count_is_refused_by_name_before_the_weights(tmp_path, monkeypatch):
    """MPNetEncoder computes 32 buckets whatever its table's size: another table is refused in one line."""
    from attn_export.checkpoint import loader as loader_module

    T = transformers_module()
    folder = tmp_path / "ckpt"
    T.MPNetModel(T.MPNetConfig(**{**SIZES, "relative_attention_num_buckets": 64})).save_pretrained(str(folder))
    monkeypatch.setattr(loader_module, "_weight_files", lambda d: pytest.fail("read the weights of a refused config"))
    with pytest.raises(CheckpointError, match=r"relative_attention_num_buckets 64 \(mpnet with a relative attention table") as info:
        load_bert_checkpoint(folder)
    assert "\n" not in str(info.value)


def test_position_bias_is_refused_with_a_bucket_count_it_cannot_split():
    from attn_export.errors import ConfigError

    with pytest.raises(ConfigError, match="multiple of 4"):
        RelativePositionBias(4, num_buckets=30)
    with torch.no_grad():
        bias = RelativePositionBias(4).for_length(5, torch.device("cpu"))
    assert bias.shape == (1, 4, 5, 5) and bias.dtype == torch.float32 and math.isfinite(float(bias.abs().max()))


def _char_tokenizer(folder: Path) -> int:
    """A character-level WordPiece tokenizer.json with MPNet's special ids (<s> 0, <pad> 1, </s> 2, <unk> 3); returns its size."""
    return char_tokenizer(folder, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], "<s>", "</s>", "<unk>", pad=(PAD, "<pad>"))


@pytest.mark.slow  # the default suite runs the CLI on this family in c27 (tests/reliability/test_round4_init.py)
def test_the_cli_checkpoint_path_passes_on_a_tiny_mpnet(tmp_path):
    """``attn-export --checkpoint DIR``: the fidelity check at load, the export (padded and packed) and the judge, as a user runs it."""
    from attn_export.cli import main

    T = transformers_module()
    folder = tmp_path / "mpnet"
    folder.mkdir()
    vocab = _char_tokenizer(folder)
    torch.manual_seed(0)
    T.MPNetModel(T.MPNetConfig(**{**SIZES, "vocab_size": vocab})).eval().save_pretrained(str(folder))
    run = ["--repeats", "1", "--warmup", "0", "--batch", "2", "--seq-len", "16", "--max-texts", "16", "--threads", "1", "--quiet"]
    assert main(["--checkpoint", str(folder), "--out", str(tmp_path / "out"), *run]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    model = report["model"]
    assert model["family"] == "mpnet" and model["reference"].startswith("transformers MPNetModel")
    assert model["fidelity"]["passed"] and model["fidelity"]["outputs"]["last_hidden_state"]["min_cosine"] >= MIN_COSINE
    assert report["verdict"]["passed"], report["verdict"]
