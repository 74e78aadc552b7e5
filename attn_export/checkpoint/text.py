"""Text as encoder inputs: the checkpoint's tokenizer, token batches, and the real inputs of any layer.

Built on ``tokenizers`` alone (the checkpoint's ``tokenizer.json``), so the tokens are the
ones the user's model was trained on; ``all_layer_inputs`` records the hidden states a
layer really sees on text, which the per-layer compression of a checkpoint fits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attn_export.checkpoint.corpus import SPLITS, TextCorpus, check_max_per_split, first_texts, load_text_corpus
from attn_export.checkpoint.tokenizer_file import check_token_ids, load_tokenizer, pad_id
from attn_export.compress.calib.data import ActivationSet, CalibrationData
from attn_export.errors import ConfigError, DataError
from attn_export.layers.encoder import SentenceEncoder, encoder_input_names

__all__ = [
    "TokenBatch",
    "TokenSplits",
    "all_layer_inputs",
    "layer_inputs",
    "check_token_ids",
    "load_tokenizer",
    "pair_token_types",
    "text_calibration",
    "text_token_splits",
    "tokenize",
    "tokenizer_inputs",
]

log = logging.getLogger(__name__)


@dataclass
class TokenBatch:
    """Tokenized texts: ``input_ids`` and ``attention_mask`` int64 (N, S), 1 = real token; and ``token_type_ids``
    (N, S), 0/1, 0 at pads, for an encoder that takes token types (None: the two-input interface)."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    texts: list[str] = field(default_factory=list)
    token_type_ids: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def names(self) -> tuple[str, ...]:
        """The exported encoder's input names these tokens feed (``layers.encoder.encoder_input_names``)."""
        return encoder_input_names(self.token_type_ids is not None)

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(input_ids, attention_mask[, token_type_ids]), in ``names`` order."""
        return (self.input_ids, self.attention_mask) if self.token_type_ids is None else (self.input_ids, self.attention_mask, self.token_type_ids)

    def feed(self) -> dict[str, np.ndarray]:
        """The ONNX feed of the exported encoder (input name -> array)."""
        return dict(zip(self.names, self.arrays()))

    def to_torch(self) -> tuple[torch.Tensor, ...]:
        """The encoder's positional inputs: (input_ids, attention_mask[, token_type_ids])."""
        return tuple(torch.from_numpy(a) for a in self.arrays())

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
            arrays = [a[idx] for a in self.arrays()]
            if trim and not uniform:
                width = max(1, int(self.attention_mask[idx].sum(axis=1).max()))
                arrays = [a[:, :width] for a in arrays]
            out.append({name: np.ascontiguousarray(a) for name, a in zip(self.names, arrays)})
        return out

    def batches(self, batch_size: int) -> Iterator["TokenBatch"]:
        """Consecutive slices of ``batch_size`` texts (the last may be shorter)."""
        for start in range(0, len(self), batch_size):
            stop = start + batch_size
            types = None if self.token_type_ids is None else self.token_type_ids[start:stop]
            yield TokenBatch(self.input_ids[start:stop], self.attention_mask[start:stop], self.texts[start:stop], types)


@dataclass
class TokenSplits:
    """The whole encoder's inputs: calibration, validation and (when the corpus has one) test texts."""

    calib: TokenBatch
    val: TokenBatch
    source: str
    test: TokenBatch | None = None


def tokenizer_inputs(texts: Sequence[str], pairs: bool = False) -> list[Any]:
    """What ``encode_batch`` takes: the texts, or with ``pairs`` each ``text_a<TAB>text_b`` as the pair (a, b)."""
    return [tuple(t.split("\t", 1)) for t in texts] if pairs else list(texts)


def pair_token_types(tokenizer: Any) -> bool:
    """Whether the tokenizer gives a pair's second text token type 1 (BERT's ``[CLS] A [SEP] B [SEP]`` template; RoBERTa's
    ``<s> A </s></s> B </s>`` is all type 0): the encoder then needs ``token_type_ids`` to see which text a token is in."""
    return any(tokenizer.encode("a", "b").type_ids)


def tokenize(
    tokenizer: Any, texts: Sequence[str], max_len: int = 128, pad_to: int | None = None, pairs: bool = False, token_types: bool = False
) -> TokenBatch:
    """Tokenize with special tokens, truncate to ``max_len``; pad to the longest text or to ``pad_to``.

    The tokenizer is configured in place (truncation to ``max_len``, its own padding off:
    ``tokenizer.json`` files often pad to a fixed length, which would hide ``pad_to``). With
    ``pairs`` each text is ``text_a<TAB>text_b``, encoded as a pair (a cross-encoder's input).
    ``token_types``: the batch carries the tokenizer's ``type_ids`` as ``token_type_ids`` (0 at pads, and all 0 for
    single texts), for an encoder that takes them.
    """
    if not texts:
        raise DataError("expected at least one text to tokenize, got none")
    if max_len < 2 or (pad_to is not None and not 1 <= pad_to <= max_len):
        raise ConfigError(f"expected max_len >= 2 and 1 <= pad_to <= max_len, got max_len={max_len}, pad_to={pad_to}")
    tokenizer.enable_truncation(max_length=max_len)
    tokenizer.no_padding()
    encodings = tokenizer.encode_batch(tokenizer_inputs(texts, pairs))
    length = pad_to or max(len(e.ids) for e in encodings)
    ids = np.full((len(texts), length), pad_id(tokenizer), dtype=np.int64)
    mask = np.zeros((len(texts), length), dtype=np.int64)
    types = np.zeros((len(texts), length), dtype=np.int64) if token_types else None
    for i, enc in enumerate(encodings):
        n = min(len(enc.ids), length)
        ids[i, :n] = enc.ids[:n]
        mask[i, :n] = 1
        if types is not None:
            types[i, :n] = enc.type_ids[:n]
    return TokenBatch(ids, mask, list(texts), types)


def text_token_splits(
    tokenizer: Any, max_len: int = 128, corpus: TextCorpus | None = None, max_per_split: int | None = None
) -> TokenSplits:
    """The corpus (default: the shipped one) as encoder inputs, one ``TokenBatch`` per split.

    ``max_per_split`` keeps the first N texts of each split (the corpus order is balanced
    over languages and registers); ``test`` is None when the corpus has no test texts.
    """
    check_max_per_split(max_per_split)
    corpus = corpus or load_text_corpus(max_per_split=max_per_split)
    calib, val, test = (first_texts(corpus.split(s), max_per_split) for s in SPLITS)
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
    # a module shared across depth (ALBERT) runs at several depths: its k-th call in a pass is its k-th depth
    depths: dict[int, list[int]] = {}
    for depth, layer in enumerate(encoder.layers):
        depths.setdefault(id(layer), []).append(depth)
    calls = dict.fromkeys(depths, 0)

    def hook_for(key: int) -> Any:
        def hook(_module: torch.nn.Module, args: tuple[Any, ...]) -> None:
            depth = depths[key][calls[key]]
            calls[key] += 1
            if depth in captured:
                captured[depth].append(args[0].detach().float())  # (b, S, D)
            if depth == wanted[-1]:
                raise _StopForward

        return hook

    modules = {id(encoder.layers[i]): encoder.layers[i] for i in wanted}
    handles = [module.register_forward_pre_hook(hook_for(key)) for key, module in modules.items()]
    was_training = encoder.training
    try:
        encoder.eval()
        for part in tokens.batches(batch_size):
            calls.update(dict.fromkeys(calls, 0))  # a new pass starts at depth 0
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
