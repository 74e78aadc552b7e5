"""A pretrained checkpoint as the pipeline's subject: real text, sentence-embedding accuracy.

The subject is the whole encoder (``--layers all``: inputs ``input_ids``/``attention_mask``,
outputs ``last_hidden_state``/``sentence_embedding``) or layer N (``--layers N``: the
reference-layer signature ``(x, key_padding_mask) -> y`` on the hidden states that layer
really sees). Either way an artifact is judged by what it does to the sentence embeddings
on held-out text: a layer artifact is spliced into the eager encoder
(``checkpoint.evaluate.SplicedEncoder``).

Data roles (``subjects.base``) come from the text corpus's three disjoint splits: ``train``
texts (or ``--calib FILE.txt``) fit int8 ranges, low-rank factors and distillation;
``select`` texts decide early stopping and route selection; ``report`` texts are only
measured. Latency is timed on ``--batch`` corpus texts padded to ``--seq-len`` tokens.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from attn_export.errors import ConfigError, DataError
from attn_export.runtime.base import Feed, Runner
from attn_export.subjects.base import Judgement, Split, Subject, rel_l2

__all__ = ["EncoderSubject", "read_text_file"]

log = logging.getLogger(__name__)

_FEED_BATCH = 16  # texts per judged batch
E2E_LR = 2e-4  # end-to-end distillation of the low-rank factors (after the per-layer stage)
_MAX_CALIB_TEXT_BYTES = 64 * 2**20


def read_text_file(path: Path) -> list[str]:
    """``--calib FILE.txt`` for a checkpoint: UTF-8, one text per line, blank lines skipped."""
    from attn_export.paths import check_regular_file

    path = Path(path)
    check_regular_file(path, "--calib", DataError)  # a FIFO blocks and /dev/zero reports size 0: never opened
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


class EncoderSubject(Subject):
    """``--checkpoint DIR|minilm`` with ``--layers all|N``."""

    kind = "encoder"

    def __init__(self, cfg: Any) -> None:
        from attn_export.checkpoint.loader import load_bert_checkpoint, resolve_checkpoint
        from attn_export.checkpoint.text import load_text_corpus, load_tokenizer, tokenize
        from attn_export.layers.encoder import parse_layers

        self.cfg = cfg
        self.path = resolve_checkpoint(cfg.checkpoint)
        self.encoder = load_bert_checkpoint(self.path)
        if cfg.attention_impl != "math":
            from attn_export.layers.projections import set_attention_impl_

            set_attention_impl_(self.encoder, cfg.attention_impl)
        conf = self.encoder.config
        self.index = parse_layers(cfg.resolved_layers, len(self.encoder.layers))
        positions = conf.max_position_embeddings
        if cfg.resolved_max_len > positions or cfg.seq_len > positions:
            raise ConfigError(f"expected --max-len and --seq-len <= {positions} (the checkpoint's positions), got {cfg.resolved_max_len} and {cfg.seq_len}")
        self.tokenizer = load_tokenizer(self.path)
        corpus = load_text_corpus(cfg.resolved_languages, max_per_split=cfg.resolved_max_texts)
        # the corpus's three disjoint splits (whole topic groups): calibration, validation, test
        train_texts, select_texts, report_texts = list(corpus.calib), list(corpus.val), list(corpus.test)
        self.calib_source = corpus.source
        if cfg.calib is not None:
            train_texts = read_text_file(cfg.calib)
            self.calib_source = str(cfg.calib)
        max_len = cfg.resolved_max_len
        self.tokens = {
            "train": tokenize(self.tokenizer, train_texts, max_len),
            "select": tokenize(self.tokenizer, select_texts, max_len),
            "report": tokenize(self.tokenizer, report_texts, max_len),
        }
        self.corpus_source = corpus.source
        lat_texts = [report_texts[i % len(report_texts)] for i in range(cfg.batch)]
        self._latency_tokens = tokenize(self.tokenizer, lat_texts, cfg.seq_len, pad_to=cfg.seq_len)
        self._module = self.encoder if self.index is None else self.encoder.subject(self.index)
        self._feeds: dict[str, list[Feed]] = {}
        self._ref_embeddings: dict[str, np.ndarray] = {}
        self._layer_acts: dict[str, Any] = {}
        self._quick_refs: dict[str, np.ndarray] = {}
        self._distill_tokens: Any = None

    # -- identity -----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return "encoder" if self.index is None else f"layer{self.index}"

    def model_info(self) -> dict[str, Any]:
        c = self.encoder.config
        return {
            "layer": f"sentence-encoder[{self.name}]", "d_model": c.hidden_size, "heads": c.num_attention_heads,
            "params": self.params(self.encoder), "subject_params": self.params(), "subject": "encoder",
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
        return self._module

    @property
    def input_names(self) -> list[str]:
        from attn_export.checkpoint.export import ENCODER_INPUT_NAMES

        return list(ENCODER_INPUT_NAMES) if self.index is None else ["x", "key_padding_mask"]

    @property
    def output_names(self) -> list[str]:
        from attn_export.checkpoint.export import ENCODER_OUTPUT_NAMES

        return list(ENCODER_OUTPUT_NAMES) if self.index is None else ["y"]

    # -- data ---------------------------------------------------------------------------
    def _acts(self, split: str) -> Any:
        from attn_export.checkpoint.text import all_layer_inputs

        if split not in self._layer_acts:
            self._layer_acts[split] = all_layer_inputs(self.encoder, self.tokens[split], layers=[self.index])[self.index]
        return self._layer_acts[split]

    def feeds(self, split: Split) -> list[Feed]:
        if split not in self._feeds:
            if self.index is None:
                self._feeds[split] = self.tokens[split].feeds(_FEED_BATCH, trim=True)
            else:
                acts = self._acts(split)
                self._feeds[split] = [
                    {"x": acts.x[i : i + _FEED_BATCH], "key_padding_mask": acts.key_padding_mask[i : i + _FEED_BATCH]}
                    for i in range(0, len(acts), _FEED_BATCH)
                ]
        return self._feeds[split]

    def latency_feed(self) -> Feed:
        if self.index is None:
            return self._latency_tokens.feed()
        from attn_export.checkpoint.text import all_layer_inputs

        acts = all_layer_inputs(self.encoder, self._latency_tokens, layers=[self.index])[self.index]
        return {"x": acts.x, "key_padding_mask": acts.key_padding_mask}

    def calibration(self) -> Any:
        if self.index is None:
            return self.tokens["train"].feeds(8, uniform=True)
        return self._acts("train")

    # -- building -----------------------------------------------------------------------
    def export(self, module: nn.Module, path: Path, spec: Any) -> Any:
        from attn_export.checkpoint.export import encoder_export_spec, export_encoder
        from attn_export.export import export_onnx

        spec = encoder_export_spec(spec)
        if self.index is None:
            return export_encoder(module, path, spec)  # type: ignore[arg-type]
        return export_onnx(module, path, spec)  # type: ignore[arg-type]

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
        from attn_export.compress import low_rank_

        if self.index is None:
            return low_rank_encoder_(student, self.encoder, self.tokens["train"], config, None)  # type: ignore[arg-type]
        return low_rank_(student, config, self._acts("train"))

    def distill(self, student: nn.Module, config: Any) -> Any:
        from attn_export.checkpoint.compress import _distill_pair, distill_encoder_, train_low_rank_only
        from attn_export.compress import distill_
        from attn_export.compress.lowrank import LowRankConfig

        targets = self.cfg.resolved_low_rank_targets
        if self.index is None:
            from attn_export.checkpoint.compress import distill_encoder_e2e_

            layers = distill_encoder_(student, self.encoder, self.tokens["train"], self.tokens["select"], targets, config)  # type: ignore[arg-type]
            e2e = distill_encoder_e2e_(student, self.encoder, self.distill_tokens(), self.tokens["select"], steps=config.steps,  # type: ignore[arg-type]
                                       lr=E2E_LR, batch_size=config.batch_size, seed=config.seed)  # fmt: skip
            return _Summary({"layers": layers, "steps_per_layer": config.steps, "end_to_end": e2e.to_dict()})
        teacher_layer, student_layer = self._module.layer, student.layer  # type: ignore[union-attr]
        s_mod, t_mod = _distill_pair(student_layer, teacher_layer, LowRankConfig(rank_ratio=0.5, targets=tuple(targets)))
        flags = train_low_rank_only(s_mod)
        try:
            summary = distill_(s_mod, t_mod, self._acts("train"), self._acts("select"), config)
        finally:
            for name, p in s_mod.named_parameters():
                p.requires_grad_(flags.get(name, True))
        student.eval()
        return summary

    @property
    def default_distill_config(self) -> Any:
        """Per-layer attention distillation measured on MiniLM (Q/K at 50%): the attention-KL term
        does the work; lr 1e-3 converges in ~120 steps per layer (docs/encoder.md)."""
        from attn_export.compress import DistillConfig

        return DistillConfig(lr=1e-3, batch_size=16, attn_kl_weight=1.0, eval_every=20, patience=3, progress=False, seed=self.cfg.seed)

    # -- judging ------------------------------------------------------------------------
    def _reference_embeddings(self, split: str) -> np.ndarray:
        from attn_export.checkpoint.evaluate import embed
        from attn_export.checkpoint.export import ENCODER_INPUT_NAMES, ENCODER_OUTPUT_NAMES
        from attn_export.runtime import EagerRunner

        if split not in self._ref_embeddings:
            runner = EagerRunner(self.encoder, ENCODER_INPUT_NAMES, ENCODER_OUTPUT_NAMES)
            self._ref_embeddings[split] = embed(runner, self.tokens[split].feeds(_FEED_BATCH, trim=True))
        return self._ref_embeddings[split]

    def quick_error(self, candidate: Runner, split: Split, limit: int) -> float:
        """Whole encoder: 1 - mean embedding cosine on the first ``limit`` texts; layer N: its output's
        relative L2 on the real inputs of those texts (the layer's own error, without the eager splice)."""
        from attn_export.checkpoint.evaluate import embed

        if self.index is None:
            n = max(1, min(limit, len(self.tokens[split])))
            ref = self._reference_embeddings(split)[:n].astype(np.float64)
            emb = embed(candidate, self.tokens[split].feeds(_FEED_BATCH, trim=True, limit=n)).astype(np.float64)
            cos = (ref * emb).sum(1) / np.maximum(np.linalg.norm(ref, axis=1) * np.linalg.norm(emb, axis=1), 1e-30)
            return float(1.0 - cos.mean())
        take, seen = [], 0
        for f in self.feeds(split):
            if seen >= limit:
                break
            take.append(f)
            seen += len(f["x"])
        key = f"{split}:{len(take)}"
        if key not in self._quick_refs:
            eager = self.eager_runner()
            self._quick_refs[key] = np.concatenate([eager.infer(f)["y"].ravel() for f in take])
        ref = self._quick_refs[key]
        got = np.concatenate([np.asarray(candidate.infer(f)["y"], dtype=np.float32).ravel() for f in take])
        return rel_l2(ref, got)

    def judge(self, candidate: Runner, split: Split, tolerance_key: str) -> Judgement:
        from attn_export.checkpoint.evaluate import RunnerLayer, SplicedEncoder, embed
        from attn_export.checkpoint.export import ENCODER_INPUT_NAMES, ENCODER_OUTPUT_NAMES
        from attn_export.checkpoint.metrics import embedding_agreement
        from attn_export.runtime import EagerRunner
        from attn_export.validate.error_histogram import error_histogram
        from attn_export.validate.metrics import accuracy
        from attn_export.validate.tolerances import encoder_tolerance_for

        ref = self._reference_embeddings(split)
        token_feeds = self.tokens[split].feeds(_FEED_BATCH, trim=True)
        details: dict[str, Any] = {}
        if self.index is None:
            emb = embed(candidate, token_feeds)
        else:
            spliced = SplicedEncoder(self.encoder, self.index, RunnerLayer(candidate)).eval()
            emb = embed(EagerRunner(spliced, ENCODER_INPUT_NAMES, ENCODER_OUTPUT_NAMES), token_feeds)
            # the layer's own output on its real inputs, beside the embedding figure
            eager = self.eager_runner()
            feeds = self.feeds(split)
            ref_y = np.concatenate([eager.infer(f)["y"].ravel() for f in feeds])
            got_y = np.concatenate([np.asarray(candidate.infer(f)["y"], dtype=np.float32).ravel() for f in feeds])
            details["layer_accuracy"] = accuracy(ref_y, got_y).__dict__
        agreement = embedding_agreement(ref, emb)
        acc = accuracy(ref, emb)
        tol = encoder_tolerance_for(tolerance_key)
        violations = tol.violations(agreement, acc.max_abs)
        details.update(embedding=agreement, output="sentence_embedding", error_histogram=error_histogram(ref, emb))
        return Judgement(accuracy=acc, passed=not violations, tolerance=tol.to_dict(), violations=violations, details=details)


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
