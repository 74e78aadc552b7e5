"""Compress a pretrained encoder layer by layer, each layer fitted on its own real inputs.

``low_rank_`` and ``distill_`` work on one reference layer and its input activations. In
a pretrained encoder those inputs are the hidden states the layer really sees on text, so
``low_rank_encoder_`` records every layer's inputs from the teacher in one pass over the
calibration texts, factorizes the layer with activation-aware SVD on them, then distills
it towards the teacher's same layer on the same inputs (only the attention block when
only attention projections were factorized). Only the low-rank factors train: the rest
of the layer is the pretrained one, and must stay so. Early stopping
watches a slice of the *calibration* texts (every ``holdout_every``-th), never the
validation texts, so the validation figures stay held out.

The int8 routes get the encoder's own inputs as calibration feeds (``input_ids`` and
``attention_mask``), from the calibration texts only.

Per-layer distillation fits each layer on the teacher's inputs, so the small errors of
earlier layers are never seen by later ones, and ~250 texts per layer leave thin spots.
``distill_encoder_e2e_`` then trains every low-rank factor at once through the whole
student, with a loss that keeps *every* layer's hidden states close to the teacher's
(normalised MSE on real tokens, averaged over layers) plus the sentence-embedding cosine,
on batches streamed from all the calibration texts (no activations stored), and stops on
the select texts' embedding cosine (the best step's weights are kept).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from attn_export.checkpoint.text import TokenBatch, all_layer_inputs
from attn_export.compress.calib_data import ActivationSet
from attn_export.compress.distill import DistillConfig, DistillSummary, distill_, train_loop
from attn_export.compress.lowrank import LowRankConfig, LowRankLinear, low_rank_
from attn_export.errors import ConfigError
from attn_export.layers.encoder import SentenceEncoder
from attn_export.layers.transformer import TransformerLayer

__all__ = [
    "E2EDistillSummary",
    "EncoderLowRankSummary",
    "distill_encoder_",
    "distill_encoder_e2e_",
    "low_rank_encoder_",
    "distill_layer_",
    "train_low_rank_only",
]

log = logging.getLogger(__name__)


@dataclass
class EncoderLowRankSummary:
    """Per layer: what ``low_rank_`` replaced and what distillation recovered."""

    params_before: int
    params_after: int
    replaced_params_before: int = 0
    replaced_params_after: int = 0
    layers: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def replaced_ratio(self) -> float:
        """Parameters of the factorized Linears after / before (0.5 = half of Q/K kept)."""
        return self.replaced_params_after / self.replaced_params_before if self.replaced_params_before else 1.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["replaced_ratio"] = self.replaced_ratio
        return d

    def describe(self) -> str:
        distilled = [v["distill"] for v in self.layers.values() if v.get("distill")]
        rel = ", ".join(f"{d['val_rel_l2_before']:.3g}->{d['val_rel_l2_after']:.3g}" for d in distilled)
        return (
            f"low-rank encoder: {len(self.layers)} layers, factorized Linears at {100 * self.replaced_ratio:.0f}% "
            f"of their parameters, encoder {self.params_before} -> {self.params_after} parameters" + (f"; distillation rel L2 per layer {rel}" if rel else "")
        )


def train_low_rank_only(module: nn.Module) -> dict[str, bool]:
    """Freeze everything but ``LowRankLinear`` factors; returns the previous flags to restore."""
    before = {name: p.requires_grad for name, p in module.named_parameters()}
    low_rank = {id(p) for m in module.modules() if isinstance(m, LowRankLinear) for p in m.parameters()}
    for p in module.parameters():
        p.requires_grad_(id(p) in low_rank)
    return before


def _split(acts: ActivationSet, holdout: np.ndarray) -> tuple[ActivationSet, ActivationSet]:
    kpm = acts.key_padding_mask
    return (
        ActivationSet(acts.x[~holdout], None if kpm is None else kpm[~holdout]),
        ActivationSet(acts.x[holdout], None if kpm is None else kpm[holdout]),
    )


def _by_module(encoder: SentenceEncoder, indices: Sequence[int]) -> dict[int, list[int]]:
    """First index -> every index in ``indices`` that runs the same module (a layer shared across depth: ALBERT)."""
    groups: dict[int, list[int]] = {}
    first: dict[int, int] = {}
    for i in indices:
        groups.setdefault(first.setdefault(id(encoder.layers[i]), i), []).append(i)
    return groups


def _joined(acts: dict[int, ActivationSet], indices: list[int]) -> ActivationSet:
    """The inputs of every depth a shared layer runs at, as one set (a layer with its own weights: its own inputs)."""
    if len(indices) == 1:
        return acts[indices[0]]
    masks = [acts[i].key_padding_mask for i in indices]
    kpm = None if any(m is None for m in masks) else np.concatenate(masks)  # type: ignore[arg-type]
    return ActivationSet(np.concatenate([acts[i].x for i in indices]), kpm)


def _distill_pair(student: TransformerLayer, teacher: TransformerLayer, lowrank: LowRankConfig) -> tuple[nn.Module, nn.Module]:
    """What to distill: the attention block when only its projections changed, else the whole layer.

    In a post-norm layer the attention block reads the layer's input, so both see the same
    real activations; the block alone costs about a third of the layer per step and, with
    only Q/K/V/O factorized, recovers as much (MiniLM: same held-out cosine, 5x faster).
    """
    if set(lowrank.targets) <= {"q", "k", "v", "o"}:
        return student.self_attn, teacher.self_attn
    return student, teacher


def low_rank_encoder_(
    student: SentenceEncoder,
    teacher: SentenceEncoder,
    calib: TokenBatch,
    lowrank: LowRankConfig | None = None,
    distill: DistillConfig | None = None,
    layers: Sequence[int] | None = None,
    holdout_every: int = 5,
) -> EncoderLowRankSummary:
    """Factorize (and, with ``distill``, distill) ``student.layers[i]`` for i in ``layers``, in place.

    ``teacher`` is the untouched encoder: its layer inputs on ``calib`` fit the factors and
    train the student layers. Default: Q and K of every layer at half their parameters.
    """
    if student is teacher:
        raise ConfigError("expected a student copy of the encoder; pass copy.deepcopy(encoder) as the student")
    lowrank = lowrank or LowRankConfig(rank_ratio=0.5, targets=("q", "k"))
    indices = list(range(len(teacher.layers))) if layers is None else sorted(set(layers))
    if distill is not None and len(calib) < 2 * holdout_every:
        raise ConfigError(f"expected >= {2 * holdout_every} calibration texts to hold some out for early stopping, got {len(calib)}")
    acts = all_layer_inputs(teacher, calib, layers=indices)
    summary = EncoderLowRankSummary(params_before=sum(p.numel() for p in student.parameters()), params_after=0)
    for i, same in _by_module(student, indices).items():  # a layer shared across depth is factorised once, on every depth's inputs
        joined = _joined(acts, same)
        holdout = np.arange(len(joined)) % holdout_every == holdout_every - 1
        low = low_rank_(student.layers[i], lowrank, joined)
        entry: dict[str, Any] = {"low_rank": low.to_dict(), "distill": None}
        summary.replaced_params_before += low.replaced_params_before
        summary.replaced_params_after += low.replaced_params_after
        if distill is not None and low.ranks:
            train, dev = _split(joined, holdout)
            entry["distill"] = distill_layer_(student.layers[i], teacher.layers[i], train, dev, lowrank.targets, distill).to_dict()  # type: ignore[arg-type]
        summary.layers[i] = entry
        log.info("layer %d: %s", i, low.describe())
    student.eval()
    summary.params_after = sum(p.numel() for p in student.parameters())
    log.info("%s", summary.describe())
    return summary


def distill_encoder_(
    student: SentenceEncoder,
    teacher: SentenceEncoder,
    train: TokenBatch,
    select: TokenBatch,
    targets: Sequence[str],
    distill: DistillConfig,
    layers: Sequence[int] | None = None,
) -> dict[int, dict[str, Any]]:
    """Distil each factorized ``student.layers[i]`` towards ``teacher.layers[i]`` on the teacher's real inputs.

    Trains on the layer inputs of the ``train`` texts and early-stops on those of the
    ``select`` texts (never the texts a report measures). Only ``LowRankLinear`` factors train.
    Returns the per-layer summaries.
    """
    if student is teacher:
        raise ConfigError("expected a student copy of the encoder; pass copy.deepcopy(encoder) as the student")
    indices = [i for i in (range(len(teacher.layers)) if layers is None else sorted(set(layers)))
               if any(isinstance(m, LowRankLinear) for m in student.layers[i].modules())]  # fmt: skip
    if not indices:
        return {}
    train_acts = all_layer_inputs(teacher, train, layers=indices)
    select_acts = all_layer_inputs(teacher, select, layers=indices)
    out: dict[int, dict[str, Any]] = {}
    for i, same in _by_module(student, indices).items():  # a shared layer trains once, on every depth's inputs
        pair = (student.layers[i], teacher.layers[i], _joined(train_acts, same), _joined(select_acts, same))
        summary = distill_layer_(*pair, targets, distill).to_dict()  # type: ignore[arg-type]
        out[i] = {k: v for k, v in summary.items() if k != "history"}
        log.info("layer %d distilled: val rel L2 %.4g -> %.4g", i, summary["val_rel_l2_before"], summary["val_rel_l2_after"])
    student.eval()
    return out


@dataclass
class E2EDistillSummary:
    """Select-split embedding error (1 - mean cosine vs the teacher) before and after the end-to-end stage."""

    select_error_before: float
    select_error_after: float
    steps_run: int
    best_step: int
    stopped_early: bool
    train_texts: int
    history: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (f"end-to-end distillation on {self.train_texts} texts: select embedding error {self.select_error_before:.3e} -> "
                f"{self.select_error_after:.3e} (best at step {self.best_step} of {self.steps_run}{', stopped early' if self.stopped_early else ''})")  # fmt: skip


def _forward_with_layers(encoder: SentenceEncoder, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(sentence embedding, every layer's output (B, S, D)) of one forward."""
    outs: list[torch.Tensor] = []
    handles = [layer.register_forward_hook(lambda _m, _a, out: outs.append(out[0] if isinstance(out, tuple) else out)) for layer in encoder.layers]
    try:
        emb = encoder(ids, mask)[1]
    finally:
        for h in handles:
            h.remove()
    return emb, outs


def _mean_cosine_error(ref: torch.Tensor, got: torch.Tensor) -> float:
    return float(1.0 - torch.nn.functional.cosine_similarity(ref.double(), got.double(), dim=-1).mean())


def distill_encoder_e2e_(
    student: SentenceEncoder, teacher: SentenceEncoder, train: TokenBatch, select: TokenBatch, steps: int, lr: float = 3e-4,
    batch_size: int = 16, eval_every: int = 25, patience: int = 3, embedding_weight: float = 1.0, seed: int = 0,
) -> E2EDistillSummary:  # fmt: skip
    """Train the student's low-rank factors through the whole encoder towards the teacher (see the module doc).

    The ``end-to-end`` scope of the one distillation loop (``compress.distill.train_loop``).
    """
    import torch.nn.functional as F

    if student is teacher:
        raise ConfigError("expected a student copy of the encoder; pass copy.deepcopy(encoder) as the student")
    flags = train_low_rank_only(student)
    params = [p for p in student.parameters() if p.requires_grad]
    try:
        if not params:
            raise ConfigError("the student has no low-rank factors to train; factorize it first (low_rank_encoder_)")
        student.eval()
        teacher.eval()
        with torch.no_grad():
            ref = torch.cat([teacher(*b.to_torch())[1] for b in select.batches(64)])

        def evaluate() -> tuple[float, dict[str, float]]:
            with torch.no_grad():
                err = _mean_cosine_error(ref, torch.cat([student(*b.to_torch())[1] for b in select.batches(64)]))
            return err, {"select_error": err}

        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))

        def step_loss(step: int) -> torch.Tensor:
            pos = ((step - 1) * batch_size) % len(train)
            idx = order[pos : pos + batch_size].numpy()
            ids, mask = train.input_ids[idx], train.attention_mask[idx]
            width = max(1, int(mask.sum(axis=1).max()))  # trim to the batch's longest text
            ids_t, mask_t = torch.from_numpy(ids[:, :width]), torch.from_numpy(mask[:, :width])
            keep = mask_t.bool()
            with torch.no_grad():
                t_emb, t_outs = _forward_with_layers(teacher, ids_t, mask_t)
            s_emb, s_outs = _forward_with_layers(student, ids_t, mask_t)
            hidden = torch.stack([F.mse_loss(s[keep], t[keep]) / t[keep].pow(2).mean().clamp_min(1e-12) for s, t in zip(s_outs, t_outs)]).mean()
            return hidden + embedding_weight * (1.0 - F.cosine_similarity(s_emb, t_emb, dim=-1)).mean()

        config = DistillConfig(steps=steps, lr=lr, batch_size=batch_size, eval_every=eval_every, patience=patience, seed=seed, progress=False,
                               scope="end-to-end")  # fmt: skip
        run = train_loop(student, params, step_loss, evaluate, config)
    finally:
        for name, p in student.named_parameters():
            p.requires_grad_(flags.get(name, True))
    student.eval()
    history = [{k: v for k, v in h.items() if v is not None} for h in run.history]
    summary = E2EDistillSummary(float(run.history[0]["select_error"]), run.best["select_error"], run.steps_run, run.best_step, run.stopped_early,  # type: ignore[arg-type]
                                len(train), history)  # fmt: skip
    log.info("%s", summary.describe())
    return summary


def distill_layer_(student: TransformerLayer, teacher: TransformerLayer, train: ActivationSet, select: ActivationSet, targets: Sequence[str],
                   config: DistillConfig) -> DistillSummary:  # fmt: skip
    """Distil one factorized layer of a checkpoint (layer N) towards the teacher's on its real inputs.

    The attention block alone when only its projections were factorized (``_distill_pair``);
    only ``LowRankLinear`` factors train, the rest stays the pretrained layer.
    """
    s_mod, t_mod = _distill_pair(student, teacher, LowRankConfig(rank_ratio=0.5, targets=tuple(targets)))
    flags = train_low_rank_only(s_mod)
    try:
        summary = distill_(s_mod, t_mod, train, select, config)
    finally:
        for name, p in s_mod.named_parameters():
            p.requires_grad_(flags.get(name, True))
    student.eval()
    summary.module = "self_attn" if s_mod is not student else "layer"
    return summary
