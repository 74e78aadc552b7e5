"""ALBERT (``model_type: albert``): one layer's weights at every depth, behind factorised embeddings.

transformers' ``models/albert/modeling_albert.py``: the embedding tables (word, position,
token type, LayerNorm: BERT's names) are ``embedding_size`` wide (128 in every released
ALBERT) and ``encoder.embedding_hidden_mapping_in`` projects them to ``hidden_size``, even
when the two are equal; ``encoder.albert_layer_groups.G.albert_layers.I`` holds a post-norm
layer (BERT's maths under other names) that runs at every depth of its group. The general
mechanisms are ``EncoderConfig.embedding_size`` (the projection) and ``shared_layers`` (one
module at every depth: ``layers/encoder.py``).

Every released ALBERT (base, large, xlarge, xxlarge, v1 and v2) has one group of one layer;
other ``num_hidden_groups`` / ``inner_group_num`` are refused by name. Task models save the
encoder under ``albert.``; ``AlbertForSequenceClassification`` runs the pooler (``pooler`` +
tanh on token 0) before ``classifier``, as BERT does; ``AlbertForMaskedLM`` /
``ForPreTraining`` heads and a bare encoder's pooler are dropped, as ``AutoModel`` drops them.
``hidden_act`` defaults to ``gelu_new`` (the tanh GELU), transformers' ``AlbertConfig`` default.
"""

from __future__ import annotations

import logging
import re

from attn_export.checkpoint.families.base import Family, Refusal
from attn_export.checkpoint.families.bert import BERT_EMBEDDING_PARTS, BERT_KEYS

__all__ = ["FAMILY"]

log = logging.getLogger(__name__)

_LAYER_PARTS = {
    "attention.query": "self_attn.w_q",
    "attention.key": "self_attn.w_k",
    "attention.value": "self_attn.w_v",
    "attention.dense": "self_attn.w_o",
    "attention.LayerNorm": "norm1",
    "ffn": "ffn_in",
    "ffn_output": "ffn_out",
    "full_layer_layer_norm": "norm2",
}

FAMILY = Family(
    name="albert",
    model_types=("albert",),
    prefix="albert.",
    config_keys=BERT_KEYS.with_defaults(hidden_act="gelu_new", embedding_size=128),  # transformers' AlbertConfig defaults
    refusals=(
        Refusal("num_hidden_groups", 1, "with layer weights in several groups (every released ALBERT has one)"),
        Refusal("inner_group_num", 1, "with several layers per group (every released ALBERT has one)"),
    ),
    projection="always",
    shared_layers=True,
    embedding_parts=BERT_EMBEDDING_PARTS,
    # group 0, its one layer: our layers.0, which runs at every depth
    layer_key=re.compile(r"^encoder\.albert_layer_groups\.(0)\.albert_layers\.0\.(.+)$"),
    layer_parts=_LAYER_PARTS,
    layer_template="encoder.albert_layer_groups.{index}.albert_layers.0.{part}",
    extra_parts={"encoder.embedding_hidden_mapping_in": "embeddings.project"},
    sequence_activation="tanh",
    sequence_head={"pooler": "head.dense", "classifier": "head.out"},
    dropped=("pooler.", "predictions.", "sop_classifier."),  # the bare encoder's pooler; ForMaskedLM / ForPreTraining heads
)
