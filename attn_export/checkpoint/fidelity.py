"""Fidelity check at load: the project's re-implementation against the checkpoint's own library.

The project's layers are the export path (fused attention, fp32 islands, every form), so a
checkpoint is loaded into them; but every later accuracy figure compares against that eager
model, so a re-implementation that differs from the original would let a wrong model PASS.
``check_fidelity`` runs both on probe inputs before any work and refuses, with one line,
when they differ beyond float32 noise:

- random token ids: a (4, 16) batch with rows of 16, 11, 5 and 1 real tokens, and a (3, up
  to 64) batch with full, half and 2-token rows; padded tails hold the pad id;
- for a model with a type-1 embedding whose library takes ``token_type_ids`` (BERT, ELECTRA,
  ALBERT...), the (4, 16) ids again with each row's second half typed 1, as a ``[CLS] A [SEP] B
  [SEP]`` pair is: the token-type rows a cross-encoder reads are the checkpoint's;
- real texts (``PROBE_TEXTS``: English, German, French, Spanish, Chinese, a one-word text and
  a long one) tokenized with the checkpoint's own ``tokenizer.json``, when it has one.

Compared on real tokens only (padded positions mean nothing): ``last_hidden_state`` per
token, ``sentence_embedding`` per text, ``logits`` per text (per token for token
classification) with label agreement. The bar is the family's (``Family.fidelity``, in its
file in ``checkpoint/families/``); every family today holds the fp32 export's own bar, min
cosine 0.9999 per row and max abs 1e-4: two float32 implementations of the same maths differ
by ~1e-6; a wrong position offset, activation or pooling by 1e-1.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attn_export.checkpoint.families import family_of
from attn_export.checkpoint.metrics import classification_agreement, row_cosines
from attn_export.errors import CheckpointError
from attn_export.layers.encoder import SentenceEncoder

__all__ = ["PROBE_TEXTS", "FidelityResult", "OutputFidelity", "check_fidelity", "probe_batches"]

log = logging.getLogger(__name__)

PROBE_TEXTS: tuple[str, ...] = (
    "The exported model must compute what the original model computes.",
    "Ok.",
    "Die Prüfung läuft, bevor irgendeine Arbeit beginnt.",
    "Le modèle de l'utilisateur est la référence.",
    "¿Coinciden las posiciones con las del modelo original?",
    "每个句子都用检查点自己的分词器切分。",
    "A longer sentence gives the position table more rows to disagree on, so it is here on purpose: "
    "padding, offsets and pooling all show their mistakes when one row of a batch is much longer than the others.",
)
_ORDER = ("last_hidden_state", "sentence_embedding", "logits")


@dataclass(frozen=True)
class OutputFidelity:
    """How far one output of the project's model is from the library's, over every probe."""

    max_abs: float
    min_cosine: float
    rows: int  # tokens (hidden states, token logits) or texts compared
    worst_probe: str
    label_agreement: float | None = None


@dataclass(frozen=True)
class FidelityResult:
    """The report's record of the check: what was compared with what, on which probes, how closely."""

    family: str
    reference: str
    probes: dict[str, int]
    outputs: dict[str, OutputFidelity]
    passed: bool
    tolerance: dict[str, float]  # the family's bar: min_cosine, max_abs
    notes: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        parts = [f"{name} min cosine {o.min_cosine:.7f}, max abs {o.max_abs:.2e}" for name, o in self.outputs.items()]
        verdict = "PASS" if self.passed else "FAIL"
        return f"fidelity {verdict} ({self.family} vs {self.reference}, {sum(self.probes.values())} probe rows): " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["notes"] = list(self.notes)
        return out


def probe_batches(model: SentenceEncoder, tokenizer: Any = None, texts: tuple[str, ...] = PROBE_TEXTS, seed: int = 0) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, input_ids (B, S), attention_mask (B, S)) probes: random rows of several lengths, then real texts."""
    conf = model.config
    g = np.random.default_rng(seed)
    ids_pool = np.array([i for i in range(min(conf.vocab_size, 5000)) if i != conf.pad_token_id], dtype=np.int64)
    batches = []
    for name, seq, lengths in (("random 4x16", 16, (16, 11, 5, 1)), ("random 3x64", 64, (64, 32, 2))):
        seq = min(seq, conf.max_tokens)
        lens = np.minimum(np.array(lengths), seq)
        mask = (np.arange(seq)[None, :] < lens[:, None]).astype(np.int64)  # (B, S)
        ids = np.where(mask == 1, g.choice(ids_pool, size=mask.shape), conf.pad_token_id).astype(np.int64)
        batches.append((name, ids, mask))
    if tokenizer is not None and texts:
        from attn_export.checkpoint.text import tokenize

        tokens = tokenize(tokenizer, list(texts), max_len=min(128, conf.max_tokens))
        mask = tokens.attention_mask.astype(np.int64)
        ids = np.where(mask == 1, tokens.input_ids, conf.pad_token_id).astype(np.int64)
        batches.append((f"{len(texts)} real texts", ids, mask))
    return batches


def _rows(ours: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows compared: real tokens of per-token outputs (B, S, X) -> (N, X); per-text outputs as they are."""
    if ours.ndim == 3:
        keep = mask.astype(bool)
        return ours[keep], ref[keep]
    return ours, ref


def _measure(ours: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(min row cosine, max abs) of one probe's rows; a non-finite output is (nan, inf), which fails."""
    if not np.all(np.isfinite(ours)):
        return float("nan"), float("inf")
    return float(row_cosines(ref, ours).min()), float(np.abs(ours.astype(np.float64) - ref).max())


def typed_probe(model: SentenceEncoder, seed: int = 0) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(name, input_ids, attention_mask, token_type_ids): ``probe_batches``' first random batch with each row's second half
    of real tokens typed 1 (pads 0), the layout of a ``[CLS] A [SEP] B [SEP]`` pair."""
    _, ids, mask = probe_batches(model, seed=seed)[0]
    half = (mask.sum(axis=1, keepdims=True) + 1) // 2  # (B, 1): a 1-token row stays type 0
    types = ((np.arange(ids.shape[1])[None, :] >= half) & (mask == 1)).astype(np.int64)  # (B, S)
    return f"random {ids.shape[0]}x{ids.shape[1]} typed 0/1", ids, mask, types


def _compare(model: SentenceEncoder, reference: Any, batches: list[tuple[Any, ...]]) -> dict[str, OutputFidelity]:
    """Per output: the worst min cosine and max abs over the probes (``(name, ids, mask[, token_type_ids])``), and the
    probe that was worst."""
    per_probe: dict[str, list[tuple[str, float, float, int, float | None]]] = {}
    for probe, ids, mask, *typed in batches:
        types = typed[0] if typed else None
        with torch.no_grad():
            got = [t.float().numpy() for t in model(torch.from_numpy(ids), torch.from_numpy(mask), None if types is None else torch.from_numpy(types))]
        ref = reference(ids, mask, types)
        for name, ours in zip(model.output_names, got):
            theirs = getattr(ref, name)
            if theirs is None or theirs.shape != ours.shape:
                shape = None if theirs is None else theirs.shape
                raise CheckpointError(
                    f"{name}: the project's model gives shape {ours.shape}, {reference.description} gives {shape}; the loaded head or pooling is not the checkpoint's"
                )
            a, b = _rows(ours, theirs, mask)
            cos, err = _measure(a, b)
            labels = classification_agreement(theirs, ours, mask if ours.ndim == 3 else None)["label_agreement"] if name == "logits" else None
            per_probe.setdefault(name, []).append((probe, cos, err, len(a), labels))
    out = {}
    for name in sorted(per_probe, key=_ORDER.index):
        rows = per_probe[name]
        # the worst probe: lowest cosine (NaN lowest of all), then largest error
        worst = min(rows, key=lambda r: (-math.inf if math.isnan(r[1]) else r[1], -r[2]))
        total = sum(r[3] for r in rows)
        agree = None if name != "logits" else sum(r[4] * r[3] for r in rows) / total  # type: ignore[operator]
        out[name] = OutputFidelity(max_abs=max(r[2] for r in rows), min_cosine=worst[1], rows=total, worst_probe=worst[0], label_agreement=agree)
    return out


def check_fidelity(
    model: SentenceEncoder,
    checkpoint_dir: str | os.PathLike[str],
    reference: Any = None,
    tokenizer: Any = None,
    texts: tuple[str, ...] = PROBE_TEXTS,
    raise_on_failure: bool = True,
) -> FidelityResult:
    """Compare ``model`` (loaded from ``checkpoint_dir``) with the checkpoint's own library on probes.

    ``reference`` defaults to ``load_reference`` (transformers / sentence-transformers, local
    files); ``tokenizer`` to the folder's ``tokenizer.json`` (real-text probes are skipped,
    with a note, when it has none). Raises a one-line CheckpointError when an output differs
    beyond the tolerance, unless ``raise_on_failure`` is False.
    """
    path = Path(checkpoint_dir)
    conf = model.config
    if reference is None:
        from attn_export.checkpoint.reference import load_reference

        reference = load_reference(path, conf.pooling, None if conf.head is None else conf.head.task)
    notes: list[str] = []
    if tokenizer is None and os.path.lexists(path / "tokenizer.json"):  # a FIFO or a device is named by load_tokenizer, not skipped
        from attn_export.checkpoint.text import load_tokenizer

        tokenizer = load_tokenizer(path, conf.vocab_size)
    if tokenizer is None:
        notes.append("no tokenizer.json: random-id probes only")
    batches: list[tuple[Any, ...]] = list(probe_batches(model, tokenizer, texts))
    if conf.type_vocab_size >= 2 and getattr(reference, "takes_token_types", False):
        batches.append(typed_probe(model))
    was_training = model.training
    model.eval()
    try:
        outputs = _compare(model, reference, batches)
    finally:
        model.train(was_training)
    probes = {name: int(ids.shape[0]) for name, ids, *_ in batches}
    bar = family_of(conf.family).fidelity
    failed = [(n, o) for n, o in outputs.items() if not (o.min_cosine >= bar.min_cosine and o.max_abs <= bar.max_abs)]
    result = FidelityResult(
        family=conf.family, reference=reference.description, probes=probes, outputs=outputs, passed=not failed, tolerance=bar.to_dict(), notes=tuple(notes)
    )
    for name, o in outputs.items():
        log.info("fidelity %s vs %s: %s min cosine %.7f, max abs %.2e over %d rows", conf.family, reference.description, name, o.min_cosine, o.max_abs, o.rows)
    if failed and raise_on_failure:
        name, o = failed[0]
        raise CheckpointError(
            f"{path}: the project's {conf.family} model does not reproduce {reference.description}: {name} min cosine {o.min_cosine:.6f} "
            f"(>= {bar.min_cosine} required), max abs {o.max_abs:.3g} (<= {bar.max_abs:g}) on probe '{o.worst_probe}'; "
            "attn-export refuses to certify a model it does not reproduce, report this checkpoint's config.json as an issue"
        )
    return result
