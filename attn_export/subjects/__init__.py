"""Subjects: what the one pipeline compresses, exports and judges (see ``subjects.base``)."""

from __future__ import annotations

from typing import Any

from attn_export.subjects.base import Judgement, Split, Subject

__all__ = ["Judgement", "Split", "Subject", "make_subject"]


def make_subject(cfg: Any) -> Subject:
    """The subject a ``RunConfig`` names: a checkpoint (``--checkpoint``) or a reference layer."""
    if cfg.is_checkpoint:
        from attn_export.subjects.encoder import EncoderSubject

        return EncoderSubject(cfg)
    from attn_export.subjects.layer import LayerSubject

    return LayerSubject(cfg)
