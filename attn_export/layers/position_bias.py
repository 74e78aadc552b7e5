"""An additive attention bias per head from relative positions: MPNet's (and T5's bidirectional) bucketed bias.

Why: some encoders do not (only) add position vectors to the embeddings; they add a learned
scalar per head and per *relative* position ``j - i`` to every layer's attention scores
(transformers' ``models/mpnet/modeling_mpnet.py``: ``MPNetEncoder.compute_position_bias``,
one ``relative_attention_bias`` table shared by every layer). Relative positions are bucketed
bidirectionally: half the buckets for keys before the query, half after; in each half, the
first ``buckets // 4`` distances exactly, the rest log-spaced up to ``max_distance``, beyond
which they share the last bucket.

``RelativePositionBias`` turns positions into the bias ``(B or 1, H, Lq, Lk)`` in float32; the
encoder computes it once per forward and every layer's ``attend`` adds it to its scores,
inside the softmax's float32 island, before the padding mask (the order transformers uses).
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from attn_export.errors import ConfigError

__all__ = ["RelativePositionBias", "relative_position_bucket"]

log = logging.getLogger(__name__)


def relative_position_bucket(relative: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Relative positions ``memory - context`` (any shape, int64) -> bucket ids in [0, num_buckets).

    transformers' ``MPNetEncoder.relative_position_bucket``, value for value; hand-written because
    these layers never import transformers. Two changes, neither changes a bucket: the distance fed
    to the log is clamped to >= 1, so a distance of 0 never computes log(0) (those distances take
    the exact branch), and the clamps run on float32 values (whole numbers, exact) rather than
    int64, because TensorRT's parser runs ``Clip`` on floats only (check-trt).
    """
    half = num_buckets // 2
    n = -relative
    ret = (n < 0).to(torch.long) * half  # keys after the query use the upper half
    n = torch.abs(n)
    max_exact = half // 2
    is_small = n < max_exact
    far = n.float().clamp(min=1.0) / max_exact
    # transformers: max_exact + (log(...) * ...).to(long), clamped to half - 1; trunc then add is the same whole number
    val_if_large = max_exact + torch.trunc(torch.log(far) / math.log(max_distance / max_exact) * (half - max_exact))
    val_if_large = torch.clamp(val_if_large, max=float(half - 1)).to(torch.long)
    return ret + torch.where(is_small, n, val_if_large)


class RelativePositionBias(nn.Module):
    """positions (L,) or (B, L) -> the additive attention bias (1 or B, H, L, L), float32.

    ``relative_attention_bias`` is the learned table (buckets x heads), one for the whole
    encoder. Positions are what the relative distances are taken between: ``arange(L)`` for a
    padded batch (transformers' default), each token's own position in the packed form.
    """

    def __init__(self, heads: int, num_buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__()
        if num_buckets < 4 or num_buckets % 4:
            raise ConfigError(f"expected relative attention buckets a multiple of 4 (>= 4), got {num_buckets}; use 32 (MPNet's)")
        if max_distance <= num_buckets // 4:
            raise ConfigError(f"expected a relative attention max distance > {num_buckets // 4}, got {max_distance}; use 128 (MPNet's)")
        self.heads = heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.relative_attention_bias = nn.Embedding(num_buckets, heads)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        batched = positions if positions.dim() == 2 else positions.unsqueeze(0)  # (B or 1, L)
        relative = batched[:, None, :] - batched[:, :, None]  # (B, Lq, Lk): memory - context
        bucket = relative_position_bucket(relative, self.num_buckets, self.max_distance)  # (B, Lq, Lk)
        values = self.relative_attention_bias(bucket)  # (B, Lq, Lk, H)
        return values.permute(0, 3, 1, 2).float()  # (B, H, Lq, Lk)

    def for_length(self, length: int, device: torch.device) -> torch.Tensor:
        """The bias of a padded batch of length L: positions ``arange(L)`` -> (1, H, L, L)."""
        return self(torch.arange(length, device=device))
