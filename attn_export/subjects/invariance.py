"""The batch-invariance figure of a text subject (``validate.batch_invariance``): its own texts, its own runner."""

from __future__ import annotations

from attn_export.runtime.base import Runner
from attn_export.validate.batch_invariance import INVARIANCE_TEXTS, BatchInvariance, measure_batch_invariance

__all__ = ["TextBatchInvariance"]


class TextBatchInvariance:
    """Mixed into the checkpoint subjects: the first ``limit`` texts of a data set, each alone and inside batches."""

    judged_output: str  # the output users read; the subject also has ``_set`` (a data set's tokens) and ``encoder_runner``

    def batch_invariance(self, candidate: Runner, split: str, limit: int = INVARIANCE_TEXTS) -> BatchInvariance:
        """The figure of what users read (``judged_output``) on the first ``limit`` texts of ``split``."""
        tokens = self._set(split)  # type: ignore[attr-defined]
        n = max(1, min(limit, len(tokens)))
        feed = tokens.feeds(n, limit=n)[0]  # the first n texts, one array each
        runner = self.encoder_runner(candidate)  # type: ignore[attr-defined]
        output = self.judged_output
        return measure_batch_invariance(feed, list(tokens.texts[:n]), lambda f: runner.infer(f)[output])
