"""Length-bucketed optimization profiles for TensorRT 10.x, and the padding each batching strategy leaves.

Why: TensorRT 10.x (JetPack 6 ships 10.3) has no packed (ragged) attention, so a batch of real
sentences runs on the (batch, seq) grid and pays for every padding slot. What a 10.x engine can
do is carry several optimization profiles, one per length bucket, each tuned for its own length
(the builder's auto-tuner optimizes for a profile's ``opt`` shape: TensorRT developer guide,
"Working with Dynamic Shapes / Optimization Profiles"), and a runner that sorts texts by length
within the window the user allows, cuts batches, and sends each batch to the smallest profile
that holds it. The bucket's length is the profile's opt and max seq. A batch is padded to its own
longest text, not to its bucket: on the shipped corpus's report split (MiniLM tokens, buckets
32,64,128) padding to the bucket left 3 to 25 points more padding than one dynamic profile did,
while sorting within a window of 256 texts took batch-8 padding from 22.7% to 3.6%
(docs/targets.md). Sorting is what removes padding; the buckets give each length range a profile
whose tactics were tuned for it.

Everything here is pure arithmetic over token lengths (no TensorRT, no tokenizer): the profiles
``bucket_profiles`` gives the builder, the choice ``choose_profile`` makes for the runner, the
batches ``batch_order`` cuts, and ``padding_fractions``: the share of token slots that are
padding under each strategy:

* ``padded``: batches in the user's order, each padded to its longest text (one dynamic profile);
* ``bucketed``: sorted by length within the window, each batch padded to its longest text and run
  on the smallest profile holding it (what ``TrtRunner`` does);
* ``bucket_max``: as bucketed, but each batch padded to its bucket (a static seq per profile, which
  CUDA graphs or a static-shape server would need): the cost of that choice;
* ``packed``: real tokens only (TensorRT 11's ``IAttention`` packed layouts, ONNX Runtime's packed
  form), each batch's token count rounded up to ``align``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from attn_export.errors import ConfigError
from attn_export.targets.shape_profile import MAX_PROFILE_SEQ, ShapeProfile

__all__ = [
    "STRATEGIES",
    "PaddingByStrategy",
    "batch_order",
    "bucket_of",
    "bucket_profiles",
    "check_sort_window",
    "default_buckets",
    "choose_profile",
    "padding_fractions",
    "parse_length_buckets",
]

STRATEGIES = ("padded", "bucketed", "bucket_max", "packed")

ProfileShapes = Mapping[str, tuple[Sequence[int], Sequence[int], Sequence[int]]]  # input -> (min, opt, max)


def parse_length_buckets(text: str | None, flag: str = "--length-buckets") -> tuple[int, ...]:
    """'32,64,128' -> (32, 64, 128): strictly increasing positive token counts ('' or None: no buckets)."""
    if text is None or not str(text).strip():
        return ()
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) > 16:
        # each profile is one more set of tactics timed at build time and kept in the plan
        raise ConfigError(f"expected at most 16 {flag}, got {len(parts)}; merge neighbouring lengths")
    if not all(re.fullmatch(r"[0-9]+", p) for p in parts):  # ASCII digits: \d would take other scripts' digits
        raise ConfigError(f"expected {flag} as increasing token counts joined by commas (e.g. 32,64,128,256), got {text!r}")
    if any(len(p.lstrip("0")) > len(str(MAX_PROFILE_SEQ)) for p in parts):  # named before int() reads a huge number
        big = next(p for p in parts if len(p.lstrip("0")) > len(str(MAX_PROFILE_SEQ)))
        shown = big if len(big) <= 20 else big[:20] + "..."
        raise ConfigError(
            f"expected {flag} at most {MAX_PROFILE_SEQ} tokens, got {shown}; "
            "TensorRT sizes buffers for the max"
        )
    buckets = tuple(int(p) for p in parts)
    if buckets[0] < 1 or any(b >= c for b, c in zip(buckets, buckets[1:])):
        raise ConfigError(f"expected {flag} strictly increasing and positive (e.g. 32,64,128,256), got {text!r}")
    if buckets[-1] > MAX_PROFILE_SEQ:
        raise ConfigError(f"expected {flag} at most {MAX_PROFILE_SEQ} tokens, got {buckets[-1]}; TensorRT sizes buffers for the max")
    return buckets


def check_sort_window(window: int | None, flag: str = "--sort-window") -> None:
    """The sort window is a count of texts the runner may reorder together (None: the batch itself)."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ConfigError(f"expected {flag} as a positive number of texts, got {window!r}")


def bucket_profiles(base: ShapeProfile, buckets: Sequence[int] | None) -> tuple[ShapeProfile, ...]:
    """One profile per bucket: seq from the previous bucket + 1 up to the bucket (opt = max = the bucket).

    The batch range is ``base``'s. The ranges do not overlap, so each length has one profile
    tuned for it; a batch goes to the smallest that holds its longest text (``choose_profile``).
    """
    if not buckets:
        return (base,)
    out, lo = [], max(1, base.min[1])
    for b in buckets:
        if b < lo:
            raise ConfigError(f"expected --length-buckets above the profile's min seq {base.min[1]}, got bucket {b}")
        out.append(ShapeProfile((base.min[0], lo), (base.opt[0], b), (base.max[0], b)))
        lo = b + 1
    return tuple(out)


def choose_profile(shapes: Mapping[str, Sequence[int]], profiles: Sequence[ProfileShapes]) -> int | None:
    """Index of the smallest profile whose [min, max] holds every input's shape; None when none does.

    "Smallest" is the fewest elements at the profile's max shape over the given inputs, so a
    batch of short texts never lands on a profile built for long ones. Inputs a profile does
    not name (static inputs) are not constrained by it.
    """
    best: tuple[int, int] | None = None
    for index, profile in enumerate(profiles):
        size, holds = 0, True
        for name, shape in shapes.items():
            if name not in profile:
                continue
            lo, _, hi = profile[name]
            if len(shape) != len(lo) or any(s < a or s > b for s, a, b in zip(shape, lo, hi)):
                holds = False
                break
            size += _volume(hi)
        if holds and (best is None or size < best[0]):
            best = (size, index)
    return None if best is None else best[1]


def _volume(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def default_buckets(longest: int, first: int = 16) -> tuple[int, ...]:
    """Powers of two from ``first`` up to the first that holds ``longest`` tokens: what the report measures
    when no ``--length-buckets`` were given (the engine then has one profile)."""
    out = [first]
    while out[-1] < longest:
        out.append(out[-1] * 2)
    return tuple(out)


def bucket_of(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket holding ``length`` tokens (ConfigError naming the fix when none does)."""
    for b in buckets:
        if length <= b:
            return b
    raise ConfigError(f"a batch's longest text has {length} tokens, beyond the largest --length-buckets {buckets[-1]}; add a bucket >= {length}")


def batch_order(lengths: Sequence[int], batch_size: int, sort_window: int | None = None) -> list[list[int]]:
    """Indices of ``lengths`` cut into batches: sorted by length (stable) within each window of
    ``sort_window`` texts, then cut into ``batch_size``; None sorts nothing (the user's order)."""
    if batch_size < 1:
        raise ConfigError(f"expected a batch size >= 1, got {batch_size}")
    check_sort_window(sort_window)
    order = list(range(len(lengths)))
    if sort_window is not None:
        order = [i for start in range(0, len(order), sort_window)
                 for i in sorted(order[start:start + sort_window], key=lambda j: lengths[j])]  # fmt: skip
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


@dataclass(frozen=True)
class PaddingByStrategy:
    """Padding share of token slots per strategy, on the texts and batching it names."""

    texts: int
    real_tokens: int
    batch: int
    sort_window: int | None
    buckets: tuple[int, ...]
    fractions: dict[str, float]
    slots: dict[str, int]

    def to_dict(self) -> dict[str, object]:
        return {"texts": self.texts, "real_tokens": self.real_tokens, "batch": self.batch, "sort_window": self.sort_window,
                "length_buckets": list(self.buckets), **{s: round(f, 4) for s, f in self.fractions.items()}}  # fmt: skip

    def __str__(self) -> str:
        window = f"sort window {self.sort_window}" if self.sort_window else "no sorting"
        shares = ", ".join(f"{s} {100 * f:.1f}%" for s, f in self.fractions.items())
        return f"padding on {self.texts} texts in batches of {self.batch} ({window}, buckets {','.join(map(str, self.buckets))}): {shares}"


def padding_fractions(lengths: Sequence[int], batch_size: int, buckets: Sequence[int], sort_window: int | None = None,
                      align: int = 1) -> PaddingByStrategy:  # fmt: skip
    """The share of token slots that are padding under each of ``STRATEGIES`` (see the module doc).

    ``sort_window`` None means the batch itself: ``bucketed`` then reorders within each batch
    only, which does not change which texts share a batch (its padding equals ``padded``).
    """
    if not lengths:
        raise ConfigError("expected at least one text to measure padding on, got none")
    if min(lengths) < 1:
        raise ConfigError(f"expected every text to have at least one token, got a length of {min(lengths)}")
    if not buckets:
        raise ConfigError("expected --length-buckets to measure bucketed padding, got none")
    if align < 1:
        raise ConfigError(f"expected an alignment >= 1 token, got {align}")
    window = sort_window if sort_window is not None else batch_size
    real = int(sum(lengths))
    slots = {
        "padded": sum(len(b) * max(lengths[i] for i in b) for b in batch_order(lengths, batch_size)),
        "bucketed": sum(len(b) * max(lengths[i] for i in b) for b in batch_order(lengths, batch_size, window)),
        "bucket_max": sum(len(b) * bucket_of(max(lengths[i] for i in b), buckets) for b in batch_order(lengths, batch_size, window)),
        "packed": sum(-(-sum(lengths[i] for i in b) // align) * align for b in batch_order(lengths, batch_size)),
    }
    fractions = {s: 1.0 - real / slots[s] for s in STRATEGIES}
    return PaddingByStrategy(len(lengths), real, batch_size, sort_window, tuple(buckets), fractions, slots)
