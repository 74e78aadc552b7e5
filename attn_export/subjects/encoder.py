"""A pretrained checkpoint as the pipeline's subject: the user's model is the reference, the user's texts the data.

The subject is the whole encoder: inputs ``input_ids``/``attention_mask`` (and ``token_type_ids`` for a
cross-encoder whose tokenizer types a pair's second text 1: ``_token_types``), outputs
``last_hidden_state``/``sentence_embedding`` (and ``logits`` with a task head;
``docs/encoder.md``). It is judged on what its users read (``JUDGED_OUTPUT``): a bare encoder on
its sentence embeddings, a head on its logits alone (per real token for a token head), never on
the pooled embedding's neighbours. The project's own layers are the export path; the **reference** every
artifact is judged against is the model as its own library runs it: transformers' model and,
where the folder has them, the sentence-transformers modules (``checkpoint.reference``). At
load, a fidelity check (``checkpoint.fidelity``) refuses, in one line, a checkpoint the
project's layers do not reproduce, so no run can pass against a re-implementation. Data roles
(``subjects.text_data``): the user's texts (``--calib FILE.txt``, split 60/20/20) or the shipped
corpus's three disjoint splits; every figure is on the report split, with the shipped corpus (and
long texts, for a long ``--seq-len``) judged beside it as named figures, and batch invariance
(``subjects.invariance``). ``EncoderLayerSubject`` (layer N of the same checkpoint) reuses all of this.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from attn_export.layers.encoder_config import JUDGED_OUTPUT
from attn_export.runtime.base import Feed, Runner
from attn_export.subjects.base import BaseSubject, Judgement, ModuleSlot, Split
from attn_export.subjects.invariance import TextBatchInvariance

__all__ = ["EncoderSubject"]
log = logging.getLogger(__name__)

FEED_BATCH, TIMED_BATCHES = 16, 8  # texts per judged batch; real-text batches per timing round (short rounds: more)
E2E_LR = 2e-4  # end-to-end distillation of the low-rank factors (after the per-layer stage)


class EncoderSubject(TextBatchInvariance, BaseSubject):
    """``--checkpoint DIR|minilm`` (``--layers all``): the whole encoder."""

    kind = "encoder"
    deploy_name = "encoder"

    def __init__(self, cfg: Any) -> None:
        from attn_export.checkpoint.fidelity import check_fidelity
        from attn_export.checkpoint.loader import load_bert_checkpoint, resolve_checkpoint
        from attn_export.checkpoint.reference import load_reference
        from attn_export.checkpoint.text import load_tokenizer, tokenize
        from attn_export.subjects.text_data import TextData

        self.cfg = cfg
        self.path = resolve_checkpoint(cfg.checkpoint)
        self.encoder = load_bert_checkpoint(self.path, pooling=cfg.pooling)
        conf = self.encoder.config
        self.judged_output = JUDGED_OUTPUT[None if conf.head is None else conf.head.task]  # what its users read
        self.tokenizer = load_tokenizer(self.path, conf.vocab_size)  # ids the embedding matrix has no row for are refused
        # the user's model, as its own library runs it: the reference every artifact is judged against
        self.reference = load_reference(self.path, conf.pooling, None if conf.head is None else conf.head.task)
        self.fidelity = check_fidelity(self.encoder, self.path, reference=self.reference, tokenizer=self.tokenizer)  # refuses a mismatch
        self.prompt, self.max_len, self.text_notes = _text_settings(cfg, self.path, self.reference, self.tokenizer)
        if cfg.attention_impl != "math":
            from attn_export.layers.projections import set_attention_impl_

            set_attention_impl_(self.encoder, cfg.attention_impl)
        max_tokens = min(conf.max_tokens, self.reference.max_seq_length or conf.max_tokens)  # encode never feeds more
        self.data = TextData.build(cfg, self.tokenizer, max_tokens, self.prompt, self.max_len, reads_pairs=conf.head is not None and conf.head.task == "sequence")
        if self.data.token_types:
            self.text_notes.append(_token_types(self.encoder, str(cfg.calib)))
        if self.data.split_note and "dropped" in self.data.split_note:
            self.text_notes.append(f"--calib {self.data.split_note}")
        self.tokens = self.data.tokens
        lat_texts = [self.tokens["report"].texts[i % len(self.tokens["report"])] for i in range(cfg.batch)]
        self._latency_tokens = tokenize(self.tokenizer, lat_texts, cfg.seq_len, pad_to=cfg.seq_len, pairs=self.data.pairs,
                                        token_types=self.data.token_types)  # fmt: skip
        self._feeds: dict[str, list[Feed]] = {}
        self._references: dict[str, list[Any]] = {}
        self._distill_tokens: Any = None

    # -- identity -----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return "encoder"

    def model_info(self) -> dict[str, Any]:
        c = self.encoder.config
        info = {
            "layer": f"sentence-encoder[{self.name}]", "d_model": c.hidden_size, "heads": c.num_attention_heads,
            "params": self.params(self.encoder), "subject_params": self.params(), "subject": self.kind,
            "checkpoint": str(self.path), "name": self.cfg.checkpoint, "layers": self.cfg.resolved_layers, "num_layers": c.num_hidden_layers,
            "family": c.family, "pooling": c.pooling.to_dict(), "reference": self.reference.description, "fidelity": self.fidelity.to_dict(),
        }  # fmt: skip
        if c.head is not None:
            info["head"] = {"task": c.head.task, "labels": c.head.num_labels}
        return info

    def inputs_info(self) -> dict[str, Any]:
        from attn_export.subjects.text_data import length_profile, tensorrt_padding

        t, d = self.tokens, self.data
        info: dict[str, Any] = {
            "accuracy_data": f"{len(t['report'])} held-out texts of {d.source} (report split, never used for a decision)",
            "selection_data": f"{len(t['select'])} texts of {d.source} (select split): early stopping and route selection",
            "training_data": f"{len(t['train'])} texts of {d.train_source}: 8-bit ranges, low-rank, distillation",
            "max_len": self.max_len, "prompt": self.prompt.to_dict(), "batch": self.cfg.batch, "seq_len": self.cfg.seq_len, "seed": self.cfg.seed,
            "latency_data": f"the report split's texts in batches of {self.cfg.batch}, each padded to its longest (real texts), and "
                            f"{self.cfg.batch} report texts padded to {self.cfg.seq_len} tokens (fixed)",
            "split_sizes": {role: len(tokens) for role, tokens in t.items()},
            "report_lengths": length_profile(t["report"]), **tensorrt_padding(t["report"], self.cfg),
            "also_judged_on": {e.name: {"why": e.why, "lengths": length_profile(e.tokens)} for e in d.extra},
            "also_selected_on": {e.name: {"why": e.why, "lengths": length_profile(e.tokens)} for e in d.select_extra},
        }  # fmt: skip
        if d.split_note:
            info["split"] = d.split_note
        return info

    def notes(self) -> list[str]:
        """What the report must say about the data: a lowered --max-len, the prompt applied, texts dropped."""
        return list(self.text_notes)

    def map_inputs(self) -> Any:
        """The attention maps' input (``checkpoint.attention_maps.MapInputs``): one report text; the last layer, which
        carries every earlier layer's error into its probabilities."""
        from attn_export.checkpoint.attention_maps import MapInputs, one_text

        t = self.tokens["report"]
        tokens, text = one_text(t.texts, t.input_ids, t.attention_mask, t.token_type_ids)
        layers = self.encoder.config.num_hidden_layers
        return MapInputs(tokens, tokens, layer=layers - 1, softmax_index=layers - 1, softmax_count=layers, text=text)

    def report_attention(self, report: Mapping[str, Any], report_dir: Path) -> Any:
        """The heads of one layer, the user's model against the shipped ONNX file, on one real text (or a note why not)."""
        from attn_export.checkpoint.attention_maps import checkpoint_attention_section

        return checkpoint_attention_section(self.reference, self.map_inputs(), report, report_dir)

    def describe_data(self) -> str:
        t = self.tokens
        extra = "; also judged on " + ", ".join(e.name for e in self.data.extra) if self.data.extra else ""
        return f"{self.data.source}: {len(t['train'])} train / {len(t['select'])} select / {len(t['report'])} report texts{extra}"

    # -- the eager reference ------------------------------------------------------------
    @property
    def module(self) -> nn.Module:
        return self.encoder

    @property
    def input_names(self) -> list[str]:
        return list(self.encoder.input_names)  # input_ids, attention_mask[, token_type_ids]

    @property
    def output_names(self) -> list[str]:
        return list(self.encoder.output_names)  # last_hidden_state, sentence_embedding[, logits]

    # -- data ---------------------------------------------------------------------------
    def feeds(self, split: Split) -> list[Feed]:
        if split not in self._feeds:
            self._feeds[split] = self.tokens[split].feeds(FEED_BATCH, trim=True)
        return self._feeds[split]

    def latency_feed(self) -> Feed:
        return self._latency_tokens.feed()

    def timing_points(self, warmup: int, repeats: int) -> list[Any]:
        """The report split's real texts in batches of ``--batch`` (corpus order, each padded to its longest; ``TIMED_BATCHES``
        evenly spread) first, the fixed ``--batch`` x ``--seq-len`` input second: the first decides the selections."""
        from attn_export.validate.latency import TimingPoint

        if self.kind != "encoder":  # layer N of the encoder runs on hidden states: the fixed input only
            return super().timing_points(warmup, repeats)
        feeds = self.tokens["report"].feeds(self.cfg.batch, trim=True)
        feeds = [feeds[i] for i in sorted({round(x) for x in np.linspace(0, len(feeds) - 1, min(len(feeds), TIMED_BATCHES))})]
        slots, real, n = (sum(int(f(m["attention_mask"])) for m in feeds) for f in (np.size, np.sum, len))
        details = {"batches": len(feeds), "texts": n, "padding_fraction": 1.0 - real / max(slots, 1), "tokens_per_text": real / max(n, 1)}
        texts = TimingPoint("real texts", feeds[0], batch=self.cfg.batch, warmup=min(warmup, 1), repeats=None, budget_s=4.0,
                            min_repeats=min(5, repeats), max_repeats=repeats, details=details, more_feeds=tuple(feeds[1:]))  # fmt: skip
        lat = self.latency_feed()
        fixed_pad = 1.0 - float(lat["attention_mask"].sum()) / lat["attention_mask"].size
        fixed = TimingPoint("fixed", lat, batch=self.cfg.batch, warmup=min(warmup, 1), repeats=max(3, repeats // 4),  # a figure, not a decision
                            details={"padding_fraction": fixed_pad})
        return [texts, fixed]

    def calibration(self) -> Any:
        return self.tokens["train"].feeds(8, uniform=True)

    # -- building -----------------------------------------------------------------------
    def export(self, module: nn.Module, path: Path, spec: Any) -> Any:
        from attn_export.checkpoint.export import encoder_export_spec, export_encoder

        return export_encoder(module, path, encoder_export_spec(spec))  # type: ignore[arg-type]

    def distill_tokens(self) -> Any:
        """What distillation trains on: every calibration text of the corpus, not only the ``--max-texts`` the
        8-bit ranges use (streamed in batches, so more text costs no memory), or the user's train split."""
        if self._distill_tokens is None:
            from attn_export.checkpoint.corpus import load_text_corpus
            from attn_export.checkpoint.text import tokenize

            if self.cfg.calib is not None:  # the user's train split only: select and report texts stay unseen
                self._distill_tokens = self.tokens["train"]
            else:
                texts = list(load_text_corpus(self.cfg.resolved_languages).calib)
                self._distill_tokens = tokenize(self.tokenizer, self.prompt.apply(texts), self.max_len, token_types=self.data.token_types)
        return self._distill_tokens

    def module_slots(self, student: nn.Module) -> list[ModuleSlot]:
        """Every layer, fitted on the hidden states the reference feeds it (recorded once per split for all layers, and
        dropped with the slots); the pretrained weights stay, so a training transform trains only what was put in."""
        from attn_export.checkpoint.compress import joined_inputs, shared_layer_groups
        from attn_export.checkpoint.text import all_layer_inputs

        acts: dict[str, Any] = {}

        def inputs_of(indices: list[int]) -> Any:
            def inputs(split: Split) -> Any:
                if split not in acts:
                    acts[split] = all_layer_inputs(self.encoder, self.tokens[split])
                return joined_inputs(acts[split], indices)

            return inputs

        # one slot per distinct module: a layer shared across depth (ALBERT) is fitted once, on every depth's inputs
        groups = shared_layer_groups(student, range(len(student.layers)))  # type: ignore[arg-type]
        return [ModuleSlot(student.layers[i], self.encoder.layers[i], inputs_of(same), layer=i, frozen=True) for i, same in groups.items()]  # type: ignore[index, arg-type]

    def training_defaults(self) -> dict[str, Any]:
        """Per-layer attention distillation measured on MiniLM (Q/K at 50%): the attention-KL term
        does the work; lr 1e-3 converges in ~120 steps per layer (docs/encoder.md)."""
        return {"lr": 1e-3, "batch_size": 16, "attn_kl_weight": 1.0, "eval_every": 20, "patience": 3, "progress": False, "seed": self.cfg.seed}

    def end_to_end(self, student: nn.Module, settings: Any) -> Any:
        """Every factor at once through the whole student, towards every layer's hidden states and the embedding, on all the
        calibration texts (``distill_tokens``), stopping on the select texts (``checkpoint.compress.distill_encoder_e2e_``)."""
        from attn_export.checkpoint.compress import distill_encoder_e2e_

        return distill_encoder_e2e_(student, self.encoder, self.distill_tokens(), self.tokens["select"], steps=settings.steps,  # type: ignore[arg-type]
                                    lr=E2E_LR, batch_size=settings.batch_size, seed=settings.seed)  # fmt: skip

    # -- judging ------------------------------------------------------------------------
    def _set(self, name: str) -> Any:
        """The TokenBatch of a role (train/select/report) or of an extra judged set."""
        if name in self.tokens:
            return self.tokens[name]
        return next(e.tokens for e in (*self.data.extra, *self.data.select_extra) if e.name == name)

    def reference_outputs(self, name: str) -> list[Any]:
        """The user's model's outputs (``checkpoint.reference.ReferenceOutputs``) on set ``name``, batch by batch, computed once
        (with the batch's token types when the encoder takes them: transformers reads all type 0 without)."""
        from attn_export.layers.encoder import TOKEN_TYPE_INPUT

        if name not in self._references:
            self._references[name] = [self.reference(f["input_ids"], f["attention_mask"], f.get(TOKEN_TYPE_INPUT))
                                      for f in self._set(name).feeds(FEED_BATCH, trim=True)]  # fmt: skip
        return self._references[name]

    def reference_embeddings(self, split: str) -> np.ndarray:
        """The reference's sentence embeddings of ``split``'s texts (N, D)."""
        return np.concatenate([r.sentence_embedding for r in self.reference_outputs(split)])

    def encoder_runner(self, candidate: Runner) -> Runner:
        """A runner with the encoder's inputs and outputs for ``candidate`` (the artifact itself, for the whole encoder)."""
        return candidate

    def candidate_outputs(self, candidate: Runner, name: str, limit: int | None = None, batch: int = FEED_BATCH) -> list[dict[str, np.ndarray]]:
        runner = self.encoder_runner(candidate)
        return [runner.infer(f) for f in self._set(name).feeds(batch, trim=True, limit=limit)]

    def _judged(self, name: str, outputs: list[dict[str, np.ndarray]], limit: int | None = None, batch: int = FEED_BATCH) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:  # fmt: skip
        """(reference rows, candidate rows, where) of the output users read (``judged_output``) on set ``name``: one row per
        text, or per real token of a token head (``where``: each row's text and position; None for sentence embeddings).
        ``outputs`` (of the first ``limit`` texts, in batches of ``batch``) are compared with the reference's same first rows."""
        from attn_export.checkpoint.metrics import logit_rows

        refs = self.reference_outputs(name)
        if self.judged_output == "sentence_embedding":
            got = np.concatenate([np.asarray(o["sentence_embedding"], dtype=np.float32) for o in outputs])
            return np.concatenate([r.sentence_embedding for r in refs])[: len(got)], got, None
        feeds = self._set(name).feeds
        ref, where = logit_rows([r.logits for r in refs], [f["attention_mask"] for f in feeds(FEED_BATCH, trim=True)])
        got, _ = logit_rows([o["logits"] for o in outputs], [f["attention_mask"] for f in feeds(batch, trim=True, limit=limit)])
        return ref[: len(got)], got, where[: len(got)]

    def select_error(self, candidate: Runner, limit: int) -> float:
        """1 - mean cosine of what users read (embeddings, or logits per text or real token) on the first ``limit`` select
        texts (for ranking, never a verdict)."""
        from attn_export.checkpoint.metrics import row_cosines

        n = max(1, min(limit, len(self.tokens["select"])))
        ref, got, _ = self._judged("select", self.candidate_outputs(candidate, "select", n), n)
        return float(1.0 - row_cosines(ref, got).mean())

    @property
    def select_error_name(self) -> str:
        return f"1 - mean {'embedding' if self.judged_output == 'sentence_embedding' else 'logit'} cosine"

    def tensor_tolerance(self, tolerance_key: str) -> Any:
        """Each output tensor's bar on the device: the embedding bar's mean cosine as a flattened cosine, and a max-abs bar for fp32."""
        from attn_export.validate.tolerances import Tolerance, embedding_tolerance_for, embedding_with_overrides

        emb = embedding_with_overrides(embedding_tolerance_for(tolerance_key), self.cfg.tolerance_overrides)
        return Tolerance(max_abs=emb.max_abs, rel_l2=emb.max_rel_l2, cosine_min=emb.min_mean_cosine)

    def fallback_goal(self, tolerance_key: str) -> Any:
        """The 8-bit goal on the select split for sentence embeddings; a head's logits are held to the stage's own bar."""
        from attn_export.compress.quant.mixed_precision import FallbackGoal
        from attn_export.validate.tolerances import tolerance_spec

        return FallbackGoal(tolerance_spec(tolerance_key).embedding_goal if self.judged_output == "sentence_embedding" else None)

    def _agreement(self, name: str, outputs: list[dict[str, np.ndarray]], tolerance_key: str, batch: int = FEED_BATCH) -> tuple[dict[str, Any], list[str], Any, Any]:  # fmt: skip
        """The figures of what users read on set ``name`` (``details.embedding``, or ``details.logits`` with the worst row
        named), the violations of its bar, the accuracy, and the bar itself (as the report records it)."""
        from attn_export.checkpoint.metrics import classification_agreement, embedding_agreement
        from attn_export.validate.metrics import accuracy
        from attn_export.validate.tolerances import embedding_with_overrides, logits_with_overrides, tolerance_spec

        spec = tolerance_spec(tolerance_key)
        ref, got, where = self._judged(name, outputs, batch=batch)
        acc = accuracy(ref, got)
        if where is None:  # a sentence embedding: per-text cosine and nearest neighbours
            bar = embedding_with_overrides(spec.embedding, self.cfg.tolerance_overrides)
            figures = embedding_agreement(ref, got)
            return {"embedding": figures}, bar.violations(figures, acc.max_abs, acc.rel_l2), acc, bar.to_dict()
        logit_bar = logits_with_overrides(spec.logits, self.cfg.tolerance_overrides)
        logits: dict[str, Any] = classification_agreement(ref, got)
        if self.data.pairs and name in self.tokens:  # a reranker's users read the order of each query's candidates
            from attn_export.checkpoint.metrics import rank_agreement

            logits["rank"] = rank_agreement(ref, got, [t.split("\t", 1)[0].strip() for t in self._set(name).texts[: len(ref)]])
        row = int(logits["worst_row"])
        logits["per"] = "token" if where[row, 1] >= 0 else "text"
        logits["worst"] = self._name_row(name, int(where[row, 0]), int(where[row, 1]), ref[row], got[row], float(logits["min_cosine"]))
        return {"logits": logits}, logit_bar.violations(logits), acc, {f"logit_{k}": v for k, v in logit_bar.to_dict().items()}

    def _name_row(self, name: str, text: int, position: int, ref: np.ndarray, got: np.ndarray, cosine: float) -> str:
        """The worst row as a user finds it: the text, the token (its position and string) and the labels either side."""
        batch = self._set(name)
        snippet = batch.texts[text] if text < len(batch.texts) else ""
        snippet = snippet if len(snippet) <= 60 else snippet[:57] + "..."
        token = f", token {position} {self.tokenizer.id_to_token(int(batch.input_ids[text, position]))!r}" if position >= 0 else ""
        return f"text {text} {snippet!r}{token}: logit cosine {cosine:.6f}, label {int(ref.argmax())} -> {int(got.argmax())}"

    def judge(self, candidate: Runner, split: Split, tolerance_key: str, batch: int | None = None) -> Judgement:
        """Against the user's model on ``split``, on what its users read (``judged_output``); on the report split also on
        every extra set, named, beside the verdict, and on the select split on their twins (a selection requires them).
        ``batch``: texts per batch (``FEED_BATCH``); dynamic int8 ranges are per batch, so its fallback judges wide ones."""
        from attn_export.validate.error_histogram import error_histogram

        batch = batch or FEED_BATCH
        outputs = self.candidate_outputs(candidate, split, batch=batch)
        result, violations, acc, tolerance = self._agreement(split, outputs, tolerance_key, batch)
        ref, got, _ = self._judged(split, outputs, batch=batch)
        details: dict[str, Any] = {**result, "output": self.judged_output, "error_histogram": error_histogram(ref, got), "judged_on": self.data.source}
        extras = {"report": self.data.extra, "select": self.data.select_extra}.get(split) or []
        if extras:
            also = {}
            for extra in extras:
                r, v, _, _ = self._agreement(extra.name, self.candidate_outputs(candidate, extra.name, batch=batch), tolerance_key, batch)
                also[extra.name] = {**r, "passed": not v, "violations": v}
            details["also_judged_on"] = also
        score = float(next(iter(result.values()))["mean_cosine"])
        return Judgement(accuracy=acc, passed=not violations, tolerance=tolerance, score=score, violations=violations, details=details)


def _token_types(encoder: Any, calib: str) -> str:
    """A pair whose second text the tokenizer gives token type 1 (BERT's ``[CLS] A [SEP] B [SEP]``) needs ``token_type_ids``: the
    encoder takes them as a third input (``SentenceEncoder.use_token_types_``) and the report says so. A model without a
    type-1 embedding (``type_vocab_size`` < 2) cannot tell A from B as its tokenizer asks: refused in one line."""
    from attn_export.errors import DataError

    size = encoder.config.type_vocab_size
    if size < 2:
        raise DataError(f"--calib {calib} holds text pairs, which this tokenizer encodes with token types 0/1, but the model has no type-1 "
                        f"embedding (type_vocab_size {size}); use the model's own tokenizer (its pairs all type 0), or one text per line")  # fmt: skip
    encoder.use_token_types_()
    return (f"--calib {calib}: text pairs typed 0 (first text) and 1 (second), as the tokenizer encodes them: the exported model takes "
            "a third input, token_type_ids int64 (batch, seq)")  # fmt: skip


def _text_settings(cfg: Any, path: Path, reference: Any, tokenizer: Any) -> tuple[Any, int, list[str]]:
    """The prompt, the effective --max-len and their notes: what ``SentenceTransformer.encode`` applies to a text."""
    from attn_export.checkpoint.pooling import read_sentence_transformers
    from attn_export.checkpoint.prompts import check_library_prompt, effective_max_len, lower_case_, resolve_prompt

    notes: list[str] = []
    info = read_sentence_transformers(path)
    prompt = resolve_prompt(path, cfg.prompt, include_prompt=True if info is None else info.include_prompt)
    if info is not None and info.do_lower_case and lower_case_(tokenizer):
        notes.append("do_lower_case (sentence_bert_config.json): texts are lower-cased before tokenization, as sentence-transformers does")
    if reference.pipeline is not None:
        check_library_prompt(prompt, cfg.prompt, reference.prompts, reference.default_prompt_name, str(path))
    max_len, note = effective_max_len(cfg.resolved_max_len, reference.max_seq_length)
    notes += [note] if note else []
    if prompt.text:
        notes.append(f"prompt {prompt.text!r} ({prompt.source}) is prepended to every text, as SentenceTransformer.encode does; "
                     "feed the deployed model prompted texts")  # fmt: skip
    return prompt, max_len, notes

