"""Every supported encoder family against transformers' own forward: eager, fp32 ONNX and the fidelity check.

Random-init models are built and saved by transformers (``save_pretrained``), loaded through
the project's loader and compared on a padded batch (rows of 20, 9, 5 and 1 tokens) over real
tokens, at the fp32 bar of issue 19: cosine >= 0.9999 on every row and max abs <= 1e-4.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hf_models import (
    MODELS,
    agreement,
    assert_trt_parsable,
    build,
    hf_forward,
    model_cache,
    ours_forward,
    probe,
    save,
    transformers_module,
)

from attn_export.checkpoint.families import SUPPORTED_MODEL_TYPES, family_for
from attn_export.checkpoint.fidelity import check_fidelity
from attn_export.checkpoint.loader import encoder_parameter_count, load_bert_checkpoint, read_bert_config
from attn_export.errors import CheckpointError

MIN_COSINE, MAX_ABS = 0.9999, 1e-4


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (transformers model, its saved folder), built once per module."""
    transformers_module()
    return model_cache(tmp_path_factory, build)


@pytest.mark.parametrize("name", list(MODELS))
def test_eager_matches_transformers(saved, name):
    hf, folder = saved(name)
    ours = load_bert_checkpoint(folder)
    assert encoder_parameter_count(ours.config) == sum(p.numel() for p in ours.parameters())
    ids, mask = probe(hf.config.pad_token_id or 0)
    ref_hidden, ref_logits = hf_forward(hf, ids, mask)
    got = ours_forward(ours, ids, mask)
    cos, err = agreement(ref_hidden, got[0], mask)
    assert cos >= MIN_COSINE and err <= MAX_ABS, f"{name}: hidden states cosine {cos:.7f}, max abs {err:.2e}"
    if ref_logits is None:
        assert ours.config.head is None and len(got) == 2
        return
    assert ours.config.head is not None and ours.output_names[-1] == "logits"
    cos, err = agreement(ref_logits, got[2], mask)
    assert cos >= MIN_COSINE and err <= MAX_ABS, f"{name}: logits cosine {cos:.7f}, max abs {err:.2e}"
    keep = mask.astype(bool) if ref_logits.ndim == 3 else slice(None)
    assert np.array_equal(ref_logits[keep].argmax(-1), got[2][keep].argmax(-1))


@pytest.mark.parametrize("name", ["roberta", "xlm-roberta", "camembert", "distilbert", "electra", "bert-seq", "xlm-roberta-token"])
def test_fp32_onnx_matches_transformers(saved, name, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="the exported graph runs on pip install onnxruntime")
    from attn_export.checkpoint.export import export_encoder

    hf, folder = saved(name)
    ours = load_bert_checkpoint(folder)
    result = export_encoder(ours, tmp_path / "encoder.onnx")
    assert result.output_names == list(ours.output_names)
    assert_trt_parsable(tmp_path / "encoder.onnx")
    session = ort.InferenceSession(str(tmp_path / "encoder.onnx"), providers=["CPUExecutionProvider"])
    ids, mask = probe(hf.config.pad_token_id or 0)
    onnx_out = session.run(None, {"input_ids": ids, "attention_mask": mask})
    ref_hidden, ref_logits = hf_forward(hf, ids, mask)
    cos, err = agreement(ref_hidden, onnx_out[0], mask)
    assert cos >= MIN_COSINE and err <= MAX_ABS, f"{name} ONNX: hidden states cosine {cos:.7f}, max abs {err:.2e}"
    if ref_logits is not None:
        cos, err = agreement(ref_logits, onnx_out[2], mask)
        assert cos >= MIN_COSINE and err <= MAX_ABS, f"{name} ONNX: logits cosine {cos:.7f}, max abs {err:.2e}"
    ids2, mask2 = probe(hf.config.pad_token_id or 0, lengths=(7, 3), seed=5)  # other batch and length: dynamic axes
    cos, err = agreement(hf_forward(hf, ids2, mask2)[0], session.run(None, {"input_ids": ids2, "attention_mask": mask2})[0], mask2)
    assert cos >= MIN_COSINE and err <= MAX_ABS


@pytest.mark.parametrize("name", ["roberta", "distilbert", "electra-seq", "bert-token"])
def test_fidelity_check_passes_and_records_the_numbers(saved, name):
    _, folder = saved(name)
    ours = load_bert_checkpoint(folder)
    result = check_fidelity(ours, folder)
    assert result and str(result).startswith(f"fidelity PASS ({result.family} vs transformers ")
    assert result.passed and result.family == json.loads((folder / "config.json").read_text())["model_type"]
    assert set(result.outputs) == set(ours.output_names)
    assert sum(result.probes.values()) >= 7 and "no tokenizer.json: random-id probes only" in result.notes
    for out in result.outputs.values():
        assert out.min_cosine >= MIN_COSINE and out.max_abs <= MAX_ABS
    if ours.config.head is not None:
        assert result.outputs["logits"].label_agreement == 1.0
    longest = min(64, ours.config.max_tokens)  # RoBERTa's 64 positions hold 62 tokens
    typed = ours.config.type_vocab_size >= 2  # a type-1 embedding: the 4x16 ids again, typed 0/1
    assert ("random 4x16 typed 0/1" in result.probes) == typed
    assert result.to_dict()["outputs"]["last_hidden_state"]["rows"] == 16 + 11 + 5 + 1 + longest + 32 + 2 + typed * (16 + 11 + 5 + 1)


def test_fidelity_refuses_a_broken_reimplementation(saved):
    """Issue 19's RoBERTa bug, put back on purpose: positions without the padding_idx + 1 offset."""
    _, folder = saved("roberta")
    ours = load_bert_checkpoint(folder)
    ours.embeddings.positions = "absolute"  # arange(S): what the BERT-only loader did
    with pytest.raises(CheckpointError, match=r"does not reproduce transformers RobertaModel.*last_hidden_state min cosine") as info:
        check_fidelity(ours, folder)
    assert "\n" not in str(info.value)
    result = check_fidelity(ours, folder, raise_on_failure=False)
    assert not result and not result.passed and result.outputs["last_hidden_state"].min_cosine < 0.99


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "gelu_pytorch_tanh", "silu", "swish", "relu"])
def test_activation_is_transformers_own(act):
    """Exact to float32 rounding on [-8, 8]; the erf and tanh GELUs differ by up to ~5e-4 there."""
    transformers_module()
    from transformers.activations import ACT2FN

    from attn_export.layers.encoder import activation_module

    x = torch.linspace(-8, 8, 4001)
    assert torch.allclose(activation_module(act)(x), ACT2FN[act](x), atol=2e-6, rtol=0), act


@pytest.mark.parametrize("act", ["gelu_new", "gelu_pytorch_tanh", "silu", "relu"])
def test_hidden_act_variants_match_transformers(tmp_path, act):
    hf = build("bert", hidden_act=act)
    with torch.no_grad():  # FFN pre-activations of a few units, where the GELU forms differ
        for layer in hf.encoder.layer:
            layer.intermediate.dense.weight.mul_(25.0)
            layer.output.dense.weight.mul_(5.0)
    ours = load_bert_checkpoint(save(hf, tmp_path / act))
    ids, mask = probe(0)
    cos, err = agreement(hf_forward(hf, ids, mask)[0], ours_forward(ours, ids, mask)[0], mask)
    assert cos >= MIN_COSINE and err <= MAX_ABS, f"{act}: cosine {cos:.7f}, max abs {err:.2e}"


def test_tanh_gelu_is_exported_as_the_tanh_approximation(tmp_path):
    onnx = pytest.importorskip("onnx", reason="reading the graph needs pip install onnx")
    from attn_export.checkpoint.export import export_encoder

    ours = load_bert_checkpoint(save(build("roberta", hidden_act="gelu_new"), tmp_path / "ckpt"))
    export_encoder(ours, tmp_path / "m.onnx")
    gelus = [n for n in onnx.load(str(tmp_path / "m.onnx")).graph.node if n.op_type == "Gelu"]
    assert len(gelus) == 2 and all(onnx.helper.get_attribute_value(a) == b"tanh" for n in gelus for a in n.attribute if a.name == "approximate")
    assert all(any(a.name == "approximate" for a in n.attribute) for n in gelus)


def test_family_defaults_match_transformers_config_defaults():
    """A key absent from config.json means transformers' default for that model_type; the schemas say the same."""
    T = transformers_module()
    for model_type, cls in (("bert", "BertConfig"), ("roberta", "RobertaConfig"), ("xlm-roberta", "XLMRobertaConfig"),
                            ("camembert", "CamembertConfig"), ("electra", "ElectraConfig")):  # fmt: skip
        hf = getattr(T, cls)()
        raw = {"model_type": model_type, **{k: getattr(hf, k) for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")}}
        conf = family_for(raw).read_config(raw, "config.json")
        assert (conf.type_vocab_size, conf.pad_token_id, conf.max_position_embeddings, conf.layer_norm_eps, conf.hidden_act) == (
            hf.type_vocab_size, hf.pad_token_id, hf.max_position_embeddings, hf.layer_norm_eps, hf.hidden_act), model_type  # fmt: skip
        if model_type == "electra":
            assert conf.embedding_size == hf.embedding_size
    hf = T.DistilBertConfig()
    raw = {"model_type": "distilbert", "vocab_size": hf.vocab_size, "dim": hf.dim, "n_heads": hf.n_heads, "n_layers": hf.n_layers, "hidden_dim": hf.hidden_dim}
    conf = family_for(raw).read_config(raw, "config.json")
    assert (conf.pad_token_id, conf.max_position_embeddings, conf.hidden_act, conf.type_vocab_size) == (hf.pad_token_id, hf.max_position_embeddings, hf.activation, 0)


def test_roberta_positions_cover_max_position_embeddings_minus_the_offset(saved):
    _, folder = saved("roberta")
    conf = read_bert_config(folder)
    assert conf.positions == "padded" and conf.max_tokens == 64 - 2 and conf.type_vocab_size == 1


# --- refused families: one line, before any weight is read ----------------------------------------


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"model_type": "deberta"}, "DeBERTa"),
        ({"model_type": "xlm-roberta-xl"}, "XLM-RoBERTa-XL"),
        ({"model_type": "nomic_bert"}, "NomicBERT"),
        ({"position_embedding_type": "relative_key"}, "relative_key"),
        ({"position_embedding_type": "relative_key_query"}, "relative_key_query"),
        ({"model_type": "roberta", "position_embedding_type": "relative_key"}, "roberta with relative position"),
        ({"model_type": "funnel"}, "'funnel' is not a supported encoder family"),
        ({"model_type": None, "architectures": ["MPNetForMaskedLM"]}, "architectures MPNetForMaskedLM"),
    ],
    ids=["deberta", "xlm-roberta-xl", "nomic-bert", "relative-key", "relative-key-query", "roberta-relative", "unknown", "no-model-type"],
)
def test_unsupported_families_are_refused_by_name(tmp_path, monkeypatch, change, named):
    from ckpt_fixtures import write_checkpoint

    from attn_export.checkpoint import loader as loader_module

    monkeypatch.setattr(loader_module, "_weight_files", lambda d: pytest.fail("read the weights of a refused family"))
    config = {k: v for k, v in change.items() if v is not None}
    ckpt = write_checkpoint(tmp_path / "ckpt", {}, config)
    if change.get("model_type", "") is None:
        raw = json.loads((ckpt / "config.json").read_text())
        del raw["model_type"]
        (ckpt / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError) as info:
        load_bert_checkpoint(ckpt)
    message = str(info.value)
    assert named in message and "\n" not in message
    assert "supported model_types: " + ", ".join(SUPPORTED_MODEL_TYPES) in message


def test_unsupported_task_head_is_refused_by_name(saved, tmp_path):
    _, folder = saved("bert-seq")
    raw = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "architectures": ["BertForQuestionAnswering"]}))
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match=r"BertForQuestionAnswering is a task head attn-export does not reproduce; supported: .*ForSequenceClassification"):
        load_bert_checkpoint(tmp_path)


def test_head_found_from_the_weights_when_architectures_is_absent(saved, tmp_path):
    _, folder = saved("distilbert-seq")
    raw = json.loads((folder / "config.json").read_text())
    raw.pop("architectures")
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    head = load_bert_checkpoint(tmp_path).config.head
    assert (head.task, head.style, head.num_labels) == ("sequence", "distilbert", 2)


@pytest.mark.parametrize("model_type", ["deberta", "nomic_bert"])
def test_cli_refuses_an_unsupported_family_with_exit_2_and_one_line(tmp_path, capsys, model_type):
    from ckpt_fixtures import write_checkpoint

    from attn_export.cli import main

    ckpt = write_checkpoint(tmp_path / "ckpt", {}, {"model_type": model_type})
    assert main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and model_type in err and "supported model_types: albert, bert, camembert" in err
    assert not (tmp_path / "out").exists()


def test_fidelity_refuses_a_non_finite_model(saved):
    _, folder = saved("bert")
    ours = load_bert_checkpoint(folder)
    with torch.no_grad():
        ours.layers[1].ffn_in.weight[0, 0] = float("nan")
    result = check_fidelity(ours, folder, raise_on_failure=False)
    hidden = result.outputs["last_hidden_state"]
    assert not result and np.isnan(hidden.min_cosine) and hidden.max_abs == float("inf")
    with pytest.raises(CheckpointError, match=r"last_hidden_state min cosine nan"):
        check_fidelity(ours, folder)


@pytest.mark.parametrize("name", ["roberta", "distilbert", "electra", "bert-seq", "xlm-roberta-token"])
def test_packed_form_matches_transformers_for_every_family(saved, name, tmp_path):
    """The padding-free export (layers.packed) of each family, its pooling and head, against transformers on real tokens."""
    ort = pytest.importorskip("onnxruntime", reason="the exported graph runs on pip install onnxruntime")
    from attn_export.checkpoint.export import export_encoder
    from attn_export.export.spec import ExportSpec
    from attn_export.layers.packed import PackedEncoder

    hf, folder = saved(name)
    ours = load_bert_checkpoint(folder)
    ids, mask = probe(hf.config.pad_token_id or 0)
    ref_hidden, ref_logits = hf_forward(hf, ids, mask)
    padded = ours_forward(ours, ids, mask)
    packed_eager = ours_forward(PackedEncoder(ours).eval(), ids, mask)
    export_encoder(ours, tmp_path / "packed.onnx", ExportSpec(encoder_form="packed"))
    assert_trt_parsable(tmp_path / "packed.onnx")
    session = ort.InferenceSession(str(tmp_path / "packed.onnx"), providers=["CPUExecutionProvider"])
    packed_onnx = session.run(None, {"input_ids": ids, "attention_mask": mask})
    for label, got in (("packed eager", packed_eager), ("packed ONNX", packed_onnx)):
        cos, err = agreement(ref_hidden, got[0], mask)
        assert cos >= MIN_COSINE and err <= MAX_ABS, f"{name} {label}: hidden states cosine {cos:.7f}, max abs {err:.2e}"
        np.testing.assert_allclose(got[1], padded[1], rtol=0, atol=1e-5, err_msg=f"{name} {label}: sentence embedding")
        if ref_logits is not None:
            cos, err = agreement(ref_logits, got[2], mask)
            assert cos >= MIN_COSINE and err <= MAX_ABS, f"{name} {label}: logits cosine {cos:.7f}, max abs {err:.2e}"


def test_every_family_file_declares_known_fields_and_every_shape_field():
    """A family file names its keys for EncoderConfig fields the schema bounds; with its fixed values they cover the shape."""
    from attn_export.checkpoint.families import FAMILIES
    from attn_export.validate.checkpoint_schema import ENCODER_FIELDS

    shape = {"vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "max_position_embeddings",
             "type_vocab_size", "layer_norm_eps", "hidden_act", "pad_token_id"}  # fmt: skip
    assert {f.name for f in FAMILIES} == {"albert", "bert", "deberta-v2", "distilbert", "electra", "modernbert", "mpnet", "roberta"}
    for family in FAMILIES:
        keys = family.config_keys
        assert set(keys.names) <= set(ENCODER_FIELDS) and set(keys.defaults) <= set(keys.names), family.name
        own = set(getattr(family, "own_keys", ()))  # DeBERTa-v2's keys no other family has (type_vocab_size may be 0 there)
        assert shape <= set(keys.names) | set(keys.fixed) | own, family.name
