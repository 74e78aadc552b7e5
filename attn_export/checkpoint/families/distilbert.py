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

from attn_export.checkpoint.families.base import ConfigKeys, Family

__all__ = ["FAMILY"]

log = logging.getLogger(__name__)

_KEYS = ConfigKeys(
    names={"vocab_size": "vocab_size", "hidden_size": "dim", "num_attention_heads": "n_heads", "num_hidden_layers": "n_layers",
           "intermediate_size": "hidden_dim", "max_position_embeddings": "max_position_embeddings", "hidden_act": "activation",
           "pad_token_id": "pad_token_id"},  # fmt: skip
    defaults={"max_position_embeddings": 512, "hidden_act": "gelu", "pad_token_id": 0},
    fixed={"layer_norm_eps": 1e-12, "type_vocab_size": 0},  # eps hard-coded in its Embeddings and TransformerBlock; no token types
)
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

FAMILY = Family(
    name="distilbert",
    model_types=("distilbert",),
    prefix="distilbert.",
    config_keys=_KEYS,
    embedding_parts=_EMBEDDING_PARTS,
    layer_key=re.compile(r"^transformer\.layer\.(\d+)\.(.+)$"),
    layer_parts=_LAYER_PARTS,
    sequence_activation="relu",
    sequence_head={"pre_classifier": "head.dense", "classifier": "head.out"},
    dropped=("vocab_transform.", "vocab_layer_norm.", "vocab_projector."),  # DistilBertForMaskedLM's head
    layer_template="transformer.layer.{index}.{part}",
)
