"""ALBERT, added as one family file (``checkpoint/families/albert.py``), against transformers' own ``AlbertModel``.

Random-init models are built and saved by transformers (``save_pretrained``): one layer's
weights at every depth (``num_hidden_groups`` 1, ``inner_group_num`` 1), factorised embeddings
(``embedding_size`` 16 -> ``hidden_size`` 32, and a projection even when the two are equal).
Compared on a padded batch (rows of 20, 9, 5 and 1 tokens) over real tokens, at the fp32 bar:
cosine >= 0.9999 on every row and max abs <= 1e-4, for the eager re-implementation, the exported
ONNX (padded and packed forms) and through the CLI's normal checkpoint path.
"""

from __future__ import annotations

import json
from pathlib import Path

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
    save,
    transformers_module,
)

from attn_export.checkpoint.fidelity import check_fidelity
from attn_export.checkpoint.loader import encoder_parameter_count, load_bert_checkpoint
from attn_export.errors import CheckpointError

SIZES = dict(vocab_size=100, embedding_size=16, hidden_size=32, num_attention_heads=4, num_hidden_layers=3, intermediate_size=64, max_position_embeddings=64)
# name -> (transformers model class, config kwargs)
MODELS: dict[str, tuple[str, dict]] = {
    "albert": ("AlbertModel", SIZES),
    "albert-seq": ("AlbertForSequenceClassification", {**SIZES, "num_labels": 3}),
    "albert-token": ("AlbertForTokenClassification", {**SIZES, "num_labels": 5}),
    "albert-equal-widths": ("AlbertModel", {**SIZES, "embedding_size": 32}),  # embedding_hidden_mapping_in is there all the same
    "albert-relu": ("AlbertModel", {**SIZES, "hidden_act": "relu"}),
}


def build(name: str, seed: int = 0):
    """A random-init transformers ALBERT, LayerNorms and heads moved off their init (so a swapped key shows)."""
    T = transformers_module()
    model_cls, kwargs = MODELS[name]
    torch.manual_seed(seed)
    model = getattr(T, model_cls)(T.AlbertConfig(**kwargs)).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "LayerNorm" in pname or "layer_norm" in pname:
                p.add_(0.1 * torch.randn_like(p))
            elif "classifier" in pname or "pooler" in pname:
                p.mul_(20.0)  # logits of a few units: label agreement means something
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (transformers model, its saved folder), built once per module."""
    return model_cache(tmp_path_factory, build)



@pytest.mark.parametrize("name", list(MODELS))
def test_eager_matches_transformers(saved, name):
    hf, folder = saved(name)
    ours = load_bert_checkpoint(folder)
    conf = ours.config
    assert (conf.family, conf.shared_layers, conf.embedding_size) == ("albert", True, hf.config.embedding_size)
    assert len(ours.layers) == 3 and all(layer is ours.layers[0] for layer in ours.layers), "one layer's weights at every depth"
    pooler = hf.base_model.pooler  # AutoModel's, unused by last_hidden_state: dropped unless the sequence head runs it
    dropped = 0 if pooler is None or (conf.head is not None and conf.head.task == "sequence") else sum(p.numel() for p in pooler.parameters())
    assert encoder_parameter_count(conf) == sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters()) - dropped
    ids, mask = probe(0)
    ref_hidden, ref_logits = hf_forward(hf, ids, mask)
    got = ours_forward(ours, ids, mask)
    assert (conf.head is None) == (ref_logits is None)
    assert_matches_transformers((ref_hidden, ref_logits), got, mask, name)


@pytest.mark.parametrize("name", ["albert", "albert-seq", "albert-token"])
@pytest.mark.parametrize("form", ["padded", "packed"])
def test_fp32_onnx_matches_transformers(saved, name, form, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="the exported graph runs on pip install onnxruntime")
    onnx = pytest.importorskip("onnx", reason="reading the graph needs pip install onnx")
    from attn_export.checkpoint.export import export_encoder
    from attn_export.export.spec import ExportSpec

    hf, folder = saved(name)
    ours = load_bert_checkpoint(folder)
    path = tmp_path / "encoder.onnx"
    result = export_encoder(ours, path, ExportSpec(encoder_form=form))
    assert result.output_names == list(ours.output_names)
    assert_trt_parsable(path)
    graph = onnx.load(str(path)).graph
    matrices = {i.name for i in graph.initializer if len(i.dims) == 2}
    reads = [sum(1 for n in graph.node if n.op_type in ("MatMul", "Gemm") and name in n.input) for name in matrices]
    assert max(reads) == 3, "the export reads one weight matrix at every depth (3 layers), not a copy per layer"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    batches = [probe(0, lengths=lengths, seed=seed) for lengths, seed in (((20, 9, 5, 1), 1), ((7, 3), 5))]  # another batch and length: dynamic axes
    assert_onnx_matches_transformers(session, hf, batches, f"{name} {form}")


def test_fidelity_check_passes_and_records_the_family_bar(saved):
    _, folder = saved("albert-seq")
    ours = load_bert_checkpoint(folder)
    result = check_fidelity(ours, folder)
    assert result and result.family == "albert" and result.reference.startswith("transformers AlbertForSequenceClassification")
    assert result.tolerance == {"min_cosine": MIN_COSINE, "max_abs": MAX_ABS}
    assert result.outputs["logits"].label_agreement == 1.0


def test_config_defaults_are_transformers_albert_config_defaults():
    T = transformers_module()
    from attn_export.checkpoint.families import family_for

    hf = T.AlbertConfig()
    raw = {"model_type": "albert", **{k: getattr(hf, k) for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")}}
    conf = family_for(raw).read_config(raw, "config.json")
    got = (conf.embedding_size, conf.hidden_act, conf.type_vocab_size, conf.pad_token_id, conf.max_position_embeddings, conf.layer_norm_eps)
    assert got == (hf.embedding_size, hf.hidden_act, hf.type_vocab_size, hf.pad_token_id, hf.max_position_embeddings, hf.layer_norm_eps)


@pytest.mark.parametrize(("change", "named"), [({"num_hidden_groups": 2}, r"num_hidden_groups 2 \(albert with layer weights in several groups"),
                                               ({"inner_group_num": 2}, r"inner_group_num 2 \(albert with several layers per group")])
def test_layer_groups_are_refused_by_name_before_the_weights(tmp_path, monkeypatch, change, named):
    """transformers' own save of an ALBERT with two groups (or two layers per group): one line, no weight read."""
    from attn_export.checkpoint import loader as loader_module

    T = transformers_module()
    folder = save(T.AlbertModel(T.AlbertConfig(**{**SIZES, "num_hidden_layers": 2, **change})), tmp_path / "ckpt")
    monkeypatch.setattr(loader_module, "_weight_files", lambda d: pytest.fail("read the weights of a refused config"))
    with pytest.raises(CheckpointError, match=named) as info:
        load_bert_checkpoint(folder)
    assert "\n" not in str(info.value) and "supported model_types: albert, " in str(info.value)


def test_a_missing_layer_key_is_named_as_transformers_names_it(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    _, folder = saved("albert")
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["encoder.albert_layer_groups.0.albert_layers.0.ffn.weight"]
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing key 'encoder\.albert_layer_groups\.0\.albert_layers\.0\.ffn\.weight'"):
        load_bert_checkpoint(tmp_path)


def _char_tokenizer(folder: Path) -> int:
    """A character-level WordPiece tokenizer.json (ALBERT's special ids: pad 0, unk 1, [CLS] 2, [SEP] 3); returns its size."""
    return char_tokenizer(folder, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS]", "[SEP]", "[UNK]")


@pytest.mark.slow  # the default suite runs the CLI on this family in c27 (tests/reliability/test_round4_init.py)
def test_the_cli_checkpoint_path_passes_on_a_tiny_albert(tmp_path):
    """``attn-export --checkpoint DIR``: the fidelity check at load, the export and the judge, as a user runs it."""
    from attn_export.cli import main

    T = transformers_module()
    folder = tmp_path / "albert"
    folder.mkdir()
    vocab = _char_tokenizer(folder)
    torch.manual_seed(0)
    T.AlbertModel(T.AlbertConfig(**{**SIZES, "vocab_size": vocab, "max_position_embeddings": 160})).eval().save_pretrained(str(folder))
    run = ["--repeats", "1", "--warmup", "0", "--batch", "2", "--seq-len", "16", "--max-texts", "16", "--threads", "1", "--quiet"]
    assert main(["--checkpoint", str(folder), "--out", str(tmp_path / "out"), *run]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    model = report["model"]
    assert model["family"] == "albert" and model["reference"].startswith("transformers AlbertModel")
    assert model["fidelity"]["passed"] and model["fidelity"]["outputs"]["last_hidden_state"]["min_cosine"] >= MIN_COSINE
    assert report["verdict"]["passed"], report["verdict"]


def test_layer_inputs_are_each_depths_own_where_one_layer_runs_at_every_depth(saved):
    """What calibration and distillation read: depth d's input is transformers' hidden_states[d], not depth 0's three times."""
    from attn_export.checkpoint.text import TokenBatch, all_layer_inputs

    hf, folder = saved("albert")
    ours = load_bert_checkpoint(folder)
    ids, mask = probe(0)
    with torch.no_grad():
        states = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True).hidden_states
    acts = all_layer_inputs(ours, TokenBatch(ids, mask), layers=[0, 1, 2])
    for depth in (0, 1, 2):
        assert_close(states[depth].numpy(), acts[depth].x, mask, f"input of depth {depth}")
    assert not np.allclose(acts[1].x, acts[2].x)
    only = all_layer_inputs(ours, TokenBatch(ids, mask), layers=[1])
    np.testing.assert_array_equal(only[1].x, acts[1].x)


def test_low_rank_and_distillation_fit_a_shared_layer_once_on_every_depths_inputs(saved):
    import copy

    from attn_export.checkpoint.compress import low_rank_encoder_, shared_layer_groups
    from attn_export.checkpoint.text import TokenBatch
    from attn_export.compress.distill import DistillConfig
    from attn_export.compress.lowrank import LowRankConfig, LowRankLinear

    _, folder = saved("albert")
    teacher = load_bert_checkpoint(folder)
    student = copy.deepcopy(teacher)
    g = np.random.default_rng(3)
    lengths = g.integers(4, 24, size=20)
    mask = (np.arange(24)[None, :] < lengths[:, None]).astype(np.int64)
    tokens = TokenBatch(np.where(mask == 1, g.integers(5, 100, size=mask.shape), 0).astype(np.int64), mask)
    assert shared_layer_groups(student, [0, 1, 2]) == {0: [0, 1, 2]}  # the subject's module slots group the same way
    distill = DistillConfig(steps=4, lr=1e-3, batch_size=8, eval_every=2, progress=False)
    summary = low_rank_encoder_(student, teacher, tokens, LowRankConfig(rank_ratio=0.5, targets=("q", "k")), distill=distill)
    assert list(summary.layers) == [0], "one module, factorised and distilled once"
    assert summary.layers[0]["distill"] is not None
    assert all(layer is student.layers[0] for layer in student.layers) and isinstance(student.layers[2].self_attn.w_q, LowRankLinear)
    assert summary.params_after < summary.params_before
    ids, pmask = probe(0)
    cos, _ = agreement(ours_forward(teacher, ids, pmask)[0], ours_forward(student, ids, pmask)[0], pmask)
    assert cos > 0.9, cos
