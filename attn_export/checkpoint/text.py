"""Real text for a real checkpoint: the shipped corpus, its three splits, tokenization and layer activations.

Random inputs hide what compression does to a pretrained encoder: its activations have
the outliers and the structure of language, and int8 ranges and activation-aware low-rank
factors must be fitted to those. The project ships a multilingual corpus
(``attn_export/data/text/corpus_<lang>.txt``, original sentences written for attn-export)
in several registers, split deterministically into three disjoint sets, a tokenizer front
end built on ``tokenizers`` alone, and a hook that records the real inputs of any layer.

Why three splits: a figure is only honest on text that no decision saw. ``calib`` fits
quantization ranges and trains distillation; ``val`` drives decisions (early stopping,
int8 fallback, route selection), so it is no longer unseen once used; ``test`` is only
reported.

Split rule (documented in ``attn_export/data/text/README.md``): each file is a list of
topic groups of four sentences (two paraphrase pairs) separated by blank lines; group
``g`` (0-based, per file, comments and blank lines ignored) is validation when
``g % 5 == 3``, test when ``g % 5 == 4`` and calibration otherwise. Whole topics go one
way, so no two splits share a topic. Inside a split, groups are interleaved round-robin
over (register, language), so every prefix (``max_per_split``) is as balanced as it can be.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from attn_export.compress.calib_data import ActivationSet, CalibrationData
from attn_export.data import shipped_path
from attn_export.errors import ConfigError, DataError
from attn_export.layers.encoder import SentenceEncoder

__all__ = [
    "CORPUS_DIR",
    "GROUP_SIZE",
    "LANGUAGES",
    "REGISTERS",
    "SPLITS",
    "SPLIT_PERIOD",
    "Split",
    "TextCorpus",
    "TokenBatch",
    "TokenSplits",
    "TopicGroup",
    "all_layer_inputs",
    "layer_inputs",
    "load_text_corpus",
    "load_tokenizer",
    "normalize_sentence",
    "read_corpus_groups",
    "read_topic_groups",
    "split_of_group",
    "text_calibration",
    "text_token_splits",
    "tokenize",
]

log = logging.getLogger(__name__)

CORPUS_DIR = shipped_path("text")  # package data, found through importlib.resources
LANGUAGES: tuple[str, ...] = ("en", "zh", "de", "es", "fr")
REGISTERS: tuple[str, ...] = ("technical", "conversation", "news", "instructions")
UNMARKED = "unmarked"  # the register of groups before any ``# register:`` line
Split = Literal["calib", "val", "test"]
SPLITS: tuple[Split, ...] = ("calib", "val", "test")
SPLIT_PERIOD = 5  # group g: g % 5 == 3 -> val, g % 5 == 4 -> test, else calib (60/20/20)
GROUP_SIZE = 4  # two paraphrase pairs: sentences (0, 1) and (2, 3)
_REGISTER_LINE = re.compile(r"#\s*register\s*:(.*)$", re.IGNORECASE)
_REGISTER_NAME = re.compile(r"[a-z][a-z0-9_-]*")


def split_of_group(index: int) -> Split:
    """The split of topic group ``index`` (0-based, counted per corpus file)."""
    rest = index % SPLIT_PERIOD
    return "val" if rest == 3 else "test" if rest == 4 else "calib"


def normalize_sentence(text: str) -> str:
    """The key two sentences must not share: NFKC, case-folded, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


@dataclass(frozen=True)
class TopicGroup:
    """Four sentences about one topic (two paraphrase pairs), where they are and which split they go to."""

    language: str
    register: str
    index: int  # 0-based position of the group in its file
    line: int  # 1-based line of its first sentence
    sentences: tuple[str, ...]
    file: str = ""

    @property
    def split(self) -> Split:
        return split_of_group(self.index)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class TextCorpus:
    """Disjoint calibration, validation and test texts, and where they came from.

    ``calib`` fits ranges and trains; ``val`` drives decisions; ``test`` is only reported.
    ``groups`` lists every topic group read (before any ``max_per_split`` cap); inside a
    split, the sentences of a group are consecutive, so ``partners`` can pair them up.
    """

    calib: list[str]
    val: list[str]
    languages: tuple[str, ...]
    source: str
    test: list[str] = field(default_factory=list)
    groups: tuple[TopicGroup, ...] = ()

    def split(self, name: Split) -> list[str]:
        if name not in SPLITS:
            raise ConfigError(f"expected a split from {', '.join(SPLITS)}, got {name!r}")
        return {"calib": self.calib, "val": self.val, "test": self.test}[name]

    def partners(self, name: Split) -> np.ndarray:
        """Index of each text's paraphrase partner in split ``name`` (N,); -1 where a cap cut it off."""
        n = len(self.split(name))
        idx = np.arange(n) ^ 1  # pairs (0, 1), (2, 3), ... because groups are whole and in order
        idx[idx >= n] = -1
        return idx

    def counts(self) -> dict[tuple[str, str, Split], int]:
        """Sentences per (language, register, split) over every group read (before any cap)."""
        out: dict[tuple[str, str, Split], int] = {}
        for g in self.groups:
            key = (g.language, g.register, g.split)
            out[key] = out.get(key, 0) + len(g.sentences)
        return out


@dataclass
class TokenBatch:
    """Tokenized texts: ``input_ids`` and ``attention_mask`` int64 (N, S), 1 = real token."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    texts: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    def feed(self) -> dict[str, np.ndarray]:
        """The ONNX feed of the exported encoder (input name -> array)."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}

    def to_torch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(self.input_ids), torch.from_numpy(self.attention_mask)

    def feeds(self, batch_size: int, uniform: bool = False, limit: int | None = None, trim: bool = False) -> list[dict[str, np.ndarray]]:
        """Feed dicts of ``batch_size`` texts (at most ``limit`` texts in all).

        ``uniform=True`` fills the last batch by wrapping around to the first texts, so every
        feed has the same shape: ONNX Runtime's histogram calibrators stack them.
        ``trim=True`` cuts each batch to its own longest text: the padded tail is masked, so
        pooled embeddings are unchanged, and a corpus padded to 64 tokens against a 26-token
        average costs ~2.5x less to run.
        """
        n = len(self) if limit is None else max(1, min(limit, len(self)))
        order = np.arange(n)
        if uniform and n % batch_size:
            order = np.concatenate([order, np.arange(batch_size - n % batch_size) % n])
        out = []
        for idx in np.array_split(order, range(batch_size, len(order), batch_size)):
            ids, mask = self.input_ids[idx], self.attention_mask[idx]
            if trim and not uniform:
                width = max(1, int(mask.sum(axis=1).max()))
                ids, mask = ids[:, :width], mask[:, :width]
            out.append({"input_ids": np.ascontiguousarray(ids), "attention_mask": np.ascontiguousarray(mask)})
        return out

    def batches(self, batch_size: int) -> Iterator["TokenBatch"]:
        """Consecutive slices of ``batch_size`` texts (the last may be shorter)."""
        for start in range(0, len(self), batch_size):
            stop = start + batch_size
            yield TokenBatch(self.input_ids[start:stop], self.attention_mask[start:stop], self.texts[start:stop])


@dataclass
class TokenSplits:
    """The whole encoder's inputs: calibration, validation and (when the corpus has one) test texts."""

    calib: TokenBatch
    val: TokenBatch
    source: str
    test: TokenBatch | None = None


@functools.lru_cache(maxsize=32)
def _parse_file(path: str, language: str, _stamp: tuple[int, int]) -> tuple[TopicGroup, ...]:
    """Parse one corpus file; cached per (path, mtime, size), so repeated loads cost nothing."""
    name = Path(path).name
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"text corpus {path} is not UTF-8 (byte {err.start}); save it as UTF-8") from err
    groups: list[TopicGroup] = []
    current: list[str] = []  # the sentences of the group being read
    register, first_line = UNMARKED, 0

    def close() -> None:
        if not current:
            return
        if len(current) != GROUP_SIZE:
            raise DataError(
                f"{name}:{first_line}: expected a topic group of {GROUP_SIZE} sentences (two paraphrase pairs), "
                f"got {len(current)}; separate groups with a blank line"
            )
        groups.append(TopicGroup(language, register, len(groups), first_line, tuple(current), name))
        current.clear()

    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            close()
            continue
        if line.startswith("#"):
            marker = _REGISTER_LINE.match(line)
            if marker:
                close()
                register = marker.group(1).strip()
                if not _REGISTER_NAME.fullmatch(register):
                    raise DataError(f"{name}:{number}: expected '# register: <name>' with a lower-case name such as {REGISTERS[0]}, got {line!r}")
            continue
        if not current:
            first_line = number
        current.append(line)
    close()
    if not groups:
        raise DataError(f"text corpus {path} holds no sentences; write one sentence per line, {GROUP_SIZE} per topic group")
    return tuple(groups)


def read_topic_groups(path: str | os.PathLike[str], language: str | None = None) -> list[TopicGroup]:
    """Topic groups of a corpus file, checked: ``GROUP_SIZE`` sentences each, valid register markers.

    Blank lines separate groups; ``#`` lines are comments, except ``# register: <name>``,
    which sets the register of the groups that follow. ``language`` defaults to the
    ``<lang>`` of ``corpus_<lang>.txt``.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"text corpus {path} does not exist; expected one of {CORPUS_DIR}/corpus_<lang>.txt")
    if language is None:
        language = path.stem.removeprefix("corpus_")
    stat = path.stat()
    return list(_parse_file(str(path.resolve()), language, (stat.st_mtime_ns, stat.st_size)))


def read_corpus_groups(path: str | os.PathLike[str]) -> list[list[str]]:
    """The sentences of each topic group of a corpus file (see ``read_topic_groups``)."""
    return [list(g.sentences) for g in read_topic_groups(path)]


def _register_rank(register: str) -> tuple[int, str]:
    return (REGISTERS.index(register), "") if register in REGISTERS else (len(REGISTERS), register)


def _interleave(groups: Sequence[TopicGroup], languages: Sequence[str]) -> list[TopicGroup]:
    """Round-robin over (register, language) cells, file order inside each cell: any prefix is balanced."""
    cells: dict[tuple[tuple[int, str], int], list[TopicGroup]] = {}
    for g in groups:
        cells.setdefault((_register_rank(g.register), languages.index(g.language)), []).append(g)
    keys = sorted(cells)
    depth = max((len(c) for c in cells.values()), default=0)
    return [cells[k][r] for r in range(depth) for k in keys if r < len(cells[k])]


def _check_unique(groups: Sequence[TopicGroup]) -> None:
    seen: dict[str, tuple[str, TopicGroup]] = {}
    for g in groups:
        for sentence in g.sentences:
            key = normalize_sentence(sentence)
            if key in seen:
                first, other = seen[key]
                where = f"in two splits ({other.split} and {g.split})" if other.split != g.split else f"twice in the {g.split} split"
                raise DataError(
                    f"text corpus: {sentence!r} ({g.where}) repeats {first!r} ({other.where}) {where}; "
                    "make every sentence unique (case and whitespace are ignored)"
                )
            seen[key] = (sentence, g)


def _check_limit(max_per_split: int | None) -> None:
    if max_per_split is not None and (isinstance(max_per_split, bool) or not isinstance(max_per_split, int) or max_per_split < 1):
        raise ConfigError(f"expected max_per_split to be a positive int or None, got {max_per_split!r}")


def _cap(texts: list[str], limit: int | None) -> list[str]:
    return texts if limit is None else texts[:limit]


def load_text_corpus(
    languages: Sequence[str] | None = None,
    directory: str | os.PathLike[str] | None = None,
    max_per_split: int | None = None,
) -> TextCorpus:
    """Read ``corpus_<lang>.txt`` for each language and split it by topic group (see module doc).

    ``max_per_split`` keeps the first N texts of each split (for quick runs); the order
    interleaves registers and languages, so a small cap still covers all of them.
    A multiple of ``GROUP_SIZE`` keeps every paraphrase pair whole.
    """
    langs = tuple(languages) if languages else LANGUAGES
    if len(set(langs)) != len(langs):
        raise ConfigError(f"expected each corpus language once, got {', '.join(langs)}")
    unknown = [lang for lang in langs if lang not in LANGUAGES] if directory is None else []
    if unknown:
        raise ConfigError(f"expected languages from {', '.join(LANGUAGES)}, got {', '.join(unknown)}")
    _check_limit(max_per_split)
    root = Path(directory) if directory is not None else CORPUS_DIR
    groups = [g for lang in langs for g in read_topic_groups(root / f"corpus_{lang}.txt", lang)]
    _check_unique(groups)
    texts: dict[Split, list[str]] = {}
    for name in SPLITS:
        ordered = _interleave([g for g in groups if g.split == name], langs)
        texts[name] = [s for g in ordered for s in g.sentences]
    if not all(texts.values()):
        got = ", ".join(f"{len(texts[s])} {s}" for s in SPLITS)
        raise DataError(f"text corpus {root}: got {got} texts; need >= {SPLIT_PERIOD} topic groups per file for three splits")
    return TextCorpus(
        _cap(texts["calib"], max_per_split),
        _cap(texts["val"], max_per_split),
        langs,
        f"text:{root.name}/{'+'.join(langs)}",
        _cap(texts["test"], max_per_split),
        tuple(groups),
    )


def load_tokenizer(checkpoint_dir: str | os.PathLike[str]) -> Any:
    """``tokenizers.Tokenizer`` from the checkpoint's ``tokenizer.json`` (no ``transformers``)."""
    from tokenizers import Tokenizer

    path = Path(checkpoint_dir) / "tokenizer.json"
    if not path.is_file():
        raise DataError(f"expected {path}; export a fast tokenizer with tokenizer.save_pretrained(dir) next to the weights")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
        raise DataError(f"{path} is not a readable tokenizer.json ({err}); re-save it with tokenizers") from err


def _pad_id(tokenizer: Any) -> int:
    padding = tokenizer.padding
    if padding and "pad_id" in padding:
        return int(padding["pad_id"])
    for token in ("[PAD]", "<pad>"):  # BERT-style, then RoBERTa/XLM-R-style vocabularies (where id 0 is <s>)
        pad = tokenizer.token_to_id(token)
        if pad is not None:
            return int(pad)
    return 0


def tokenize(tokenizer: Any, texts: Sequence[str], max_len: int = 128, pad_to: int | None = None) -> TokenBatch:
    """Tokenize with special tokens, truncate to ``max_len``; pad to the longest text or to ``pad_to``.

    The tokenizer is configured in place (truncation to ``max_len``, its own padding off:
    ``tokenizer.json`` files often pad to a fixed length, which would hide ``pad_to``).
    """
    if not texts:
        raise DataError("expected at least one text to tokenize, got none")
    if max_len < 2 or (pad_to is not None and not 1 <= pad_to <= max_len):
        raise ConfigError(f"expected max_len >= 2 and 1 <= pad_to <= max_len, got max_len={max_len}, pad_to={pad_to}")
    tokenizer.enable_truncation(max_length=max_len)
    tokenizer.no_padding()
    encodings = tokenizer.encode_batch(list(texts))
    length = pad_to or max(len(e.ids) for e in encodings)
    ids = np.full((len(texts), length), _pad_id(tokenizer), dtype=np.int64)
    mask = np.zeros((len(texts), length), dtype=np.int64)
    for i, enc in enumerate(encodings):
        n = min(len(enc.ids), length)
        ids[i, :n] = enc.ids[:n]
        mask[i, :n] = 1
    return TokenBatch(ids, mask, list(texts))


def text_token_splits(
    tokenizer: Any, max_len: int = 128, corpus: TextCorpus | None = None, max_per_split: int | None = None
) -> TokenSplits:
    """The corpus (default: the shipped one) as encoder inputs, one ``TokenBatch`` per split.

    ``max_per_split`` keeps the first N texts of each split (the corpus order is balanced
    over languages and registers); ``test`` is None when the corpus has no test texts.
    """
    _check_limit(max_per_split)
    corpus = corpus or load_text_corpus(max_per_split=max_per_split)
    calib, val, test = (_cap(corpus.split(s), max_per_split) for s in SPLITS)
    return TokenSplits(
        tokenize(tokenizer, calib, max_len),
        tokenize(tokenizer, val, max_len),
        corpus.source,
        tokenize(tokenizer, test, max_len) if test else None,
    )


@torch.no_grad()
def layer_inputs(encoder: SentenceEncoder, tokens: TokenBatch, layer_index: int, batch_size: int = 32) -> ActivationSet:
    """The hidden states (N, S, D) and mask that ``encoder.layers[layer_index]`` sees on ``tokens``."""
    return all_layer_inputs(encoder, tokens, batch_size, layers=[layer_index])[layer_index]


class _StopForward(Exception):
    """Raised by the capture hook after the deepest wanted layer: the rest of the encoder is skipped."""


@torch.no_grad()
def all_layer_inputs(encoder: SentenceEncoder, tokens: TokenBatch, batch_size: int = 32, layers: Sequence[int] | None = None) -> dict[int, ActivationSet]:
    """Inputs of several layers (default: all) from one pass over ``tokens``: index -> ActivationSet.

    The pass stops at the deepest requested layer, so early layers cost only their share.
    """
    wanted = sorted(set(range(len(encoder.layers)) if layers is None else layers))
    bad = [i for i in wanted if not 0 <= i < len(encoder.layers)]
    if bad or not wanted:
        raise ConfigError(f"expected layer indices in 0..{len(encoder.layers) - 1}, got {list(layers or [])}")
    captured: dict[int, list[torch.Tensor]] = {i: [] for i in wanted}

    def hook_for(index: int) -> Any:
        def hook(_module: torch.nn.Module, args: tuple[Any, ...]) -> None:
            captured[index].append(args[0].detach().float())  # (b, S, D)
            if index == wanted[-1]:
                raise _StopForward

        return hook

    handles = [encoder.layers[i].register_forward_pre_hook(hook_for(i)) for i in wanted]
    was_training = encoder.training
    try:
        encoder.eval()
        for part in tokens.batches(batch_size):
            try:
                encoder(*part.to_torch())
            except _StopForward:
                pass
    finally:
        for h in handles:
            h.remove()
        encoder.train(was_training)
    mask = tokens.attention_mask.astype(np.int32)
    return {i: ActivationSet(torch.cat(captured[i]).numpy(), mask) for i in wanted}


def text_calibration(
    encoder: SentenceEncoder,
    tokenizer: Any,
    layer_index: int,
    max_len: int = 64,
    corpus: TextCorpus | None = None,
    max_per_split: int | None = None,
) -> CalibrationData:
    """Real calibration/validation inputs of layer ``layer_index``, from the shipped corpus.

    The test split is left out on purpose: layer-level data feeds fitting and decisions only.
    """
    if max_len > encoder.config.max_position_embeddings:
        raise ConfigError(f"expected max_len <= {encoder.config.max_position_embeddings} (the checkpoint's positions), got {max_len}")
    splits = text_token_splits(tokenizer, max_len, corpus, max_per_split)
    data = CalibrationData(
        layer_inputs(encoder, splits.calib, layer_index),
        layer_inputs(encoder, splits.val, layer_index),
        f"{splits.source}@layer{layer_index}",
    )
    log.info("text calibration: %s", data.describe())
    return data
