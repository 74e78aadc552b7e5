"""Tiny fake BERT checkpoints in the Hugging Face layout, written independently of the loader."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attn_export.layers.encoder import EncoderConfig, SentenceEncoder

TINY = EncoderConfig(vocab_size=64, hidden_size=16, num_attention_heads=2, num_hidden_layers=2,
                     intermediate_size=32, max_position_embeddings=32, type_vocab_size=2, layer_norm_eps=1e-12)  # fmt: skip

_LAYER = {
    "attention.self.query": "self_attn.w_q",
    "attention.self.key": "self_attn.w_k",
    "attention.self.value": "self_attn.w_v",
    "attention.output.dense": "self_attn.w_o",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "ffn_in",
    "output.dense": "ffn_out",
    "output.LayerNorm": "norm2",
}
_EMB = {
    "embeddings.word_embeddings": "embeddings.word_embeddings",
    "embeddings.position_embeddings": "embeddings.position_embeddings",
    "embeddings.token_type_embeddings": "embeddings.token_type_embeddings",
    "embeddings.LayerNorm": "embeddings.norm",
}


def hf_state_dict(model: SentenceEncoder, prefix: str = "") -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face BertModel names, written independently of the loader."""
    sd = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for hf, ours in _EMB.items():
        for p in ("weight", "bias") if "LayerNorm" in hf else ("weight",):
            out[f"{prefix}{hf}.{p}"] = sd[f"{ours}.{p}"].clone()
    for i in range(len(model.layers)):
        for hf, ours in _LAYER.items():
            for p in ("weight", "bias"):
                out[f"{prefix}encoder.layer.{i}.{hf}.{p}"] = sd[f"layers.{i}.{ours}.{p}"].clone()
    d = model.config.hidden_size
    out[f"{prefix}pooler.dense.weight"] = torch.randn(d, d)
    out[f"{prefix}pooler.dense.bias"] = torch.zeros(d)
    out[f"{prefix}embeddings.position_ids"] = torch.arange(model.config.max_position_embeddings)[None]
    return out


def write_checkpoint(path: Path, tensors: dict[str, torch.Tensor], config: dict | None = None) -> Path:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    cfg = {
        "model_type": "bert", "vocab_size": TINY.vocab_size, "hidden_size": TINY.hidden_size,
        "num_attention_heads": TINY.num_attention_heads, "num_hidden_layers": TINY.num_hidden_layers,
        "intermediate_size": TINY.intermediate_size, "max_position_embeddings": TINY.max_position_embeddings,
        "type_vocab_size": TINY.type_vocab_size, "layer_norm_eps": TINY.layer_norm_eps, "hidden_act": "gelu",
    }  # fmt: skip
    cfg.update(config or {})
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path
