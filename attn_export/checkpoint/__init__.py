"""Pretrained encoder checkpoints: families, safetensors loading, pooling, the library reference, fidelity, text, metrics."""

from attn_export.checkpoint.fidelity import FidelityResult, check_fidelity
from attn_export.checkpoint.loader import (
    KNOWN_CHECKPOINTS,
    hf_to_reference_key,
    load_bert_checkpoint,
    read_bert_config,
    read_checkpoint_config,
    resolve_checkpoint,
)
from attn_export.checkpoint.metrics import classification_agreement, embedding_agreement
from attn_export.checkpoint.pooling import resolve_pooling

__all__ = [
    "KNOWN_CHECKPOINTS",
    "FidelityResult",
    "check_fidelity",
    "classification_agreement",
    "embedding_agreement",
    "hf_to_reference_key",
    "load_bert_checkpoint",
    "read_bert_config",
    "read_checkpoint_config",
    "resolve_checkpoint",
    "resolve_pooling",
]
