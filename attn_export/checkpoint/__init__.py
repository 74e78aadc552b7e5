"""Pretrained encoder checkpoints: families, safetensors loading, pooling, the library reference, fidelity, text, metrics.

Names load lazily (PEP 562), so reading a checkpoint's config.json needs no torch.
"""

from __future__ import annotations

from attn_export.host.lazy import lazy_exports

_WHERE = {
    "FidelityResult": "fidelity", "check_fidelity": "fidelity",
    "KNOWN_CHECKPOINTS": "config_file", "load_bert_checkpoint": "loader", "read_bert_config": "config_file",
    "read_checkpoint_config": "config_file", "resolve_checkpoint": "config_file",
    "classification_agreement": "metrics", "embedding_agreement": "metrics", "resolve_pooling": "pooling",
}  # fmt: skip
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
