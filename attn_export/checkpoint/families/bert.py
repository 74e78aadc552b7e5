"""BERT (``model_type: bert``): the layout MiniLM, BGE, E5 and GTE ship.

Weight names follow transformers' ``BertModel`` (``models/bert/modeling_bert.py``); task
models save the encoder under ``bert.``. ``BertForSequenceClassification`` runs its pooler
(``pooler.dense`` + tanh on token 0) before ``classifier``; a bare encoder's pooler is
dropped, as ``AutoModel``'s output ``last_hidden_state`` does not use it. RoBERTa, ELECTRA
and ALBERT start from the key names and refusals defined here.
"""

from __future__ import annotations

import logging
import re

from attn_export.checkpoint.families.base import ConfigKeys, Family, Refusal

__all__ = ["BERT_EMBEDDING_PARTS", "BERT_KEYS", "BERT_LAYER_KEY", "BERT_LAYER_PARTS", "BERT_REFUSALS", "FAMILY"]

log = logging.getLogger(__name__)

# BertConfig's keys; transformers' defaults for the optional ones (the sizes are required)
BERT_KEYS = ConfigKeys(
    names={f: f for f in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")},
).with_defaults(max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=0)
BERT_REFUSALS: tuple[Refusal, ...] = (
    # relative_key / relative_key_query: an absolute-position re-implementation would ignore them
    Refusal("position_embedding_type", "absolute", "with relative position embeddings"),
    Refusal("is_decoder", False, "as a causal decoder (these layers are a bidirectional encoder)"),
)
BERT_LAYER_PARTS: dict[str, str] = {
    "attention.self.query": "self_attn.w_q",
    "attention.self.key": "self_attn.w_k",
    "attention.self.value": "self_attn.w_v",
    "attention.output.dense": "self_attn.w_o",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "ffn_in",
    "output.dense": "ffn_out",
    "output.LayerNorm": "norm2",
}
BERT_EMBEDDING_PARTS: dict[str, str] = {
    "embeddings.word_embeddings": "embeddings.word_embeddings",
    "embeddings.position_embeddings": "embeddings.position_embeddings",
    "embeddings.token_type_embeddings": "embeddings.token_type_embeddings",
    "embeddings.LayerNorm": "embeddings.norm",
}
BERT_LAYER_KEY = re.compile(r"^encoder\.layer\.(\d+)\.(.+)$")

FAMILY = Family(
    name="bert",
    model_types=("bert",),
    prefix="bert.",
    config_keys=BERT_KEYS,
    refusals=BERT_REFUSALS,
    embedding_parts=BERT_EMBEDDING_PARTS,
    layer_key=BERT_LAYER_KEY,
    layer_parts=BERT_LAYER_PARTS,
    sequence_activation="tanh",
    sequence_head={"pooler.dense": "head.dense", "classifier": "head.out"},
    dropped=("pooler.", "cls."),  # the bare encoder's pooler; BertForMaskedLM / ForPreTraining heads
)
