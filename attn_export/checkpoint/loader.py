"""Load a Hugging Face encoder checkpoint directory (any family of ``checkpoint/families/``) into a ``SentenceEncoder``.

Users bring pretrained encoders, and a toolkit that only sees random weights cannot tell
them what compression does to theirs. This reads ``config.json`` and ``model.safetensors``
(or a sharded ``model.safetensors.index.json``) with no ``transformers`` import and no
unpickling: a ``pytorch_model.bin`` is refused with the command to convert it.

``model_type`` picks the family (``attn_export.checkpoint.families``): its config keys, weight
names, prefix (``roberta.``...) and task heads; a family this project does not reproduce
exactly is refused by name before anything else is read. ``architectures`` (or the head keys)
give the task head, whose label count is read from the weight shapes; the sentence pooling
comes from the folder's sentence-transformers files (``attn_export.checkpoint.pooling``).

Every key is accounted for: a missing or unexpected key, or a shape mismatch, is a
``CheckpointError`` naming the key, never a silently half-initialised model. Keys that
``AutoModel`` drops too (a bare encoder's pooler, masked-LM / pretraining heads) are skipped.

The JSON files are validated by pydantic schemas (``attn_export.validate.schema``) before
anything is allocated: strict integers (``num_attention_heads: true`` is refused, not read as
1), bounded sizes, and a model the weight files could not possibly hold is refused before it
is built. Every file opened must resolve (symlinks included) inside the checkpoint directory;
a shard name like ``../../outside/x.safetensors`` or ``/etc/passwd`` is refused unopened, and
``attn_export.checkpoint.paths.check_checkpoint_files`` checks every file of the folder (the
tokenizer files transformers and sentence-transformers open by name included) before any is
read. A NaN or inf in a weight is named (file, tensor) here, not left to the fidelity check.

The weights alone do not prove the re-implementation right: ``attn_export.checkpoint.fidelity``
compares the loaded model with the checkpoint's own library before a run trusts it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch

from attn_export.checkpoint.config_file import (
    KNOWN_CHECKPOINTS,
    encoder_parameter_count,
    read_bert_config,
    read_checkpoint_config,
    resolve_checkpoint,
)
from attn_export.checkpoint.families import Family, detect_head, map_key
from attn_export.checkpoint.paths import JSON_MAX_BYTES
from attn_export.checkpoint.paths import inside as _inside
from attn_export.errors import CheckpointError
from attn_export.layers.encoder import SentenceEncoder
from attn_export.layers.encoder_config import EncoderConfig, HeadConfig

__all__ = [
    "KNOWN_CHECKPOINTS",
    "encoder_parameter_count",
    "load_bert_checkpoint",
    "read_bert_config",
    "read_checkpoint_config",
    "read_head",
    "resolve_checkpoint",
]

log = logging.getLogger(__name__)

_UNSAFE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.h5", "*.msgpack")


def _regular(path: Path) -> None:
    """A FIFO or a device under a checkpoint file's name is refused from its stat, never opened."""
    from attn_export.host.paths import check_regular_file

    check_regular_file(path, "checkpoint file", CheckpointError)


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


def _weight_files(checkpoint_dir: Path) -> list[Path]:
    from attn_export.validate.checkpoint_schema import SafetensorsIndexSchema
    from attn_export.validate.schema import read_json, validate

    single = checkpoint_dir / "model.safetensors"
    index = checkpoint_dir / "model.safetensors.index.json"
    _regular(single)
    _regular(index)
    if single.is_file():
        return [_inside(checkpoint_dir, single.name, "weights")]
    if index.is_file():
        _inside(checkpoint_dir, index.name, "index")
        fix = "re-save the checkpoint with safetensors (save_pretrained(dir, safe_serialization=True))"
        raw = read_json(index, "a safetensors index", fix, error=CheckpointError, max_bytes=JSON_MAX_BYTES)
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


def _check_headers(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Every key's shape from the safetensors headers (no tensor data is read): a corrupt file is named first."""
    from safetensors import SafetensorError, safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as handle:
                for key in handle.keys():
                    shapes[key] = tuple(handle.get_slice(key).get_shape())
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{f} is not a readable safetensors file ({err}); re-download or re-save it") from err
    return shapes


def _finite(tensor: torch.Tensor) -> bool:
    """No NaN/inf in a floating-point tensor (torch has no isfinite for float8_e4m3fn: it is checked in float32)."""
    return bool(torch.isfinite(tensor if tensor.dtype.itemsize > 1 else tensor.float()).all())


def _read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            loaded = load_file(str(f))
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{f} is not a readable safetensors file ({err}); re-download or re-save it") from err
        for name, tensor in loaded.items():  # a NaN weight would surface as "does not reproduce transformers" at the fidelity check
            if tensor.is_floating_point() and not _finite(tensor):
                raise CheckpointError(f"{f}: tensor {name} holds NaN/inf values; the checkpoint is damaged: re-save it from a finite model")
        tensors.update(loaded)
    return tensors


def _state_dict(family: Family, config: EncoderConfig, tensors: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under our names, float32, every key and shape checked.

    ``expected`` is our model's state dict: a tensor that sits under several names (a layer
    shared across depth: ``layers.0.*`` is ``layers.1.*``) is expected once, under its first
    name, and given to the others.
    """
    task = None if config.head is None else config.head.task
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, tensor in expected.items():
        canonical = first.setdefault(id(tensor), name)
        if canonical != name:
            aliases[name] = canonical
    expected = {k: v for k, v in expected.items() if k not in aliases}
    state: dict[str, torch.Tensor] = {}
    source: dict[str, str] = {}
    dropped: list[str] = []
    for key, tensor in tensors.items():
        ref_key = map_key(family, key, task)
        if ref_key is None:
            dropped.append(key)
            continue
        if ref_key not in expected and any(re.search(p, key) for p in family.ignore_unexpected):
            dropped.append(key)  # as transformers drops it
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
    for alias, canonical in aliases.items():  # a layer shared across depth: the checkpoint names it once
        if canonical in state:
            state[alias] = state[canonical]
    missing = [k for k in expected if k not in state]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        module, _, param = missing[0].rpartition(".")
        raise CheckpointError(f"missing key '{family.hf_module(module)}.{param}'{more}; it is not a complete {config.family} checkpoint")
    if dropped:
        log.info("dropped %d keys that AutoModel drops too (e.g. %s)", len(dropped), dropped[0])
    return state


def read_head(checkpoint_dir: str | os.PathLike[str]) -> HeadConfig | None:
    """The task head a checkpoint holds (None: a bare encoder), from config.json's ``architectures``, else from
    the safetensors headers' key names: no tensor data is read (what ``--atol logits:...`` may name)."""
    checkpoint_dir = resolve_checkpoint(checkpoint_dir)
    family, _config, raw = read_checkpoint_config(checkpoint_dir)
    return detect_head(family, raw, _check_headers(_weight_files(checkpoint_dir)), str(checkpoint_dir / "config.json"))


def load_bert_checkpoint(checkpoint_dir: str | os.PathLike[str], pooling: str | None = None) -> SentenceEncoder:
    """Build a ``SentenceEncoder`` from ``config.json`` + safetensors weights, every key checked.

    Any supported family (``attn_export.checkpoint.families``), bare or with a sequence/token
    classification head, with or without its task model's prefix (``bert.``, ``roberta.``...);
    casts half/bfloat16 weights to float32. ``pooling`` overrides the pooling the folder ships
    (``"cls"``, ``"mean"``, ...: the CLI's ``--pooling``); the model's ``config.pooling.source``
    says where it came from.
    """
    from attn_export.checkpoint.pooling import resolve_pooling

    checkpoint_dir = resolve_checkpoint(checkpoint_dir)
    family, config, raw = read_checkpoint_config(checkpoint_dir)
    config = replace(config, pooling=resolve_pooling(checkpoint_dir, pooling))
    files = _weight_files(checkpoint_dir)
    shapes = _check_headers(files)
    config = replace(config, head=detect_head(family, raw, shapes, str(checkpoint_dir / "config.json")))
    _check_fits(config, files, checkpoint_dir)  # before the model is allocated
    model = SentenceEncoder(config).eval()
    state = _state_dict(family, config, _read_tensors(files), model.state_dict(keep_vars=True))  # the Parameters: shared ones are one object
    model.load_state_dict(state, strict=True)
    n_params = sum(p.numel() for p in model.parameters())
    head = "" if config.head is None else f", {config.head.task}-classification head ({config.head.num_labels} labels)"
    log.info(
        "loaded %s (%s): %d layers, d_model %d, %d heads, %.1fM parameters, pooling %s from %s%s",
        checkpoint_dir, config.family, config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
        n_params / 1e6, config.pooling.name, config.pooling.source, head,
    )  # fmt: skip
    return model
