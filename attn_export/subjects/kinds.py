"""The kinds of subject a ``RunConfig`` can name, and what each means before anything is built.

A run's subject is a reference layer (``--layer``), a pretrained checkpoint (``--checkpoint``)
or one layer of a checkpoint in context (``--checkpoint DIR --layers N``). Each kind owns its
flags, its measured defaults and its preflight; ``RunConfig`` asks the kind instead of
branching on it, and the plan reads the kind-free ``SubjectProfile``. This module is light
(no torch, no onnx): it runs while the flags are validated.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attn_export.errors import ConfigError
from attn_export.vocab.choices import LAYER_MASKS, LAYER_NAMES, check_heads, is_ascii_digits

if TYPE_CHECKING:
    from attn_export.vocab.run_options import RunOptions

__all__ = ["KINDS", "CheckpointKind", "LayerKind", "ModelShape", "SubjectKind", "SubjectProfile", "checkpoint_config", "kind_of"]

log = logging.getLogger(__name__)

# Flags each kind owns; a flag of another kind is refused, naming it.
_LAYER_FLAGS = ("layer", "d_model", "heads", "mask")
_CHECKPOINT_FLAGS = ("layers", "max_len", "max_texts", "languages", "pooling", "prompt", "encoder_form")


@dataclass(frozen=True)
class ModelShape:
    """Sizes the memory estimate needs, read from the flags or a checkpoint's config.json."""

    d_model: int
    heads: int
    ffn: int
    params: int
    attention_layer: str = "transformer"  # what the attention scores scale with (see resources.estimate_memory)


@dataclass(frozen=True)
class SubjectProfile:
    """What the plan knows of a subject before it is built: no module, only facts.

    ``layer`` and ``mask`` are what the attention-form choice sees (a checkpoint's layers are
    post-norm transformer layers with a padding mask); ``has_embeddings`` says whether the
    exported graph holds embedding tables (the int8 dynamic route quantizes them per row).
    """

    kind: str
    layer: str
    mask: str
    d_model: int
    heads: int
    has_embeddings: bool
    activation: str = "relu"  # the FFN's activation (ORT's BiasGelu fusion needs a GELU)
    score_bias: bool = False  # every layer adds a bias to its scores (MPNet, DeBERTa's relative positions): no long-seq form

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


@dataclass(frozen=True)
class SubjectKind:
    """One kind of subject: its flags, its measured defaults and the checks it needs before any work."""

    name: str
    flags: tuple[str, ...]
    defaults: Mapping[str, Any]  # measured best for this kind (docs/quantization.md, docs/encoder.md)
    calib_suffixes: tuple[str, ...]
    calib_hint: str  # why another --calib file kind is refused

    def check_flags(self, cfg: RunOptions) -> None:
        """This kind's flags are coherent; another kind's flags are refused by name."""
        foreign = dict.fromkeys(n for k in KINDS.values() for n in k.flags if n not in self.flags)
        given = [f"--{n.replace('_', '-')}" for n in foreign if getattr(cfg, n, None) is not None]
        if given:
            raise ConfigError(self.foreign_flags_message(cfg, given))
        suffix = Path(cfg.calib).suffix.lower() if cfg.calib is not None else ""
        if suffix and suffix not in self.calib_suffixes:  # no suffix (a folder, a device): check_paths looks at the file itself
            raise ConfigError(f"--calib {cfg.calib}: {self.calib_hint}")
        self.check_own_flags(cfg)

    def foreign_flags_message(self, cfg: RunOptions, given: list[str]) -> str:
        return f"{given[0]} does not apply to this subject; drop {', '.join(given)}"

    def check_own_flags(self, cfg: RunOptions) -> None:
        """Values of the kind's own flags (no files read)."""

    def profile(self, cfg: RunOptions) -> SubjectProfile:
        raise ConfigError(f"subject kind {self.name} has no profile")

    def judged_outputs(self, cfg: RunOptions) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(the outputs this subject's judge compares, the outputs it exports without judging them)."""
        raise ConfigError(f"subject kind {self.name} names no outputs")

    def check_tolerance_outputs(self, cfg: RunOptions) -> None:
        """``--atol/--rtol/--cosine-min OUTPUT:VALUE`` name outputs the judge compares (a bar on any other would be dropped)."""
        if cfg.tolerance_overrides:
            from attn_export.validate.tolerances import check_override_outputs

            judged, unjudged = self.judged_outputs(cfg)
            subject = f"--checkpoint {cfg.checkpoint}" if cfg.checkpoint is not None else f"the {cfg.resolved_layer} layer"
            check_override_outputs(cfg.tolerance_overrides, judged, subject, unjudged)

    def preflight(self, cfg: RunOptions) -> None:
        """Checks that read files, before the first model is built."""

    def model_shape(self, cfg: RunOptions) -> ModelShape:
        raise ConfigError(f"subject kind {self.name} has no model shape")


class LayerKind(SubjectKind):
    """``--layer`` at ``--d-model``/``--heads`` with ``--mask``: a seeded reference layer."""

    def __init__(self) -> None:
        super().__init__("layer", _LAYER_FLAGS,
                         {"layer": "transformer", "d_model": 512, "heads": 8, "mask": "padding", "low_rank_targets": "q,k,v,o",
                          "calib_method": "minmax", "smoothquant": None},
                         (".npz", ".npy", ".safetensors"),
                         "text calibrates a --checkpoint; a reference layer takes activations (.npz/.npy/.safetensors, see attn-export calib generate)")  # fmt: skip

    def foreign_flags_message(self, cfg: RunOptions, given: list[str]) -> str:
        return f"{given[0]} applies to a --checkpoint run; add --checkpoint DIR|minilm or drop {', '.join(given)}"

    def check_own_flags(self, cfg: RunOptions) -> None:
        layer, mask = cfg.resolved_layer, cfg.resolved_mask
        if layer not in LAYER_NAMES:
            raise ConfigError(f"unknown --layer {layer!r}; choose one of {', '.join(LAYER_NAMES)}")
        if mask not in LAYER_MASKS[layer]:
            raise ConfigError(f"layer {layer!r} supports --mask {'|'.join(LAYER_MASKS[layer])}, got {mask!r}")
        check_heads(cfg.resolved_d_model, cfg.resolved_heads)

    def judged_outputs(self, cfg: RunOptions) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ("y",), ()

    def profile(self, cfg: RunOptions) -> SubjectProfile:
        return SubjectProfile("layer", cfg.resolved_layer, cfg.resolved_mask, cfg.resolved_d_model, cfg.resolved_heads, False, "relu")

    def preflight(self, cfg: RunOptions) -> None:
        if cfg.compresses and cfg.calib is None:
            from attn_export.compress.calib.data import default_calibration_path

            default_calibration_path(cfg.resolved_d_model)  # DataError naming `calib generate` when none ships
        if cfg.calib is not None:
            from attn_export.compress.calib.files import check_arrays_file

            check_arrays_file(cfg.calib)  # its size and format before torch is imported; the run reads it with the same rule

    def model_shape(self, cfg: RunOptions) -> ModelShape:
        d, h = cfg.resolved_d_model, cfg.resolved_heads
        params = 4 * d * d + (2 * d * 4 * d if cfg.resolved_layer == "transformer" else 0)
        return ModelShape(d, h, 4 * d, params, cfg.resolved_layer)


class CheckpointKind(SubjectKind):
    """``--checkpoint DIR|minilm``: the whole encoder (``--layers all``) or layer N of it in context."""

    def __init__(self, name: str) -> None:
        # MiniLM: Q/K carry the low-rank budget (V/O/FFN cost more accuracy than they save); percentile
        # calibration after a searched SmoothQuant keeps both int8 routes closest on real text
        # (docs/quantization.md: static 0.978 -> 0.997, dynamic 0.991 -> 0.997 mean cosine).
        super().__init__(name, _CHECKPOINT_FLAGS,
                         {"layers": "all", "max_len": 64, "max_texts": 320, "low_rank_targets": "q,k", "calib_method": "percentile",
                          "smoothquant": "auto"},
                         (".txt", ""),
                         "a checkpoint calibrates on text; pass a UTF-8 .txt file with one text per line "
                         "(activation files .npz/.npy/.safetensors are for reference layers)")  # fmt: skip

    def foreign_flags_message(self, cfg: RunOptions, given: list[str]) -> str:
        return (f"{given[0]} picks a reference layer, but --checkpoint {cfg.checkpoint} brings its own architecture "
                f"(config.json); drop {', '.join(given)}")  # fmt: skip

    def check_own_flags(self, cfg: RunOptions) -> None:
        layers = cfg.resolved_layers.strip().lower()
        if layers != "all" and not is_ascii_digits(layers):
            raise ConfigError(f"expected --layers all or a layer index N (ASCII digits), got {cfg.layers!r}")
        if cfg.seq_len < 2:  # the latency input is tokenized to --seq-len tokens: [CLS] and [SEP] at least
            raise ConfigError(f"expected --seq-len >= 2 for a --checkpoint (the latency input holds [CLS] and [SEP] at least), got {cfg.seq_len}; "
                              "use --seq-len 2 or more")  # fmt: skip
        if cfg.pooling is not None:
            from attn_export.checkpoint.pooling import parse_pooling

            parse_pooling(cfg.pooling)
        if cfg.encoder_form is not None:
            from attn_export.vocab.choices import ENCODER_FORMS

            if cfg.encoder_form not in ("auto", *ENCODER_FORMS):
                raise ConfigError(f"expected --encoder-form in auto|{'|'.join(ENCODER_FORMS)}, got {cfg.encoder_form!r}")
            if self.name == "encoder-layer" and cfg.encoder_form == "packed":
                raise ConfigError(f"--encoder-form packed applies to the whole encoder (--layers all); layer {cfg.layers} runs on its "
                                  "(B, S, D) hidden states; drop --encoder-form")  # fmt: skip

    def judged_outputs(self, cfg: RunOptions) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """What the model's users read, judged against the user's model: a bare encoder's sentence embedding, a head's logits
        (``JUDGED_OUTPUT``); the rest (a head's pooled embedding, the hidden states, layer N's own ``y``) is exported but not
        judged (subjects/encoder.py)."""
        from attn_export.layers.encoder_config import JUDGED_OUTPUT

        task = checkpoint_task(cfg)
        judged = JUDGED_OUTPUT[task]
        exported = ("sentence_embedding", *(("logits",) if task is not None else ()), "last_hidden_state" if self.name == "encoder" else "y")
        return (judged,), tuple(o for o in exported if o != judged)

    def profile(self, cfg: RunOptions) -> SubjectProfile:
        conf = checkpoint_config(cfg)
        return SubjectProfile(self.name, "transformer", "padding", conf.hidden_size, conf.num_attention_heads, self.name == "encoder", conf.hidden_act,
                              score_bias=conf.score_bias)  # fmt: skip

    def preflight(self, cfg: RunOptions) -> None:
        from attn_export.layers.encoder_config import parse_layers

        conf = checkpoint_config(cfg)
        parse_layers(cfg.resolved_layers, conf.num_hidden_layers)
        positions = conf.max_tokens  # RoBERTa-style positions start at pad + 1: 514 positions hold 512 tokens
        if cfg.resolved_max_len > positions or cfg.seq_len > positions:
            raise ConfigError(
                f"expected --max-len and --seq-len <= {positions} (the tokens the checkpoint's positions cover), got {cfg.resolved_max_len} and {cfg.seq_len}"
            )
        if cfg.attention == "long-seq" and conf.relative_attention_buckets:
            raise ConfigError(f"--attention long-seq: expected a model without an attention score bias (the long-seq kernels take none), "
                              f"got {conf.family}'s relative position bias; use --attention decomposed or ort-contrib")
        from attn_export.checkpoint.config_file import resolve_checkpoint
        from attn_export.checkpoint.tokenizer_file import load_tokenizer

        folder = resolve_checkpoint(cfg.checkpoint)
        if os.path.lexists(folder / "tokenizer.json"):  # ids past the embedding matrix: refused before the model is built
            load_tokenizer(folder, conf.vocab_size)
        _check_text_settings(cfg)

    def model_shape(self, cfg: RunOptions) -> ModelShape:
        from attn_export.checkpoint.config_file import encoder_parameter_count

        conf = checkpoint_config(cfg)
        return ModelShape(conf.hidden_size, conf.num_attention_heads, conf.intermediate_size, encoder_parameter_count(conf))


def checkpoint_config(cfg: RunOptions) -> Any:
    """The checkpoint's EncoderConfig, read and schema-checked once per RunConfig (no weights loaded)."""
    cached = cfg.__dict__.get("_checkpoint_config")
    if cached is None:
        from attn_export.checkpoint.config_file import read_bert_config, resolve_checkpoint

        cached = read_bert_config(resolve_checkpoint(cfg.checkpoint))  # type: ignore[arg-type]
        cfg.__dict__["_checkpoint_config"] = cached
    return cached


def checkpoint_task(cfg: RunOptions) -> str | None:
    """The checkpoint's head task (sequence|token) or None (bare): config.json's ``architectures`` decide it without torch;
    a config.json without them is decided by the weights' key names (safetensors headers, no tensor data)."""
    from attn_export.checkpoint.config_file import read_checkpoint_config, resolve_checkpoint
    from attn_export.checkpoint.families.base import task_from_architectures

    path = resolve_checkpoint(cfg.checkpoint)  # type: ignore[arg-type]
    _family, _config, raw = read_checkpoint_config(path)
    given, task = task_from_architectures(raw, str(path / "config.json"))
    if given:
        return task
    from attn_export.checkpoint.loader import read_head

    head = read_head(path)
    return None if head is None else head.task


KINDS: dict[str, SubjectKind] = {k.name: k for k in (LayerKind(), CheckpointKind("encoder"), CheckpointKind("encoder-layer"))}


def kind_of(cfg: RunOptions) -> SubjectKind:
    """The kind of subject ``cfg`` names: a reference layer, a checkpoint, or layer N of one."""
    if cfg.checkpoint is None:
        return KINDS["layer"]
    layers = (cfg.layers or "all").strip().lower()
    return KINDS["encoder" if layers == "all" else "encoder-layer"]


def _check_text_settings(cfg: RunOptions) -> None:
    """The sentence-transformers pipeline (modules.json) and its prompt (``--prompt``), and the --calib text count: no torch."""
    from attn_export.checkpoint.config_file import resolve_checkpoint
    from attn_export.checkpoint.pooling import read_sentence_transformers
    from attn_export.checkpoint.prompts import resolve_prompt

    path = resolve_checkpoint(cfg.checkpoint)  # type: ignore[arg-type]
    info = read_sentence_transformers(path)  # an unknown module type or a pipeline without Pooling: one line, nothing imported
    if info is None and cfg.prompt is not None and cfg.prompt.strip().lower() not in ("", "none"):
        raise ConfigError(f"--prompt {cfg.prompt} names a sentence-transformers prompt, but {path} has no sentence-transformers files "
                          "(modules.json); drop --prompt")  # fmt: skip
    resolve_prompt(path, cfg.prompt, include_prompt=True if info is None else info.include_prompt)
    if cfg.calib is not None:
        from attn_export.subjects.text_data import read_text_file

        read_text_file(cfg.calib)  # fewer than the minimum of distinct lines: refused before torch is imported
