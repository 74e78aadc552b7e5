"""Subjects: what the one pipeline compresses, exports and judges (see ``subjects.base``).

``kinds`` says what each kind of subject means for a ``RunConfig`` before anything is built
(light); ``make_subject`` builds the subject a config names. Names load lazily (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attn_export.host.lazy import lazy_exports

if TYPE_CHECKING:
    from attn_export.subjects.base import Subject
    from attn_export.vocab.run_options import RunOptions

_WHERE = {"Judgement": "base", "Split": "base", "Subject": "base", "SubjectProfile": "kinds", "kind_of": "kinds"}
__all__ = ["Judgement", "Split", "Subject", "SubjectProfile", "kind_of", "make_subject"]
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)


def make_subject(cfg: RunOptions) -> Subject:
    """The subject a ``RunConfig`` names: a reference layer, a checkpoint, or layer N of one."""
    kind = cfg.kind.name
    if kind == "encoder":
        from attn_export.subjects.encoder import EncoderSubject

        return EncoderSubject(cfg)
    if kind == "encoder-layer":
        from attn_export.subjects.encoder_layer import EncoderLayerSubject

        return EncoderLayerSubject(cfg)
    from attn_export.subjects.layer import LayerSubject

    return LayerSubject(cfg)
