"""Distillation: a compressed student learns from the original teacher on the calibration split.

Compression is a one-shot approximation; a few hundred optimizer steps on the layer's own
inputs recover much of what it lost. The loss is the output MSE plus, MiniLM-style, the
KL divergence between the teacher's and the student's attention distributions, which
keeps the student attending where the teacher does. Early stopping watches the
validation split, and the best validation weights are restored, so distillation never
leaves the student worse than it found it.
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from tqdm.auto import tqdm

from attn_export.compress.calib.data import ActivationSet
from attn_export.compress.layer_forward import device_of, eval_mode, forward_layer
from attn_export.compress.lowrank import LowRankLinear
from attn_export.errors import ConfigError
from attn_export.layers.projections import AttentionProjections
from attn_export.layers.registry import MaskedLayer
from attn_export.layers.transformer import TransformerLayer

if TYPE_CHECKING:
    from attn_export.compress.subject_hooks import ModuleSlot

__all__ = ["DISTILL_SCOPES", "DistillConfig", "DistillSummary", "LoopResult", "OutputError", "attention_kl", "capture_attention", "distill_",
           "distill_slot_", "output_error", "train_loop", "train_low_rank_only"]

log = logging.getLogger(__name__)

_Batch = tuple[torch.Tensor, torch.Tensor | None]  # x (B, L, D), key_padding_mask (B, L) or None
DISTILL_SCOPES: tuple[str, ...] = ("layer", "end-to-end")


@dataclass(frozen=True)
class DistillConfig:
    """Optimizer steps, learning rate, batch size (sequences), loss weights and early stopping.

    ``patience`` counts validation checks (every ``eval_every`` steps) without improvement.
    ``augment`` trains on calibration tokens recombined into new sequences (see ``_batches``).
    ``scope``: what one loop trains: ``layer`` (one module on its own input activations: a
    reference layer, layer N of a checkpoint, or each layer of an encoder in turn) or
    ``end-to-end`` (a whole model, the subject's ``end_to_end`` hook: ``checkpoint.compress.distill_encoder_e2e_``).
    Both run ``train_loop``.
    """

    steps: int = 200
    lr: float = 3e-4
    batch_size: int = 16
    attn_kl_weight: float = 1.0
    eval_every: int = 20
    patience: int = 5
    grad_checkpointing: bool = False
    seed: int = 0
    progress: bool = True
    augment: bool = True
    scope: str = "layer"

    def __post_init__(self) -> None:
        if self.scope not in DISTILL_SCOPES:
            raise ConfigError(f"expected a distillation scope in {', '.join(DISTILL_SCOPES)}, got {self.scope!r}")
        for name in ("steps", "batch_size", "eval_every", "patience"):
            if getattr(self, name) < 1:
                raise ConfigError(f"expected {name} >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"expected lr > 0, got {self.lr}; use e.g. 3e-4")
        if not self.attn_kl_weight >= 0:
            raise ConfigError(f"expected attn_kl_weight >= 0, got {self.attn_kl_weight}; use 0 for output MSE only")


@dataclass
class OutputError:
    """Student vs teacher on the real (non-padded) tokens of a split."""

    mse: float
    rel_l2: float


@dataclass
class DistillSummary:
    """Validation error before/after (best checkpoint) and the check-by-check history."""

    val_mse_before: float
    val_mse_after: float
    val_rel_l2_before: float
    val_rel_l2_after: float
    steps_run: int
    stopped_early: bool
    history: list[dict[str, float | None]] = field(default_factory=list)  # step, train_loss, val_mse, val_rel_l2
    best_step: int = 0
    module: str = "layer"  # what trained: the whole layer, or only its attention block (self_attn)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        stop = ", stopped early" if self.stopped_early else ""
        return (
            f"distillation: val rel L2 {self.val_rel_l2_before:.4g} -> {self.val_rel_l2_after:.4g} "
            f"(best at step {self.best_step} of {self.steps_run}{stop})"
        )


def _attention_modules(model: nn.Module) -> dict[str, nn.Module]:
    return {
        name: mod
        for name, mod in model.named_modules()
        if isinstance(mod, AttentionProjections) and "need_weights" in inspect.signature(mod.forward).parameters
    }


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Force ``need_weights=True`` on every attention module; yields name -> probs (B, H, Lq, Lk).

    Hooks, not edits: the layers' code stays as it exports, and the dict is refilled on every forward.
    """
    probs: dict[str, torch.Tensor] = {}

    def want_weights(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict]:
        bound = inspect.signature(mod.forward).bind(*args, **kwargs)
        bound.arguments["need_weights"] = True
        return bound.args, bound.kwargs

    def keep_weights(name: str) -> Any:
        def hook(_mod: nn.Module, _args: Any, out: tuple[torch.Tensor, torch.Tensor | None]) -> None:
            if out[1] is not None:
                probs[name] = out[1]

        return hook

    handles = []
    for name, mod in _attention_modules(model).items():
        handles.append(mod.register_forward_pre_hook(want_weights, with_kwargs=True))
        handles.append(mod.register_forward_hook(keep_weights(name)))
    try:
        yield probs
    finally:
        for h in handles:
            h.remove()


def attention_kl(p_teacher: torch.Tensor, p_student: torch.Tensor, query_keep: torch.Tensor | None = None) -> torch.Tensor:
    """Mean KL(teacher || student) over attention rows (B, H, Lq); padded and fully masked queries excluded."""
    kl = (torch.xlogy(p_teacher, p_teacher) - p_teacher * p_student.clamp_min(1e-12).log()).sum(-1)  # (B, H, Lq)
    valid = p_teacher.sum(-1) > 0
    if query_keep is not None:
        valid = valid & query_keep[:, None, :]
    return kl[valid].mean() if bool(valid.any()) else kl.sum() * 0.0


def _token_mse(y: torch.Tensor, ref: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    diff = (y - ref) if keep is None else (y - ref)[keep]  # (T, D) real tokens
    return diff.pow(2).mean()


@torch.no_grad()
def output_error(
    model: nn.Module, reference: nn.Module | torch.Tensor, data: ActivationSet, batch_size: int = 16
) -> OutputError:
    """MSE and relative L2 of ``model`` against ``reference`` (a module or its outputs) on real tokens."""
    x, kpm = data.to_torch(device_of(model))
    with eval_mode(model, *([reference] if isinstance(reference, nn.Module) else [])):
        return _output_error(model, reference, x, kpm, batch_size)


def _output_error(
    model: nn.Module, reference: nn.Module | torch.Tensor, x: torch.Tensor, kpm: torch.Tensor | None, batch_size: int
) -> OutputError:
    sq_err = sq_ref = 0.0
    count = 0
    for i in range(0, x.shape[0], batch_size):
        xb, kb = x[i : i + batch_size], None if kpm is None else kpm[i : i + batch_size]
        ref = reference[i : i + batch_size] if isinstance(reference, torch.Tensor) else forward_layer(reference, xb, kb)
        y = forward_layer(model, xb, kb)
        keep = None if kb is None else kb != 0
        diff, ref = ((y - ref), ref) if keep is None else ((y - ref)[keep], ref[keep])
        sq_err += float(diff.double().pow(2).sum())
        sq_ref += float(ref.double().pow(2).sum())
        count += diff.numel()
    return OutputError(mse=sq_err / max(count, 1), rel_l2=(sq_err / sq_ref) ** 0.5 if sq_ref > 0 else sq_err**0.5)


def _warmup_cosine(step: int, steps: int) -> float:
    """LR factor: linear warm-up over the first 10% of steps, then cosine decay to 0.

    Adam's first updates have full size whatever the gradient; from a good low-rank start,
    an un-warmed lr of 1e-3 throws the student further off than distillation then recovers.
    """
    warm = max(1, steps // 10)
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def _batches(
    data: ActivationSet, batch_size: int, generator: torch.Generator, augment: bool, device: torch.device
) -> Iterator[_Batch]:
    """Endless seeded batches. ``augment`` refills each batch's real tokens with tokens drawn
    from the whole calibration pool: the teacher labels any input, and new token mixtures
    give attention (hence W_o) inputs the few calibration sequences never showed."""
    x, kpm = data.to_torch(device)
    pool = x.reshape(-1, x.shape[-1]) if kpm is None else x[kpm != 0]  # (T, D) real tokens
    while True:  # epochs, each in a fresh seeded order
        for xb, kb in data.batches(batch_size, generator, device):
            if augment:
                keep = torch.ones(xb.shape[:2], dtype=torch.bool, device=device) if kb is None else kb != 0
                xb = xb.clone()
                xb[keep] = pool[torch.randint(0, pool.shape[0], (int(keep.sum()),), generator=generator)]
            yield xb, kb


def distill_(
    student: nn.Module, teacher: nn.Module, calib: ActivationSet, val: ActivationSet, config: DistillConfig | None = None
) -> DistillSummary:
    """Train ``student`` (in place) towards ``teacher`` on ``calib``; early-stop on ``val``, keep the best.

    Dropout stays off (eval mode): the target is the teacher's deterministic output.
    """
    config = config or DistillConfig()
    teacher_ids = {id(p) for p in teacher.parameters()}
    params = [p for p in student.parameters() if p.requires_grad]
    if not params or any(id(p) in teacher_ids for p in params):
        raise ConfigError(
            "expected a student with its own trainable parameters; pass a compressed copy.deepcopy(teacher), not the teacher"
        )
    use_kl = config.attn_kl_weight > 0 and bool(_attention_modules(teacher)) and bool(_attention_modules(student))
    with eval_mode(student, teacher), torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        summary = _train(student, teacher, calib, val, config, params, use_kl)
    log.info("%s", summary.describe())
    return summary


def train_low_rank_only(module: nn.Module) -> dict[str, bool]:
    """Freeze everything but ``LowRankLinear`` factors; returns the previous flags to restore."""
    before = {name: p.requires_grad for name, p in module.named_parameters()}
    low_rank = {id(p) for m in module.modules() if isinstance(m, LowRankLinear) for p in m.parameters()}
    for p in module.parameters():
        p.requires_grad_(id(p) in low_rank)
    return before


def _trained_block(slot: ModuleSlot) -> tuple[nn.Module, nn.Module, str]:
    """What a frozen slot trains: the attention block when every low-rank factor lies in it, else the whole slot.

    In a post-norm layer the attention block reads the layer's input, so both see the same
    real activations; the block alone costs about a third of the layer per step and, with
    only Q/K/V/O factorized, recovers as much (MiniLM: same held-out cosine, 5x faster).
    """
    student, teacher = (slot.student.layer, slot.teacher.layer) if isinstance(slot.student, MaskedLayer) else (slot.student, slot.teacher)
    if isinstance(student, TransformerLayer):
        factors = [m for m in student.modules() if isinstance(m, LowRankLinear)]
        inside = {id(m) for m in student.self_attn.modules()}
        if factors and all(id(m) in inside for m in factors):
            return student.self_attn, teacher.self_attn, "self_attn"  # type: ignore[union-attr]
    return slot.student, slot.teacher, "layer"


def distill_slot_(slot: ModuleSlot, config: DistillConfig) -> DistillSummary:
    """Distil one slot of a student towards the reference's same module on the slot's own inputs (``train``; early
    stopping on ``select``). A frozen slot (pretrained weights that must stay) trains only its low-rank factors, in the
    smallest block that holds them (``_trained_block``); any other slot trains whole."""
    if not slot.frozen:
        summary = distill_(slot.student, slot.teacher, slot.inputs("train"), slot.inputs("select"), config)
        slot.student.eval()
        return summary
    s_mod, t_mod, block = _trained_block(slot)
    flags = train_low_rank_only(s_mod)
    try:
        summary = distill_(s_mod, t_mod, slot.inputs("train"), slot.inputs("select"), config)
    finally:
        for name, p in s_mod.named_parameters():
            p.requires_grad_(flags.get(name, True))
    slot.student.eval()
    summary.module = block
    return summary


def _teacher_targets(
    teacher: nn.Module, xb: torch.Tensor, kb: torch.Tensor | None, use_kl: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    with torch.no_grad():
        if not use_kl:
            return forward_layer(teacher, xb, kb), {}
        with capture_attention(teacher) as probs:
            y = forward_layer(teacher, xb, kb)
        return y, dict(probs)


def _train(
    student: nn.Module, teacher: nn.Module, calib: ActivationSet, val: ActivationSet,
    config: DistillConfig, params: list[nn.Parameter], use_kl: bool,
) -> DistillSummary:  # fmt: skip
    device = device_of(student)
    with torch.no_grad():
        val_ref = torch.cat([forward_layer(teacher, xb, kb) for xb, kb in val.batches(config.batch_size, device=device)])

    def student_loss(xb: torch.Tensor, kb: torch.Tensor | None, y_t: torch.Tensor, probs_t: dict) -> torch.Tensor:
        keep = None if kb is None else kb != 0
        if not use_kl:
            return _token_mse(forward_layer(student, xb, kb), y_t, keep)
        with capture_attention(student) as probs_s:
            y_s = forward_layer(student, xb, kb)
        kl = torch.stack([attention_kl(probs_t[n], probs_s[n], keep) for n in probs_t]).mean()
        return _token_mse(y_s, y_t, keep) + config.attn_kl_weight * kl

    batches = _batches(calib, config.batch_size, torch.Generator().manual_seed(config.seed), config.augment, device)

    def step_loss(step: int) -> torch.Tensor:
        xb, kb = next(batches)
        y_t, probs_t = _teacher_targets(teacher, xb, kb, use_kl)
        if config.grad_checkpointing:  # recompute the student's activations during backward
            return checkpoint(student_loss, xb, kb, y_t, probs_t, use_reentrant=False)
        return student_loss(xb, kb, y_t, probs_t)

    def evaluate() -> tuple[float, dict[str, float]]:
        err = output_error(student, val_ref, val, config.batch_size)
        return err.mse, {"val_mse": err.mse, "val_rel_l2": err.rel_l2}

    run = train_loop(student, params, step_loss, evaluate, config)
    before, best = run.history[0], run.best
    return DistillSummary(before["val_mse"], best["val_mse"], before["val_rel_l2"], best["val_rel_l2"], run.steps_run, run.stopped_early,
                          run.history, run.best_step)  # fmt: skip


@dataclass
class LoopResult:
    """What ``train_loop`` did: the metrics before and at the best step, and every check."""

    best: dict[str, float]
    best_step: int
    steps_run: int
    stopped_early: bool
    history: list[dict[str, float | None]]


def train_loop(
    student: nn.Module, params: list[nn.Parameter], step_loss: Callable[[int], torch.Tensor],
    evaluate: Callable[[], tuple[float, dict[str, float]]], config: DistillConfig,
) -> LoopResult:  # fmt: skip
    """The one distillation loop, for every scope: AdamW with warm-up and cosine decay, a check every
    ``eval_every`` steps, early stopping after ``patience`` checks without improvement, and the best
    check's weights restored at the end (distillation never leaves the student worse than it found it).

    ``step_loss(step)`` returns the training loss of one batch; ``evaluate()`` returns
    ``(error, metrics)`` on the select split (lower error is better).
    """
    first, metrics = evaluate()
    history: list[dict[str, float | None]] = [{"step": 0, "train_loss": None, **metrics}]
    best_err, best, best_step, best_state, bad, stopped, step = first, dict(metrics), 0, copy.deepcopy(student.state_dict()), 0, False, 0
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, partial(_warmup_cosine, steps=config.steps))
    # a progress bar only where a person watches: never \r redraws in a CI log
    bar = tqdm(total=config.steps, desc=f"distill ({config.scope})", unit="step", disable=not (config.progress and sys.stderr.isatty()), leave=False)
    try:
        for step in range(1, config.steps + 1):
            loss = step_loss(step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            bar.update(1)
            if step % config.eval_every and step != config.steps:
                continue
            err, metrics = evaluate()
            history.append({"step": step, "train_loss": float(loss.detach()), **metrics})
            bar.set_postfix(loss=f"{float(loss.detach()):.3g}", error=f"{err:.4g}")
            if err < best_err:
                best_err, best, best_step, best_state, bad = err, dict(metrics), step, copy.deepcopy(student.state_dict()), 0
            else:
                bad += 1
                if bad >= config.patience:
                    stopped = True
                    break
    finally:
        bar.close()
        student.load_state_dict(best_state)
    return LoopResult(best, best_step, step, stopped, history)
