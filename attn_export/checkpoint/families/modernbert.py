"""ModernBERT (``model_type: modernbert``): pre-norm GeGLU layers, rotary positions, alternating global and local attention.

transformers' ``models/modernbert/modeling_modernbert.py`` (5.x), reproduced by general layers:

- embeddings: ``tok_embeddings`` then ``norm`` (no position or token-type table:
  ``layers.prenorm.TokenEmbeddings``);
- layers (``layers.prenorm.PreNormLayer``): ``x + Attn(attn_norm(x))`` then ``h + MLP(mlp_norm(h))``,
  layer 0's ``attn_norm`` an Identity; ``attn.Wqkv`` (Q, K, V fused, as our ``w_qkv``), ``attn.Wo``;
  ``mlp.Wi`` (2 x intermediate: input and gate halves) and ``mlp.Wo``: GeGLU; then ``final_norm``;
- rotary positions (``layers.rotary``) on q and k in every layer, ``position_ids = arange(S)``,
  with one base for global layers and one for local layers. transformers 5.x writes them per
  layer type in ``rope_parameters`` (``full_attention`` / ``sliding_attention``: ``rope_theta``);
  configs of 4.x (what the Hub's checkpoints ship) say ``global_rope_theta`` / ``local_rope_theta``.
  ``ModernBertConfig.convert_rope_params_to_dict`` takes ``rope_parameters`` first, then those,
  then 160000 / 10000; ``_derive`` does the same. Only the ``default`` rope type is reproduced;
- layer types: ``layer_types`` (5.x) or, absent, ``global_attn_every_n_layers`` (layer i is
  global when ``i % n == 0``; ``ModernBertConfig.__post_init__``); local layers attend within
  ``|i - j| <= local_attention // 2`` (``create_bidirectional_sliding_window_mask`` with
  ``config.sliding_window = local_attention // 2``);
- biases as the config says: ``attention_bias``, ``mlp_bias``, ``norm_bias`` (all False in the
  released checkpoints); LayerNorm eps ``norm_eps``; activation ``hidden_activation``.

Task models save the encoder under ``model.``. ``ModernBertForSequenceClassification`` pools
(``classifier_pooling``: token 0 or the mean over real tokens), runs ``ModernBertPredictionHead``
(``head.dense`` with ``classifier_bias`` -> ``classifier_activation`` -> ``head.norm``) and
``classifier``; ``ModernBertForTokenClassification`` runs the same head on every token. The bare
encoder's sentence pooling is the folder's (mean by default). ``ModernBertForMaskedLM``'s
``head`` and ``decoder`` are dropped, as ``AutoModel`` drops them.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from typing import Any

from attn_export.checkpoint.families.base import CONFIG_FIX, ConfigKeys, Family
from attn_export.errors import CheckpointError

__all__ = ["FAMILY"]

log = logging.getLogger(__name__)

# ModernBertConfig's keys and defaults (transformers 5.24, configuration_modernbert.py)
_KEYS = ConfigKeys(
    names={
        **{f: f for f in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                          "max_position_embeddings", "pad_token_id", "local_attention", "attention_bias", "mlp_bias", "norm_bias")},
        "layer_norm_eps": "norm_eps",
        "hidden_act": "hidden_activation",
    },  # fmt: skip
    defaults={"vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22, "num_attention_heads": 12,
              "max_position_embeddings": 8192, "layer_norm_eps": 1e-5, "hidden_act": "gelu", "pad_token_id": 50283,
              "local_attention": 128, "attention_bias": False, "mlp_bias": False, "norm_bias": False},  # fmt: skip
    fixed={"type_vocab_size": 0},  # no token-type table
)
# rope_parameters' layer types -> (our name, the 4.x key, ModernBertConfig.default_theta)
_ROPE = {"full_attention": ("rope_theta", "global_rope_theta", 160_000.0), "sliding_attention": ("local_rope_theta", "local_rope_theta", 10_000.0)}
_LAYER_TYPES = ("full_attention", "sliding_attention")


def _derive(config: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The local layers and the two rotary bases, from ``layer_types`` / ``global_attn_every_n_layers`` and ``rope_parameters``."""
    n = config.get("num_hidden_layers", _KEYS.defaults["num_hidden_layers"])
    types = config.get("layer_types")
    if types is None:
        every = config.get("global_attn_every_n_layers", 3)
        if type(every) is not int or every < 1:
            raise CheckpointError(f"{path}: global_attn_every_n_layers: expected a positive integer, got {every!r}; {CONFIG_FIX}")
        types = ["sliding_attention" if i % every else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(t not in _LAYER_TYPES for t in types):
        raise CheckpointError(f"{path}: layer_types: expected {n} of {', '.join(_LAYER_TYPES)}, got {types!r}; {CONFIG_FIX}")
    if config.get("rope_scaling") is not None:
        raise CheckpointError(f"{path}: rope_scaling {config['rope_scaling']!r} (modernbert with a scaled rope type) is not supported; use rope_type default")
    rope = config.get("rope_parameters") or {}
    if not isinstance(rope, Mapping):
        raise CheckpointError(f"{path}: rope_parameters: expected an object per layer type, got {rope!r}; {CONFIG_FIX}")
    out: dict[str, Any] = {"local_layers": tuple(i for i, t in enumerate(types) if t == "sliding_attention")}
    for kind, (field, old_key, default) in _ROPE.items():
        params = rope.get(kind) or {}
        if not isinstance(params, Mapping) or params.get("rope_type", "default") != "default":
            raise CheckpointError(f"{path}: rope_parameters.{kind}: {params!r} (modernbert with a scaled rope type) is not supported; use rope_type default")
        theta = params.get("rope_theta", config.get(old_key, default))
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 0:
            raise CheckpointError(f"{path}: rope_parameters.{kind}.rope_theta: expected a positive number, got {theta!r}; {CONFIG_FIX}")
        out[field] = float(theta)
    return out


_LAYER_PARTS = {
    "attn_norm": "attn_norm",
    "attn.Wqkv": "self_attn.w_qkv",
    "attn.Wo": "self_attn.w_o",
    "mlp_norm": "mlp_norm",
    "mlp.Wi": "mlp.w_in",
    "mlp.Wo": "mlp.w_out",
}
_HEAD = {"head.dense": "head.dense", "head.norm": "head.norm", "classifier": "head.out"}  # ModernBertPredictionHead + classifier

FAMILY = Family(
    name="modernbert",
    model_types=("modernbert",),
    prefix="model.",
    config_keys=_KEYS,
    positions="rotary",
    layer_kind="pre-norm-glu",
    derive=_derive,
    embedding_parts={"embeddings.tok_embeddings": "embeddings.word_embeddings", "embeddings.norm": "embeddings.norm"},
    layer_key=re.compile(r"^layers\.(\d+)\.(.+)$"),
    layer_parts=_LAYER_PARTS,
    layer_template="layers.{index}.{part}",
    extra_parts={"final_norm": "final_norm"},
    sequence_activation="gelu",  # classifier_activation's default; head_keys reads the config's
    head_keys={"pooling": ("classifier_pooling", "cls"), "activation": ("classifier_activation", "gelu"), "dense_bias": ("classifier_bias", False)},
    head_norm=True,
    sequence_head=_HEAD,
    token_head=_HEAD,
    dropped=("head.", "decoder."),  # ModernBertForMaskedLM's prediction head and decoder
)
