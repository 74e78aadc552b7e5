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

from attn_export.checkpoint.text import TokenBatch, all_layer_inputs
from attn_export.compress.calib.data import ActivationSet
from attn_export.compress.distill import DistillConfig, distill_slot_, train_loop, train_low_rank_only
from attn_export.compress.lowrank import LayerwiseLowRankSummary, LowRankConfig, low_rank_
from attn_export.compress.subject_hooks import ModuleSlot
from attn_export.errors import ConfigError
from attn_export.layers.encoder import SentenceEncoder

__all__ = ["E2EDistillSummary", "distill_encoder_e2e_", "joined_inputs", "low_rank_encoder_", "shared_layer_groups"]

log = logging.getLogger(__name__)


def _split(acts: ActivationSet, holdout: np.ndarray) -> tuple[ActivationSet, ActivationSet]:
    kpm = acts.key_padding_mask
    return (
        ActivationSet(acts.x[~holdout], None if kpm is None else kpm[~holdout]),
        ActivationSet(acts.x[holdout], None if kpm is None else kpm[holdout]),
    )


def shared_layer_groups(encoder: SentenceEncoder, indices: Sequence[int]) -> dict[int, list[int]]:
    """First index -> every index in ``indices`` that runs the same module (a layer shared across depth: ALBERT)."""
    groups: dict[int, list[int]] = {}
    first: dict[int, int] = {}
    for i in indices:
        groups.setdefault(first.setdefault(id(encoder.layers[i]), i), []).append(i)
    return groups


def joined_inputs(acts: dict[int, ActivationSet], indices: list[int]) -> ActivationSet:
    """The inputs of every depth a shared layer runs at, as one set (a layer with its own weights: its own inputs)."""
    if len(indices) == 1:
        return acts[indices[0]]
    masks = [acts[i].key_padding_mask for i in indices]
    kpm = None if any(m is None for m in masks) else np.concatenate(masks)  # type: ignore[arg-type]
    return ActivationSet(np.concatenate([acts[i].x for i in indices]), kpm)


def low_rank_encoder_(
    student: SentenceEncoder,
    teacher: SentenceEncoder,
    calib: TokenBatch,
    lowrank: LowRankConfig | None = None,
    distill: DistillConfig | None = None,
    layers: Sequence[int] | None = None,
    holdout_every: int = 5,
) -> LayerwiseLowRankSummary:
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
    summary = LayerwiseLowRankSummary(params_before=sum(p.numel() for p in student.parameters()), params_after=0)
    for i, same in shared_layer_groups(student, indices).items():  # a layer shared across depth is factorised once, on every depth's inputs
        joined = joined_inputs(acts, same)
        holdout = np.arange(len(joined)) % holdout_every == holdout_every - 1
        low = low_rank_(student.layers[i], lowrank, joined)
        distilled = None
        if distill is not None and low.ranks:
            train, dev = _split(joined, holdout)
            slot = ModuleSlot(student.layers[i], teacher.layers[i], {"train": train, "select": dev}.__getitem__, layer=i, frozen=True)
            distilled = distill_slot_(slot, distill).to_dict()
        summary.add(i, low, distilled)
        log.info("layer %d: %s", i, low.describe())
    student.eval()
    summary.params_after = sum(p.numel() for p in student.parameters())
    log.info("%s", summary.describe())
    return summary


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


def _forward_with_layers(encoder: SentenceEncoder, *inputs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(sentence embedding, every layer's output (B, S, D)) of one forward on (input_ids, attention_mask[, token_type_ids])."""
    outs: list[torch.Tensor] = []
    handles = [layer.register_forward_hook(lambda _m, _a, out: outs.append(out[0] if isinstance(out, tuple) else out)) for layer in encoder.layers]
    try:
        emb = encoder(*inputs)[1]
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
            width = max(1, int(train.attention_mask[idx].sum(axis=1).max()))  # trim to the batch's longest text
            inputs = [torch.from_numpy(np.ascontiguousarray(a[idx][:, :width])) for a in train.arrays()]  # ids, mask[, types]
            keep = inputs[1].bool()
            with torch.no_grad():
                t_emb, t_outs = _forward_with_layers(teacher, *inputs)
            s_emb, s_outs = _forward_with_layers(student, *inputs)
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

