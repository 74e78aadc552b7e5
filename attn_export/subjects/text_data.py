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

Each set judged beside the report split has a twin on the select side (``select_extra``: the
corpus's select split, long texts joined from it): a route selection requires every judged data
set to pass, and reads only these twins, never the held-out sets the verdict is measured on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attn_export.errors import DataError

__all__ = ["JudgedSet", "TextData", "length_profile", "tensorrt_padding", "pair_lines", "read_text_file", "split_by_query", "usable_user_texts"]

log = logging.getLogger(__name__)

_MAX_CALIB_TEXT_BYTES = 64 * 2**20
_LONG_TEXTS = 16  # long texts judged when --seq-len exceeds every report text


def read_text_file(path: Path) -> list[str]:
    """``--calib FILE.txt`` for a checkpoint: UTF-8, one text per ``\\n``-terminated line, blank lines skipped.

    Lines end at ``\\n`` only (``\\r\\n`` too): ``str.splitlines`` would also split a text at U+2028,
    U+2029, ``\\x1c``..``\\x1e``, ``\\x85``..., turning one text into several. Fewer than
    ``MIN_USER_TEXTS`` distinct lines is refused here, before any model is loaded.
    """
    from attn_export.checkpoint.corpus import MIN_USER_TEXTS
    from attn_export.host.paths import check_regular_file

    path = Path(path)
    check_regular_file(path, "--calib", DataError)  # a FIFO blocks and /dev/zero reports size 0: never opened
    if path.stat().st_size > _MAX_CALIB_TEXT_BYTES:
        raise DataError(f"--calib {path} is larger than {_MAX_CALIB_TEXT_BYTES >> 20} MiB; pass at most a few thousand texts")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"--calib {path} is not UTF-8 text (byte {err.start}); save it as UTF-8, one text per line") from None
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    distinct = len(set(lines))
    if distinct < MIN_USER_TEXTS:
        same = f" ({distinct} distinct)" if distinct != len(lines) else ""
        raise DataError(f"--calib {path} holds {len(lines)} texts{same}; pass at least {MIN_USER_TEXTS} distinct texts, one per line")
    return lines


def _unk_id(tokenizer: Any) -> int | None:
    model = tokenizer.model
    token = getattr(model, "unk_token", None)
    if token is not None:
        return tokenizer.token_to_id(token)
    unk = getattr(model, "unk_id", None)  # Unigram
    return int(unk) if unk is not None else None


def _real_tokens(tokenizer: Any, texts: list[str], max_len: int, pairs: bool = False) -> list[tuple[tuple[int, ...], int]]:
    """Each text's token ids (truncated to ``max_len``, as tokenized) and how many are real: neither special nor unknown."""
    from attn_export.checkpoint.text import tokenizer_inputs

    tokenizer.enable_truncation(max_length=max_len)
    tokenizer.no_padding()
    unk = _unk_id(tokenizer)
    return [(tuple(e.ids), sum(1 for i, special in zip(e.ids, e.special_tokens_mask) if not special and i != unk))
            for e in tokenizer.encode_batch(tokenizer_inputs(texts, pairs))]  # fmt: skip


def pair_lines(lines: list[str], name: str) -> bool:
    """Whether a cross-encoder's ``--calib`` lines are ``text_a<TAB>text_b`` pairs: all of them or none (one line otherwise)."""
    tabbed = sum(1 for line in lines if "\t" in line)
    if tabbed and tabbed < len(lines):
        plain = next(line for line in lines if "\t" not in line)
        raise DataError(f"--calib {name}: {tabbed} of {len(lines)} lines are text pairs (text_a<TAB>text_b) and the rest single texts, e.g. "
                        f"{plain[:60]!r}; a cross-encoder reads pairs: write every line as query<TAB>candidate")  # fmt: skip
    return tabbed > 0


def split_by_query(pairs: list[str]) -> tuple[list[str], list[str], list[str]]:
    """``query<TAB>candidate`` lines as (train, select, report), every query's candidates in one split (its rank agreement
    compares them with each other): the queries are split as texts are (``checkpoint.corpus.split_user_texts``)."""
    from attn_export.checkpoint.corpus import split_user_texts

    query = {p: p.split("\t", 1)[0].strip() for p in pairs}
    roles = split_user_texts(list(dict.fromkeys(query.values())))
    role_of = {q: i for i, role in enumerate(roles) for q in role}
    out: tuple[list[str], list[str], list[str]] = ([], [], [])
    for p in pairs:
        out[role_of[query[p]]].append(p)
    return out


def usable_user_texts(tokenizer: Any, texts: list[str], prompt: Any, max_len: int, name: str, pairs: bool = False) -> tuple[list[str], str]:
    """The user's texts the model can tell apart: one per distinct token sequence, none without a real token; and a note.

    Two lines the tokenizer maps to the same ids (case or whitespace variants for an uncased
    model, texts equal in their first ``max_len`` tokens) are one input to the model: kept
    once, so a report text is never a training text in disguise. A text with no real token
    (zero-width or control characters, only unknown tokens) encodes to ``[CLS] [SEP]``, a
    near-tie of every other such text: dropped, and refused when they are the majority.
    """
    from attn_export.checkpoint.corpus import MIN_USER_TEXTS

    prompt_real = _real_tokens(tokenizer, [prompt.text], max_len)[0][1] if prompt.text else 0
    seen: set[tuple[int, ...]] = set()
    kept, empty, repeats = [], [], 0
    for text, (ids, real) in zip(texts, _real_tokens(tokenizer, prompt.apply(texts), max_len, pairs)):
        if real <= prompt_real:  # before the repeats: every such text encodes alike
            empty.append(text)
        elif ids in seen:
            repeats += 1
        else:
            seen.add(ids)
            kept.append(text)
    if empty and len(empty) * 2 >= len(empty) + len(kept):
        raise DataError(f"--calib {name}: {len(empty)} of {len(empty) + len(kept)} texts have no real token once tokenized (only special "
                        f"or unknown tokens, e.g. {empty[0]!r}); pass texts in a language and script the model's tokenizer knows")  # fmt: skip
    if len(kept) < MIN_USER_TEXTS:
        raise DataError(f"--calib {name}: {len(texts)} texts, {len(kept)} distinct once tokenized ({repeats} repeat another text as the "
                        f"tokenizer sees it, {len(empty)} have no real token); pass at least {MIN_USER_TEXTS} distinct texts")  # fmt: skip
    parts = []
    if repeats:
        parts.append(f"{repeats} dropped as repeats of another text once tokenized (case/whitespace variants the tokenizer does not tell apart)")
    if empty:
        parts.append(f"{len(empty)} dropped with no real token (only special or unknown tokens, e.g. {empty[0]!r})")
    return kept, f"{len(texts)} lines, " + ", ".join(parts) if parts else ""


def tensorrt_padding(tokens: Any, cfg: Any) -> dict[str, Any]:
    """On a TensorRT target, the padding each batching strategy leaves on these texts (``targets.length_buckets``):
    ``{"tensorrt_padding": {...}}``, else ``{}``. Uses the run's ``--length-buckets`` and ``--sort-window``;
    without buckets, powers of two up to the longest text (the engine then has one profile)."""
    from attn_export.errors import ConfigError
    from attn_export.targets.length_buckets import default_buckets, padding_fractions

    if not cfg.target_info.trt_releases:
        return {}
    lengths = [int(n) for n in np.asarray(tokens.attention_mask).sum(axis=1)]
    given = tuple(getattr(cfg.engine, "length_buckets", ()) or ())
    try:
        measured = padding_fractions(lengths, cfg.batch, given or default_buckets(max(lengths)), getattr(cfg.engine, "sort_window", None))
    except ConfigError as err:  # a text longer than the largest bucket: the report says so, the engine's runner refuses it
        return {"tensorrt_padding": {"error": str(err)}}
    return {"tensorrt_padding": {**measured.to_dict(), "buckets_from": "--length-buckets" if given else "powers of two (no --length-buckets)"}}


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
    extra: list[JudgedSet] = field(default_factory=list)  # judged beside the report split
    select_extra: list[JudgedSet] = field(default_factory=list)  # their twins from the select side, which a selection may read
    split_note: str = ""
    pairs: bool = False  # the user's texts are query<TAB>candidate pairs (a cross-encoder's), split by query
    token_types: bool = False  # the tokenizer types a pair's second text 1: every set carries token_type_ids

    @classmethod
    def build(cls, cfg: Any, tokenizer: Any, max_tokens: int, prompt: Any = None, max_len: int | None = None, reads_pairs: bool = False) -> TextData:
        """The three roles' tokens; ``prompt`` (``checkpoint.prompts.TextPrompt``) is prepended to every text and
        ``max_len`` (default ``--max-len``) is the effective token limit, as ``SentenceTransformer.encode`` tokenizes.
        ``reads_pairs`` (a sequence head): ``--calib`` lines with a TAB are ``text_a<TAB>text_b`` pairs, encoded as pairs;
        when the tokenizer types a pair's second text 1 (``checkpoint.text.pair_token_types``), every set (the shipped
        corpus's single texts too, all type 0) carries ``token_type_ids``: the encoder then takes three inputs."""
        from attn_export.checkpoint.corpus import load_text_corpus, split_user_texts
        from attn_export.checkpoint.prompts import TextPrompt
        from attn_export.checkpoint.text import pair_token_types, tokenize

        prompt = prompt or TextPrompt()
        max_len = max_len or cfg.resolved_max_len
        types = False  # set once the pairs are known, before any set is tokenized

        def tok(texts: list[str], pairs: bool = False) -> Any:
            return tokenize(tokenizer, prompt.apply(texts), max_len, pairs=pairs, token_types=types)

        corpus = load_text_corpus(cfg.resolved_languages, max_per_split=cfg.resolved_max_texts)
        pairs = False
        if cfg.calib is not None:
            name = Path(cfg.calib).name
            lines = read_text_file(cfg.calib)
            pairs = reads_pairs and pair_lines(lines, name)
            types = pairs and pair_token_types(tokenizer)
            user, counted = usable_user_texts(tokenizer, lines, prompt, max_len, name, pairs)
            train, select, report = split_by_query(user) if pairs else split_user_texts(user)
            cap = cfg.resolved_max_texts
            train, select, report = train[:cap], select[:cap], report[:cap]
            what = "query/candidate pairs split by query" if pairs else "texts split"
            data = cls({r: tok(t, pairs) for r, t in (("train", train), ("select", select), ("report", report))},
                       str(cfg.calib), str(cfg.calib), pairs=pairs, token_types=types,
                       split_note=f"{name}: {counted + '; ' if counted else ''}{len(user)} {what} 60/20/20 by content hash into "
                                  f"{len(train)} train / {len(select)} select / {len(report)} report")  # fmt: skip
            data.extra.append(JudgedSet("shipped corpus test split", tok(list(corpus.test)),
                                        f"{corpus.source}: {len(corpus.test)} held-out texts, five languages, judged beside {name}"))  # fmt: skip
            data.select_extra.append(JudgedSet("shipped corpus select split", tok(list(corpus.val)),
                                               f"{corpus.source}: {len(corpus.val)} texts, five languages, required beside {name}'s select split"))  # fmt: skip
        else:
            data = cls({r: tok(list(t)) for r, t in (("train", corpus.calib), ("select", corpus.val), ("report", corpus.test))},
                       corpus.source, corpus.source)  # fmt: skip
        longest = int(np.asarray(data.tokens["report"].attention_mask).sum(axis=1).max())
        if cfg.seq_len > longest and longest < max_tokens:
            length = min(cfg.seq_len, max_tokens)
            data.extra.append(_long_texts(tokenizer, list(corpus.test), length, longest, prompt, types))  # held-out only
            data.select_extra.append(_long_texts(tokenizer, list(corpus.val), length, longest, prompt, types, role="select split"))
        return data


def _long_texts(tokenizer: Any, texts: list[str], length: int, longest: int, prompt: Any, token_types: bool = False, role: str = "") -> JudgedSet:
    """Corpus texts joined, whole, until each reaches ``length`` tokens (``--seq-len``): the engine's length profile.
    ``role`` names the corpus split they come from when it is not the held-out test split (the selection's twin)."""
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
    tokens = tokenize(tokenizer, prompt.apply(joined), length, token_types=token_types)
    return JudgedSet(f"long texts filling {length} tokens" + (f" ({role})" if role else ""), tokens,
                     f"--seq-len {length} exceeds the longest report text ({longest} tokens): {len(joined)} texts of whole corpus sentences "
                     f"joined to {length} tokens")  # fmt: skip
