"""The texts a checkpoint subject works on: the user's own first, the shipped corpus beside, long texts when asked.

Three roles (``subjects.base``): ``train`` fits, ``select`` decides, ``report`` is only
measured. With ``--calib FILE.txt`` the user's texts are the data: split 60/20/20 by
``checkpoint.corpus.split_user_texts``, every accuracy figure is on the user's report split,
and the shipped corpus's test split is judged beside it as a second, named figure. Without
it the shipped corpus's three disjoint splits are the data.

``--seq-len N`` beyond the longest judged text adds a third set: long texts built from the
corpus (whole texts joined until N tokens), so accuracy covers the profile the engine is
built for, not only short sentences. They are made of the corpus's test split only, which no
decision sees.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attn_export.errors import DataError

__all__ = ["JudgedSet", "TextData", "length_profile", "read_text_file"]

log = logging.getLogger(__name__)

_MAX_CALIB_TEXT_BYTES = 64 * 2**20
_LONG_TEXTS = 16  # long texts judged when --seq-len exceeds every report text


def read_text_file(path: Path) -> list[str]:
    """``--calib FILE.txt`` for a checkpoint: UTF-8, one text per line, blank lines skipped."""
    from attn_export.paths import check_regular_file

    path = Path(path)
    check_regular_file(path, "--calib", DataError)  # a FIFO blocks and /dev/zero reports size 0: never opened
    if path.stat().st_size > _MAX_CALIB_TEXT_BYTES:
        raise DataError(f"--calib {path} is larger than {_MAX_CALIB_TEXT_BYTES >> 20} MiB; pass at most a few thousand texts")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"--calib {path} is not UTF-8 text (byte {err.start}); save it as UTF-8, one text per line") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < 8:
        raise DataError(f"--calib {path} holds {len(lines)} texts; pass at least 8, one per line")
    return lines


def length_profile(tokens: Any) -> dict[str, float]:
    """Real tokens per text of a ``TokenBatch``: min, median, p90, max (what accuracy was judged on)."""
    n = np.asarray(tokens.attention_mask).sum(axis=1)
    return {"texts": int(len(n)), "min": int(n.min()), "p50": float(np.median(n)), "p90": float(np.percentile(n, 90)), "max": int(n.max())}


@dataclass
class JudgedSet:
    """A named set of texts every artifact is judged on beside the report split."""

    name: str  # e.g. "shipped corpus test split"
    tokens: Any  # checkpoint.text.TokenBatch
    why: str


@dataclass
class TextData:
    """The token batches of the three roles, their sources, and the extra judged sets."""

    tokens: dict[str, Any]  # role -> TokenBatch
    source: str  # the user's file, or the shipped corpus
    train_source: str
    extra: list[JudgedSet] = field(default_factory=list)
    split_note: str = ""

    @classmethod
    def build(cls, cfg: Any, tokenizer: Any, max_tokens: int) -> TextData:
        from attn_export.checkpoint.corpus import load_text_corpus, split_user_texts
        from attn_export.checkpoint.text import tokenize

        max_len = cfg.resolved_max_len
        corpus = load_text_corpus(cfg.resolved_languages, max_per_split=cfg.resolved_max_texts)
        if cfg.calib is not None:
            user = read_text_file(cfg.calib)
            train, select, report = split_user_texts(user)
            cap = cfg.resolved_max_texts
            train, select, report = train[:cap], select[:cap], report[:cap]
            name = Path(cfg.calib).name
            data = cls({r: tokenize(tokenizer, t, max_len) for r, t in (("train", train), ("select", select), ("report", report))},
                       str(cfg.calib), str(cfg.calib),
                       split_note=f"{name}: {len(user)} texts split 60/20/20 by content hash into {len(train)} train / {len(select)} select / "
                                  f"{len(report)} report")  # fmt: skip
            data.extra.append(JudgedSet("shipped corpus test split", tokenize(tokenizer, list(corpus.test), max_len),
                                        f"{corpus.source}: {len(corpus.test)} held-out texts, five languages, judged beside {name}"))  # fmt: skip
        else:
            data = cls({r: tokenize(tokenizer, list(t), max_len) for r, t in (("train", corpus.calib), ("select", corpus.val), ("report", corpus.test))},
                       corpus.source, corpus.source)  # fmt: skip
        longest = int(np.asarray(data.tokens["report"].attention_mask).sum(axis=1).max())
        if cfg.seq_len > longest:
            data.extra.append(_long_texts(tokenizer, list(corpus.test), min(cfg.seq_len, max_tokens), longest))  # held-out texts only
        return data


def _long_texts(tokenizer: Any, texts: list[str], length: int, longest: int) -> JudgedSet:
    """Corpus texts joined, whole, until each reaches ``length`` tokens (``--seq-len``): the engine's length profile."""
    from attn_export.checkpoint.text import tokenize

    joined, current, budget = [], [], 0
    for text in texts * 8:  # enough material for a few long texts even from a small corpus
        current.append(text)
        budget += len(tokenizer.encode(text).ids)
        if budget >= length:
            joined.append(" ".join(current))
            current, budget = [], 0
            if len(joined) == _LONG_TEXTS:
                break
    if len(joined) < 2:
        raise DataError(f"the corpus is too short to build texts of {length} tokens for --seq-len; lower --seq-len")
    tokens = tokenize(tokenizer, joined, length)
    return JudgedSet(f"long texts filling {length} tokens", tokens,
                     f"--seq-len {length} exceeds the longest report text ({longest} tokens): {len(joined)} texts of whole corpus sentences "
                     f"joined to {length} tokens")  # fmt: skip
