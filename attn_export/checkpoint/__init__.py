"""Pretrained BERT-family checkpoints: safetensors loading, text calibration, encoder metrics."""

from attn_export.checkpoint.loader import (
    KNOWN_CHECKPOINTS,
    hf_to_reference_key,
    load_bert_checkpoint,
    read_bert_config,
    resolve_checkpoint,
)
from attn_export.checkpoint.metrics import embedding_agreement

__all__ = [
    "KNOWN_CHECKPOINTS",
    "embedding_agreement",
    "hf_to_reference_key",
    "load_bert_checkpoint",
    "read_bert_config",
    "resolve_checkpoint",
]
