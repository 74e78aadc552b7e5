"""Real text for a real checkpoint: the shipped corpus, tokenization and layer activations.

Random inputs hide what compression does to a pretrained encoder: its activations have
the outliers and the structure of language, and int8 ranges and activation-aware low-rank
factors must be fitted to those. The project ships a small multilingual corpus
(``attn_export/data/text/corpus_<lang>.txt``, sentences written for attn-export) split
deterministically into disjoint calibration and validation texts, a tokenizer front end
built on ``tokenizers`` alone, and a hook that records the real inputs of any layer.

Split rule (documented in ``attn_export/data/text/README.md``): each file is a list of
topic groups separated by blank lines; group ``g`` (0-based, per file) is validation when
``g % 4 == 3``, calibration otherwise. Whole topics go one way, so validation texts share
no topic with calibration texts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attn_export.compress.calib_data import ActivationSet, CalibrationData
from attn_export.data import shipped_path
from attn_export.errors import ConfigError, DataError
from attn_export.layers.encoder import SentenceEncoder

__all__ = [
    "CORPUS_DIR",
    "LANGUAGES",
    "TextCorpus",
    "TokenBatch",
    "TokenSplits",
    "VAL_EVERY",
    "all_layer_inputs",
    "layer_inputs",
    "load_text_corpus",
    "load_tokenizer",
    "read_corpus_groups",
    "text_calibration",
    "text_token_splits",
    "tokenize",
]

log = logging.getLogger(__name__)

CORPUS_DIR = shipped_path("text")  # package data, found through importlib.resources
LANGUAGES: tuple[str, ...] = ("en", "zh", "de", "es")
VAL_EVERY = 4  # group g is validation when g % VAL_EVERY == VAL_EVERY - 1


@dataclass
class TextCorpus:
    """Disjoint calibration and validation texts, and where they came from."""

    calib: list[str]
    val: list[str]
    languages: tuple[str, ...]
    source: str


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

    def feeds(self, batch_size: int, uniform: bool = False, limit: int | None = None) -> list[dict[str, np.ndarray]]:
        """Feed dicts of ``batch_size`` texts (at most ``limit`` texts in all).

        ``uniform=True`` fills the last batch by wrapping around to the first texts, so every
        feed has the same shape: ONNX Runtime's histogram calibrators stack them.
        """
        n = len(self) if limit is None else max(1, min(limit, len(self)))
        order = np.arange(n)
        if uniform and n % batch_size:
            order = np.concatenate([order, np.arange(batch_size - n % batch_size) % n])
        return [
            {"input_ids": self.input_ids[idx], "attention_mask": self.attention_mask[idx]}
            for idx in np.array_split(order, range(batch_size, len(order), batch_size))
        ]

    def batches(self, batch_size: int) -> Iterator["TokenBatch"]:
        """Consecutive slices of ``batch_size`` texts (the last may be shorter)."""
        for start in range(0, len(self), batch_size):
            stop = start + batch_size
            yield TokenBatch(self.input_ids[start:stop], self.attention_mask[start:stop], self.texts[start:stop])


@dataclass
class TokenSplits:
    """The whole encoder's calibration and validation inputs."""

    calib: TokenBatch
    val: TokenBatch
    source: str


def read_corpus_groups(path: str | os.PathLike[str]) -> list[list[str]]:
    """Topic groups of a corpus file: blank lines separate groups, ``#`` lines are comments."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"text corpus {path} does not exist; expected one of {CORPUS_DIR}/corpus_<lang>.txt")
    groups: list[list[str]] = [[]]
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("#"):
            continue
        if not line:
            if groups[-1]:
                groups.append([])
            continue
        groups[-1].append(line)
    groups = [g for g in groups if g]
    if not groups:
        raise DataError(f"text corpus {path} holds no sentences; write one sentence per line")
    return groups


def load_text_corpus(languages: Sequence[str] | None = None, directory: str | os.PathLike[str] | None = None) -> TextCorpus:
    """Read ``corpus_<lang>.txt`` for each language and split it by topic group (see module doc)."""
    langs = tuple(languages) if languages else LANGUAGES
    unknown = [lang for lang in langs if lang not in LANGUAGES] if directory is None else []
    if unknown:
        raise ConfigError(f"expected languages from {', '.join(LANGUAGES)}, got {', '.join(unknown)}")
    root = Path(directory) if directory is not None else CORPUS_DIR
    calib: list[str] = []
    val: list[str] = []
    for lang in langs:
        for g, group in enumerate(read_corpus_groups(root / f"corpus_{lang}.txt")):
            (val if g % VAL_EVERY == VAL_EVERY - 1 else calib).extend(group)
    overlap = set(calib) & set(val)
    if overlap:
        raise DataError(f"text corpus: {len(overlap)} sentences appear in both splits (e.g. {next(iter(overlap))!r}); make them unique")
    if not calib or not val:
        raise DataError(f"text corpus {root}: got {len(calib)} calibration and {len(val)} validation texts; need >= {VAL_EVERY} topic groups")
    return TextCorpus(calib, val, langs, f"text:{root.name}/{'+'.join(langs)}")


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
    pad = tokenizer.token_to_id("[PAD]")
    return 0 if pad is None else int(pad)


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


def text_token_splits(tokenizer: Any, max_len: int = 128, corpus: TextCorpus | None = None) -> TokenSplits:
    """The shipped corpus as encoder inputs: calibration and validation ``TokenBatch``es."""
    corpus = corpus or load_text_corpus()
    return TokenSplits(tokenize(tokenizer, corpus.calib, max_len), tokenize(tokenizer, corpus.val, max_len), corpus.source)


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
) -> CalibrationData:
    """Real calibration/validation inputs of layer ``layer_index``, from the shipped corpus."""
    if max_len > encoder.config.max_position_embeddings:
        raise ConfigError(f"expected max_len <= {encoder.config.max_position_embeddings} (the checkpoint's positions), got {max_len}")
    splits = text_token_splits(tokenizer, max_len, corpus)
    data = CalibrationData(
        layer_inputs(encoder, splits.calib, layer_index),
        layer_inputs(encoder, splits.val, layer_index),
        f"{splits.source}@layer{layer_index}",
    )
    log.info("text calibration: %s", data.describe())
    return data
