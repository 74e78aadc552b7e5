"""BERT (``model_type: bert``): the layout MiniLM, BGE, E5 and GTE ship.

Weight names follow transformers' ``BertModel`` (``models/bert/modeling_bert.py``); task
models save the encoder under ``bert.``. ``BertForSequenceClassification`` runs its pooler
(``pooler.dense`` + tanh on token 0) before ``classifier``; a bare encoder's pooler is
dropped, as ``AutoModel``'s output ``last_hidden_state`` does not use it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from attn_export.checkpoint.families.base import Family
from attn_export.errors import CheckpointError, ConfigError
from attn_export.layers.encoder_config import ACTIVATIONS, EncoderConfig

__all__ = ["BERT", "BERT_EMBEDDING_PARTS", "BERT_LAYER_KEY", "BERT_LAYER_PARTS", "CONFIG_FIX", "bert_style_config"]

log = logging.getLogger(__name__)

CONFIG_FIX = "fix config.json or use the checkpoint's original one"

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


def bert_style_config(config: Mapping[str, Any], path: str, schema: type, positions: str) -> EncoderConfig:
    """config.json of a BERT-layout family (BERT, RoBERTa, ELECTRA) -> EncoderConfig; the schema fills absent keys
    with the family's transformers defaults (ELECTRA's schema adds ``embedding_size``)."""
    from attn_export.validate.schema import validate

    cfg = validate(schema, dict(config), path, CONFIG_FIX, error=CheckpointError)
    family = str(config.get("model_type") or "bert")
    if cfg.hidden_act not in ACTIVATIONS:
        raise CheckpointError(f"{path}: hidden_act: expected one of {', '.join(ACTIVATIONS)}, got {cfg.hidden_act!r}; {CONFIG_FIX}")
    if config.get("is_decoder") is True:
        raise CheckpointError(f"{path}: is_decoder: expected false (a bidirectional encoder), got true; {family} as a causal decoder is not supported")
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
            family=family,
            positions=positions,
            embedding_size=getattr(cfg, "embedding_size", None),
        )
    except ConfigError as err:
        raise CheckpointError(f"{path}: {err}") from err


def _read_bert(config: Mapping[str, Any], path: str) -> EncoderConfig:
    from attn_export.validate.checkpoint_schema import BertConfigSchema

    return bert_style_config(config, path, BertConfigSchema, "absolute")


BERT = Family(
    name="bert",
    model_types=("bert",),
    prefix="bert.",
    read_config=_read_bert,
    embedding_parts=BERT_EMBEDDING_PARTS,
    layer_key=BERT_LAYER_KEY,
    layer_parts=BERT_LAYER_PARTS,
    sequence_style="bert",
    sequence_head={"pooler.dense": "head.dense", "classifier": "head.out"},
    dropped=("pooler.", "cls."),  # the bare encoder's pooler; BertForMaskedLM / ForPreTraining heads
)
