"""A pretrained checkpoint as the pipeline's subject: real text, sentence-embedding accuracy.

The subject is the whole encoder: inputs ``input_ids``/``attention_mask``, outputs
``last_hidden_state``/``sentence_embedding`` (``docs/encoder.md``). An artifact is judged by
what it does to the sentence embeddings on held-out text (``validate.tolerances``' embedding
bar); ``EncoderLayerSubject`` (layer N of the same checkpoint) reuses all of this.

Data roles (``subjects.base``) come from the text corpus's three disjoint splits: ``train``
texts (or ``--calib FILE.txt``) fit 8-bit ranges, low-rank factors and distillation;
``select`` texts decide early stopping and route selection; ``report`` texts are only
measured. Latency is timed on ``--batch`` corpus texts padded to ``--seq-len`` tokens.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from attn_export.errors import DataError
from attn_export.runtime.base import Feed, Runner
from attn_export.subjects.base import BaseSubject, Judgement, Split

__all__ = ["EncoderSubject", "read_text_file"]

log = logging.getLogger(__name__)

FEED_BATCH = 16  # texts per judged batch
E2E_LR = 2e-4  # end-to-end distillation of the low-rank factors (after the per-layer stage)
_MAX_CALIB_TEXT_BYTES = 64 * 2**20


def read_text_file(path: Path) -> list[str]:
    """``--calib FILE.txt`` for a checkpoint: UTF-8, one text per line, blank lines skipped."""
    path = Path(path)
    if path.stat().st_size > _MAX_CALIB_TEXT_BYTES:
        raise DataError(f"--calib {path} is larger than {_MAX_CALIB_TEXT_BYTES >> 20} MiB; pass at most a few thousand texts")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"--calib {path} is not UTF-8 text (byte {err.start}); save it as UTF-8, one text per line") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < 8:
        raise DataError(f"--calib {path} holds {len(lines)} texts; pass at least 8, one per line")
    return lines


class EncoderSubject(BaseSubject):
    """``--checkpoint DIR|minilm`` (``--layers all``): the whole encoder."""

    kind = "encoder"
    deploy_name = "encoder"
    quick_error_name = "1 - mean embedding cosine"

    def __init__(self, cfg: Any) -> None:
        from attn_export.checkpoint.loader import load_bert_checkpoint, resolve_checkpoint
        from attn_export.checkpoint.text import load_text_corpus, load_tokenizer, tokenize

        self.cfg = cfg
        self.path = resolve_checkpoint(cfg.checkpoint)
        self.encoder = load_bert_checkpoint(self.path)
        if cfg.attention_impl != "math":
            from attn_export.layers.projections import set_attention_impl_

            set_attention_impl_(self.encoder, cfg.attention_impl)
        self.tokenizer = load_tokenizer(self.path)
        corpus = load_text_corpus(cfg.resolved_languages, max_per_split=cfg.resolved_max_texts)
        # the corpus's three disjoint splits (whole topic groups): calibration, validation, test
        train_texts, select_texts, report_texts = list(corpus.calib), list(corpus.val), list(corpus.test)
        self.calib_source = corpus.source
        if cfg.calib is not None:
            train_texts = read_text_file(cfg.calib)
            self.calib_source = str(cfg.calib)
        max_len = cfg.resolved_max_len
        self.tokens = {split: tokenize(self.tokenizer, texts, max_len)
                       for split, texts in (("train", train_texts), ("select", select_texts), ("report", report_texts))}  # fmt: skip
        self.corpus_source = corpus.source
        lat_texts = [report_texts[i % len(report_texts)] for i in range(cfg.batch)]
        self._latency_tokens = tokenize(self.tokenizer, lat_texts, cfg.seq_len, pad_to=cfg.seq_len)
        self._feeds: dict[str, list[Feed]] = {}
        self._ref_embeddings: dict[str, np.ndarray] = {}
        self._distill_tokens: Any = None

    # -- identity -----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return "encoder"

    def model_info(self) -> dict[str, Any]:
        c = self.encoder.config
        return {
            "layer": f"sentence-encoder[{self.name}]", "d_model": c.hidden_size, "heads": c.num_attention_heads,
            "params": self.params(self.encoder), "subject_params": self.params(), "subject": self.kind,
            "checkpoint": str(self.path), "name": self.cfg.checkpoint, "layers": self.cfg.resolved_layers, "num_layers": c.num_hidden_layers,
        }  # fmt: skip

    def inputs_info(self) -> dict[str, Any]:
        t = self.tokens
        return {
            "accuracy_data": f"{len(t['report'])} held-out texts of {self.corpus_source} (report split, never used for a decision)",
            "selection_data": f"{len(t['select'])} texts (select split): early stopping and route selection",
            "training_data": f"{len(t['train'])} texts of {self.calib_source}: int8 ranges, low-rank, distillation",
            "max_len": self.cfg.resolved_max_len, "batch": self.cfg.batch, "seq_len": self.cfg.seq_len, "seed": self.cfg.seed,
            "latency_data": f"{self.cfg.batch} corpus texts padded to {self.cfg.seq_len} tokens",
        }  # fmt: skip

    def describe_data(self) -> str:
        t = self.tokens
        return f"{self.corpus_source}: {len(t['train'])} train / {len(t['select'])} select / {len(t['report'])} report texts"

    # -- the eager reference ------------------------------------------------------------
    @property
    def module(self) -> nn.Module:
        return self.encoder

    @property
    def input_names(self) -> list[str]:
        from attn_export.checkpoint.export import ENCODER_INPUT_NAMES

        return list(ENCODER_INPUT_NAMES)

    @property
    def output_names(self) -> list[str]:
        from attn_export.checkpoint.export import ENCODER_OUTPUT_NAMES

        return list(ENCODER_OUTPUT_NAMES)

    # -- data ---------------------------------------------------------------------------
    def feeds(self, split: Split) -> list[Feed]:
        if split not in self._feeds:
            self._feeds[split] = self.tokens[split].feeds(FEED_BATCH, trim=True)
        return self._feeds[split]

    def latency_feed(self) -> Feed:
        return self._latency_tokens.feed()

    def calibration(self) -> Any:
        return self.tokens["train"].feeds(8, uniform=True)

    # -- building -----------------------------------------------------------------------
    def export(self, module: nn.Module, path: Path, spec: Any) -> Any:
        from attn_export.checkpoint.export import encoder_export_spec, export_encoder

        return export_encoder(module, path, encoder_export_spec(spec))  # type: ignore[arg-type]

    def distill_tokens(self) -> Any:
        """What distillation trains on: every calibration text of the corpus (or all of ``--calib``),
        not only the ``--max-texts`` the int8 ranges use; streamed in batches, so more text costs no memory."""
        if self._distill_tokens is None:
            from attn_export.checkpoint.text import load_text_corpus, tokenize

            texts = read_text_file(self.cfg.calib) if self.cfg.calib is not None else list(load_text_corpus(self.cfg.resolved_languages).calib)
            self._distill_tokens = tokenize(self.tokenizer, texts, self.cfg.resolved_max_len)
        return self._distill_tokens

    def low_rank(self, student: nn.Module, config: Any) -> Any:
        from attn_export.checkpoint.compress import low_rank_encoder_

        return low_rank_encoder_(student, self.encoder, self.tokens["train"], config, None)  # type: ignore[arg-type]

    def distill(self, student: nn.Module, config: Any) -> Any:
        from attn_export.checkpoint.compress import distill_encoder_, distill_encoder_e2e_

        targets = self.cfg.resolved_low_rank_targets
        layers = distill_encoder_(student, self.encoder, self.tokens["train"], self.tokens["select"], targets, config)  # type: ignore[arg-type]
        e2e = distill_encoder_e2e_(student, self.encoder, self.distill_tokens(), self.tokens["select"], steps=config.steps,  # type: ignore[arg-type]
                                   lr=E2E_LR, batch_size=config.batch_size, seed=config.seed)  # fmt: skip
        return _Summary({"layers": layers, "steps_per_layer": config.steps, "end_to_end": e2e.to_dict()})

    @property
    def default_distill_config(self) -> Any:
        """Per-layer attention distillation measured on MiniLM (Q/K at 50%): the attention-KL term
        does the work; lr 1e-3 converges in ~120 steps per layer (docs/encoder.md)."""
        from attn_export.compress.distill import DistillConfig

        return DistillConfig(lr=1e-3, batch_size=16, attn_kl_weight=1.0, eval_every=20, patience=3, progress=False, seed=self.cfg.seed)

    # -- judging ------------------------------------------------------------------------
    def reference_embeddings(self, split: str) -> np.ndarray:
        """The reference's sentence embeddings of ``split``'s texts (N, D), computed once."""
        from attn_export.checkpoint.evaluate import embed
        from attn_export.checkpoint.export import ENCODER_INPUT_NAMES, ENCODER_OUTPUT_NAMES
        from attn_export.runtime import EagerRunner

        if split not in self._ref_embeddings:
            runner = EagerRunner(self.encoder, ENCODER_INPUT_NAMES, ENCODER_OUTPUT_NAMES)
            self._ref_embeddings[split] = embed(runner, self.tokens[split].feeds(FEED_BATCH, trim=True))
        return self._ref_embeddings[split]

    def candidate_embeddings(self, candidate: Runner, split: str, limit: int | None = None) -> np.ndarray:
        """``candidate``'s sentence embeddings of ``split``'s texts (the first ``limit``)."""
        from attn_export.checkpoint.evaluate import embed

        return embed(candidate, self.tokens[split].feeds(FEED_BATCH, trim=True, limit=limit))

    def quick_error(self, candidate: Runner, split: Split, limit: int) -> float:
        """1 - mean embedding cosine on the first ``limit`` texts (for ranking, never a verdict)."""
        from attn_export.checkpoint.metrics import row_cosines

        n = max(1, min(limit, len(self.tokens[split])))
        return float(1.0 - row_cosines(self.reference_embeddings(split)[:n], self.candidate_embeddings(candidate, split, n)).mean())

    def tensor_tolerance(self, tolerance_key: str) -> Any:
        """Each output tensor's bar on the device: the embedding bar's mean cosine as a flattened cosine, and a max-abs bar for fp32."""
        from attn_export.validate.tolerances import Tolerance, embedding_tolerance_for

        emb = embedding_tolerance_for(tolerance_key)
        return Tolerance(max_abs=emb.max_abs, cosine_min=emb.min_mean_cosine)

    def fallback_goal(self, tolerance_key: str) -> Any:
        from attn_export.compress.mixed_precision import FallbackGoal
        from attn_export.validate.tolerances import tolerance_spec

        return FallbackGoal(tolerance_spec(tolerance_key).embedding_goal)

    def embedding_judgement(self, emb: np.ndarray, split: Split, tolerance_key: str) -> Judgement:
        """Judge candidate sentence embeddings ``emb`` of ``split`` against the reference's."""
        from attn_export.checkpoint.metrics import embedding_agreement
        from attn_export.validate.error_histogram import error_histogram
        from attn_export.validate.metrics import accuracy
        from attn_export.validate.tolerances import embedding_tolerance_for

        ref = self.reference_embeddings(split)
        agreement = embedding_agreement(ref, emb)
        acc = accuracy(ref, emb)
        tol = embedding_tolerance_for(tolerance_key)
        violations = tol.violations(agreement, acc.max_abs)
        details = {"embedding": agreement, "output": "sentence_embedding", "error_histogram": error_histogram(ref, emb)}
        return Judgement(accuracy=acc, passed=not violations, tolerance=tol.to_dict(), score=float(agreement["mean_cosine"]),
                         violations=violations, details=details)  # fmt: skip

    def judge(self, candidate: Runner, split: Split, tolerance_key: str) -> Judgement:
        return self.embedding_judgement(self.candidate_embeddings(candidate, split), split, tolerance_key)


class _Summary:
    """A plain summary with ``to_dict()`` (what the registry records for every method)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def to_dict(self) -> dict[str, Any]:
        return dict(self._data)

    def describe(self) -> str:
        layers = self._data.get("layers") or {}
        rel = ", ".join(f"{v['val_rel_l2_before']:.3g}->{v['val_rel_l2_after']:.3g}" for v in layers.values())
        out = f"distilled {len(layers)} layers ({self._data.get('steps_per_layer')} steps max each); select-split rel L2 per layer {rel}"
        e2e = self._data.get("end_to_end")
        if e2e:
            out += (f"; then end to end on {e2e['train_texts']} texts (hidden states of every layer + embedding): select embedding error "
                    f"{e2e['select_error_before']:.3e} -> {e2e['select_error_after']:.3e} (best at step {e2e['best_step']} of {e2e['steps_run']})")  # fmt: skip
        return out
