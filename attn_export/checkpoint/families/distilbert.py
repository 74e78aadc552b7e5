"""DistilBERT (``model_type: distilbert``): its own key names, no token types.

transformers' ``models/distilbert/modeling_distilbert.py``: config keys ``dim``, ``n_heads``,
``n_layers``, ``hidden_dim``, ``activation``; embeddings are word + position, LayerNorm;
each ``transformer.layer.N`` is post-norm like BERT (``sa_layer_norm`` after attention,
``output_layer_norm`` after the FFN), every LayerNorm with eps 1e-12. Sinusoidal position
tables (``sinusoidal_pos_embds``) are saved as weights, so they load like learned ones. Task
models save the encoder under ``distilbert.``; the sequence head is ``pre_classifier`` ->
ReLU -> ``classifier`` on token 0.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from attn_export.checkpoint.families.base import Family
from attn_export.checkpoint.families.bert import CONFIG_FIX
from attn_export.errors import CheckpointError, ConfigError
from attn_export.layers.encoder_config import ACTIVATIONS, EncoderConfig

__all__ = ["DISTILBERT"]

log = logging.getLogger(__name__)

_LAYER_PARTS = {
    "attention.q_lin": "self_attn.w_q",
    "attention.k_lin": "self_attn.w_k",
    "attention.v_lin": "self_attn.w_v",
    "attention.out_lin": "self_attn.w_o",
    "sa_layer_norm": "norm1",
    "ffn.lin1": "ffn_in",
    "ffn.lin2": "ffn_out",
    "output_layer_norm": "norm2",
}
_EMBEDDING_PARTS = {
    "embeddings.word_embeddings": "embeddings.word_embeddings",
    "embeddings.position_embeddings": "embeddings.position_embeddings",
    "embeddings.LayerNorm": "embeddings.norm",
}
_EPS = 1e-12  # hard-coded in DistilBERT's Embeddings and TransformerBlock


def _read_distilbert(config: Mapping[str, Any], path: str) -> EncoderConfig:
    from attn_export.validate.checkpoint_schema import DistilBertConfigSchema
    from attn_export.validate.schema import validate

    cfg = validate(DistilBertConfigSchema, dict(config), path, CONFIG_FIX, error=CheckpointError)
    if cfg.activation not in ACTIVATIONS:
        raise CheckpointError(f"{path}: activation: expected one of {', '.join(ACTIVATIONS)}, got {cfg.activation!r}; {CONFIG_FIX}")
    try:
        return EncoderConfig(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.dim,
            num_attention_heads=cfg.n_heads,
            num_hidden_layers=cfg.n_layers,
            intermediate_size=cfg.hidden_dim,
            max_position_embeddings=cfg.max_position_embeddings,
            type_vocab_size=0,
            layer_norm_eps=_EPS,
            hidden_act=cfg.activation,
            pad_token_id=cfg.pad_token_id or 0,
            family="distilbert",
            positions="absolute",
        )
    except ConfigError as err:
        raise CheckpointError(f"{path}: {err}") from err


DISTILBERT = Family(
    name="distilbert",
    model_types=("distilbert",),
    prefix="distilbert.",
    read_config=_read_distilbert,
    embedding_parts=_EMBEDDING_PARTS,
    layer_key=re.compile(r"^transformer\.layer\.(\d+)\.(.+)$"),
    layer_parts=_LAYER_PARTS,
    sequence_style="distilbert",
    sequence_head={"pre_classifier": "head.dense", "classifier": "head.out"},
    dropped=("vocab_transform.", "vocab_layer_norm.", "vocab_projector."),  # DistilBertForMaskedLM's head
    layer_template="transformer.layer.{index}.{part}",
)
