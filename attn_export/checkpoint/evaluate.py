"""Judge an encoder artifact by its sentence embeddings on held-out text.

An artifact of the whole encoder is run on the validation texts directly. An artifact of
one layer N is judged in context: the eager encoder runs with layer N replaced by the
artifact (``SplicedEncoder``), so a single-layer int8 or low-rank model is still measured
by what it does to the sentence embeddings. Either way the ``Stage`` carries the
sentence-embedding accuracy in ``accuracy`` and the per-text cosines and top-1
neighbour agreement in ``details["embedding"]``; latency is the subject's own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from attn_export.checkpoint.metrics import embedding_agreement
from attn_export.compress.calib_data import forward_layer
from attn_export.errors import ConfigError
from attn_export.layers.encoder import SentenceEncoder
from attn_export.runtime import EagerRunner
from attn_export.runtime.base import Feed, Runner
from attn_export.validate.evaluate import evaluate_stage
from attn_export.validate.metrics import accuracy
from attn_export.validate.report import Latency, Stage
from attn_export.validate.tolerances import Tolerance

__all__ = [
    "ENCODER_TOLERANCES",
    "EncoderTolerance",
    "EncoderValidation",
    "RunnerLayer",
    "SplicedEncoder",
    "embed",
    "evaluate_encoder_stage",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EncoderTolerance:
    """What an artifact's sentence embeddings must keep, vs eager fp32 on the validation texts."""

    min_mean_cosine: float
    min_top1_agreement: float = 0.95
    max_abs: float | None = None  # on the embedding values, for exact routes (fp32)

    def violations(self, agreement: dict[str, float], max_abs: float) -> list[str]:
        out = []
        if not agreement["mean_cosine"] >= self.min_mean_cosine:  # NaN fails too
            out.append(f"mean cosine {agreement['mean_cosine']:.6f} < {self.min_mean_cosine}")
        if agreement["top1_neighbor_agreement"] < self.min_top1_agreement:
            out.append(f"top-1 neighbour agreement {agreement['top1_neighbor_agreement']:.3f} < {self.min_top1_agreement}")
        if self.max_abs is not None and not max_abs <= self.max_abs:
            out.append(f"max_abs {max_abs:.3g} > {self.max_abs:.3g}")
        return out

    def as_tolerance(self) -> Tolerance:
        return Tolerance(max_abs=self.max_abs, cosine_min=self.min_mean_cosine)

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v is not None}


# fp32: summation order only. fp16 with fp32 islands: ~1e-3 relative per op. int8 and
# low-rank at 50% of Q/K: the acceptance bar of docs/encoder.md.
ENCODER_TOLERANCES: dict[str, EncoderTolerance] = {
    "fp32": EncoderTolerance(0.99999, 0.95, max_abs=1e-4),
    "fp16": EncoderTolerance(0.999, 0.95),
    "int8": EncoderTolerance(0.99, 0.95),
    "lowrank": EncoderTolerance(0.99, 0.95),
}


class RunnerLayer(nn.Module):
    """A runner with the layer signature ``(x, key_padding_mask) -> y`` as an ``nn.Module``."""

    def __init__(self, runner: Runner) -> None:
        super().__init__()
        self.runner = runner

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor) -> torch.Tensor:
        feed = {"x": x.detach().float().numpy(), "key_padding_mask": key_padding_mask.numpy().astype(np.int32)}
        return torch.from_numpy(np.asarray(self.runner.infer(feed)["y"], dtype=np.float32))  # (B, S, D)


class SplicedEncoder(nn.Module):
    """``encoder`` with layer ``index`` replaced by ``layer``: the layer artifact in context."""

    def __init__(self, encoder: SentenceEncoder, index: int, layer: nn.Module) -> None:
        super().__init__()
        if not 0 <= index < len(encoder.layers):
            raise ConfigError(f"expected a layer index 0..{len(encoder.layers) - 1}, got {index}")
        self.encoder = encoder
        self.index = index
        self.layer = layer

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.encoder.embeddings(input_ids)  # (B, S, D)
        for i, layer in enumerate(self.encoder.layers):
            h = forward_layer(self.layer if i == self.index else layer, h, attention_mask)
        return self.encoder.outputs(h, attention_mask)  # the encoder's own pooling (and head)


def embed(runner: Runner, feeds: Sequence[Feed]) -> np.ndarray:
    """``sentence_embedding`` (N, D) of the encoder ``runner`` over ``feeds``, concatenated."""
    return np.concatenate([np.asarray(runner.infer(f)["sentence_embedding"], dtype=np.float32) for f in feeds])


@dataclass
class EncoderValidation:
    """Everything shared by the stages of one run: reference outputs, feeds, eager timing.

    ``subject_*`` describe what is timed and compared layer-wise: the encoder itself
    (``layer_index`` None) or layer N with its real activations as feeds.
    """

    encoder: SentenceEncoder
    feeds: list[Feed]  # validation texts, encoder inputs
    reference_embeddings: np.ndarray  # (N, D) eager fp32
    subject_eager: Runner
    subject_feeds: list[Feed]
    subject_refs: list[dict[str, np.ndarray]]
    latency_feed: Feed
    eager_latency: Latency
    layer_index: int | None = None
    warmup: int = 2
    repeats: int = 10
    batch: int = 8

    @property
    def output(self) -> str:
        return "sentence_embedding" if self.layer_index is None else "y"

    def candidate_embeddings(self, candidate: Runner) -> np.ndarray:
        if self.layer_index is None:
            return embed(candidate, self.feeds)
        spliced = SplicedEncoder(self.encoder, self.layer_index, RunnerLayer(candidate)).eval()
        return embed(EagerRunner(spliced, ["input_ids", "attention_mask"], ["last_hidden_state", "sentence_embedding"]), self.feeds)


def evaluate_encoder_stage(
    name: str,
    candidate: Runner,
    ctx: EncoderValidation,
    *,
    precision: str,
    tolerance: EncoderTolerance,
    artifact: str | None,
    size_bytes: int | None,
    params: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Stage:
    """Latency of ``candidate`` vs eager, and its sentence embeddings vs eager fp32."""
    stage = evaluate_stage(
        name, candidate, ctx.subject_eager, ctx.subject_feeds, ctx.subject_refs, ctx.latency_feed,
        precision=precision, tolerance=tolerance.as_tolerance() if ctx.layer_index is None else Tolerance(), artifact=artifact, size_bytes=size_bytes,
        params=params, output=ctx.output, warmup=ctx.warmup, repeats=ctx.repeats, batch=ctx.batch,
        eager_latency=ctx.eager_latency,
    )  # fmt: skip
    emb = ctx.candidate_embeddings(candidate)
    agreement = embedding_agreement(ctx.reference_embeddings, emb)
    emb_acc = accuracy(ctx.reference_embeddings, emb)
    if ctx.layer_index is not None:
        stage.details["layer_accuracy"] = asdict(stage.accuracy) if stage.accuracy else None
        stage.accuracy = emb_acc
    violations = tolerance.violations(agreement, emb_acc.max_abs)
    stage.passed = not violations
    stage.tolerance = tolerance.to_dict()
    stage.details["embedding"] = agreement
    stage.details["output"] = "sentence_embedding"
    stage.details["violations"] = violations
    msg = (
        f"{name}: mean cosine {agreement['mean_cosine']:.6f}, min {agreement['min_cosine']:.6f}, "
        f"top-1 agreement {agreement['top1_neighbor_agreement']:.3f}, "
        f"{stage.speedup_vs_eager or 0:.2f}x vs eager, {'PASS' if stage.passed else 'FAIL: ' + '; '.join(violations)}"
    )
    (progress or log.info)(msg)
    return stage
