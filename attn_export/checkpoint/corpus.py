"""The shipped text corpus: multilingual sentences in topic groups, three disjoint splits, and the user's own texts.

Random inputs hide what compression does to a pretrained encoder: its activations have
the outliers and the structure of language, and 8-bit ranges and activation-aware low-rank
factors must be fitted to those. The project ships a multilingual corpus
(``attn_export/data/text/corpus_<lang>.txt``, original sentences written for attn-export)
in several registers, split deterministically into three disjoint sets.

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

A user's own texts (``--calib FILE.txt``) get the same three roles: ``split_user_texts``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from attn_export.data import shipped_path
from attn_export.errors import ConfigError, DataError

__all__ = [
    "CORPUS_DIR",
    "GROUP_SIZE",
    "LANGUAGES",
    "MIN_USER_TEXTS",
    "REGISTERS",
    "SPLITS",
    "SPLIT_PERIOD",
    "Split",
    "TextCorpus",
    "TopicGroup",
    "check_max_per_split",
    "first_texts",
    "load_text_corpus",
    "normalize_sentence",
    "read_topic_groups",
    "split_of_group",
    "split_user_texts",
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
MIN_USER_TEXTS = 8  # --calib FILE.txt: distinct texts, split 4 train / 2 select / 2 report at the least
_MIN_HELD_OUT = 2  # texts in each of select and report: neighbour agreement compares two
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


def check_max_per_split(max_per_split: int | None) -> None:
    if max_per_split is not None and (isinstance(max_per_split, bool) or not isinstance(max_per_split, int) or max_per_split < 1):
        raise ConfigError(f"expected max_per_split to be a positive int or None, got {max_per_split!r}")


def first_texts(texts: list[str], limit: int | None) -> list[str]:
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
    check_max_per_split(max_per_split)
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
        first_texts(texts["calib"], max_per_split),
        first_texts(texts["val"], max_per_split),
        langs,
        f"text:{root.name}/{'+'.join(langs)}",
        first_texts(texts["test"], max_per_split),
        tuple(groups),
    )


def split_user_texts(texts: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """A user's texts as (train, select, report): 60/20/20, deterministic, whatever the file's order.

    Duplicates are dropped first (a text in two splits would leak), then texts are ordered by
    the sha256 of their normalized form and dealt out in that order (3 train, 1 select, 1
    report per 5), so the split does not depend on how the file is sorted and each split
    gets a share of every part of it. Select and report get at least 2 texts each (neighbour
    agreement needs two), taken from the end of train: ``MIN_USER_TEXTS`` texts split 4/2/2.
    """
    unique = list(dict.fromkeys(t.strip() for t in texts if t.strip()))
    if len(unique) < MIN_USER_TEXTS:
        raise DataError(f"expected at least {MIN_USER_TEXTS} distinct texts to split into train/select/report, got {len(unique)}; "
                        "add texts, one per line")  # fmt: skip
    ranked = sorted(unique, key=lambda t: hashlib.sha256(normalize_sentence(t).encode("utf-8")).hexdigest())
    roles: dict[str, list[str]] = {"train": [], "select": [], "report": []}
    for i, text in enumerate(ranked):
        roles[("train", "train", "train", "select", "report")[i % 5]].append(text)
    for role in ("select", "report"):
        while len(roles[role]) < _MIN_HELD_OUT:
            roles[role].append(roles["train"].pop())
    return roles["train"], roles["select"], roles["report"]
