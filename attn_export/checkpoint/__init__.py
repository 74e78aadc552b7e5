"""Pretrained BERT-family checkpoints: safetensors loading, text calibration, encoder metrics.

Names load lazily (PEP 562), so reading a checkpoint's config.json needs no torch.
"""

from __future__ import annotations

from attn_export._lazy import lazy_exports

_WHERE = {
    "KNOWN_CHECKPOINTS": "loader", "hf_to_reference_key": "loader", "load_bert_checkpoint": "loader", "read_bert_config": "loader",
    "resolve_checkpoint": "loader", "embedding_agreement": "metrics",
}  # fmt: skip
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
