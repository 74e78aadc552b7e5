"""The reference is the user's model: the checkpoint as its own library runs it.

The project's ``SentenceEncoder`` is a re-implementation; judged only against itself, a wrong
one passes (issue 19: RoBERTa without its position offset reported PASS at token cosine
0.015). So the eager reference of a checkpoint is built by the field's libraries from the
folder itself, with local files only (no hub) and no remote code:

- transformers' ``AutoModel`` (``AutoModelForSequenceClassification`` /
  ``AutoModelForTokenClassification`` for a head), ``attn_implementation="eager"``, float32:
  ``last_hidden_state`` and ``logits``;
- where the folder has sentence-transformers files (``modules.json``), the full
  ``SentenceTransformer`` pipeline (Transformer -> Pooling -> Normalize) for
  ``sentence_embedding`` (and ``last_hidden_state``, its ``token_embeddings``). A
  ``--pooling`` override swaps the pipeline's Pooling module for sentence-transformers' own
  ``Pooling`` with that mode, so the formula is still the library's;
- a plain Hugging Face folder ships no pooling: its ``sentence_embedding`` is the documented
  default (``attn_export.layers.pooling``) applied to transformers' hidden states.

transformers and sentence-transformers are imported lazily; without them this is a
``MissingDependencyError`` with the pip command.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attn_export.host.lazy import require
from attn_export.host.quiet import quiet_loggers
from attn_export.errors import CheckpointError
from attn_export.layers.pooling import PoolingConfig, pool

__all__ = ["LibraryReference", "ReferenceOutputs", "load_reference"]

log = logging.getLogger(__name__)

_WHAT = "transformers (the checkpoint's own library, which attn-export uses as the reference)"
_ST_WHAT = "sentence-transformers (this checkpoint's own pipeline, which attn-export uses as the reference)"


@dataclass(frozen=True)
class ReferenceOutputs:
    """One batch through the library's model, as numpy float32."""

    last_hidden_state: np.ndarray  # (B, S, D)
    sentence_embedding: np.ndarray  # (B, D')
    logits: np.ndarray | None  # (B, L) or (B, S, L) with a head


class LibraryReference:
    """transformers' model (and sentence-transformers' pipeline) for one checkpoint folder."""

    def __init__(self, checkpoint_dir: str | os.PathLike[str], pooling: PoolingConfig, task: str | None = None) -> None:
        self.path = Path(checkpoint_dir)
        self.pooling = pooling
        self.task = task
        with _quiet_loading():
            self.model = _transformers_model(self.path, task)
            self.pipeline = _sentence_transformer(self.path, pooling) if (self.path / "modules.json").is_file() else None
        if self.pipeline is not None and task is None:
            self.model = None  # the pipeline's Transformer module is the same AutoModel: load it once
        auto = self.model if self.model is not None else getattr(self.pipeline[0], "model", None)  # type: ignore[index]
        self.takes_token_types = auto is not None and "token_type_ids" in inspect.signature(auto.forward).parameters  # not DistilBERT
        self._auto = auto  # transformers' model itself (inside the pipeline when there is one): ``attentions`` reads it
        # what SentenceTransformer.encode applies before the model: the token limit (None: a plain folder) and the prompts
        self.max_seq_length: int | None = getattr(self.pipeline, "max_seq_length", None) if self.pipeline is not None else None
        self.prompts: dict[str, str] = dict(getattr(self.pipeline, "prompts", None) or {}) if self.pipeline is not None else {}
        self.default_prompt_name: str | None = getattr(self.pipeline, "default_prompt_name", None) if self.pipeline is not None else None
        cls = type(auto).__name__
        self.description = f"transformers {cls} (eager)" + (
            f" + sentence-transformers pipeline (pooling {pooling.name})" if self.pipeline is not None else f" + pooling {pooling.name} ({pooling.source})"
        )

    @torch.no_grad()
    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids: np.ndarray | None = None) -> ReferenceOutputs:
        feed: dict[str, torch.Tensor] = {
            "input_ids": torch.as_tensor(np.asarray(input_ids), dtype=torch.int64),
            "attention_mask": torch.as_tensor(np.asarray(attention_mask), dtype=torch.int64),
        }
        if token_type_ids is not None and self.takes_token_types:
            feed["token_type_ids"] = torch.as_tensor(np.asarray(token_type_ids), dtype=torch.int64)
        hidden, logits, embedding = None, None, None
        if self.model is not None:
            out = self.model(**feed, output_hidden_states=self.task is not None)
            hidden = out.hidden_states[-1] if self.task is not None else out.last_hidden_state  # (B, S, D)
            logits = getattr(out, "logits", None)
        if self.pipeline is not None:
            features = self.pipeline(dict(feed))
            embedding = features["sentence_embedding"]  # (B, D')
            hidden = features["token_embeddings"] if hidden is None else hidden
        if embedding is None:  # hidden is set: either the model or the pipeline ran
            embedding = pool(hidden, feed["attention_mask"], self.pooling.modes, self.pooling.normalize)  # type: ignore[arg-type]
        return ReferenceOutputs(
            last_hidden_state=hidden.float().numpy(),  # type: ignore[union-attr]
            sentence_embedding=embedding.float().numpy(),
            logits=None if logits is None else logits.float().numpy(),
        )


    @torch.no_grad()
    def attentions(self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids: np.ndarray | None = None) -> list[np.ndarray]:
        """Every layer's attention probabilities (B, H, S, S), float32, from transformers' eager attention
        (``output_attentions=True``): what the report's attention maps compare an export against."""
        auto = self._auto
        if auto is None:
            raise CheckpointError(f"{self.description} exposes no transformers model to read attention probabilities from")
        feed = {"input_ids": torch.as_tensor(np.asarray(input_ids), dtype=torch.int64),
                "attention_mask": torch.as_tensor(np.asarray(attention_mask), dtype=torch.int64)}  # fmt: skip
        if token_type_ids is not None and self.takes_token_types:
            feed["token_type_ids"] = torch.as_tensor(np.asarray(token_type_ids), dtype=torch.int64)
        out = auto(**feed, output_attentions=True)
        return [a.float().numpy() for a in out.attentions or ()]


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """transformers' weight-loading bars off and torchao's CUDA-only import notices hidden, then restored:
    a CI log gets no progress redraws, and nothing the user cannot act on."""
    try:  # first: importing it sets up its logger (level, handler), which would replace what quiet_loggers sets
        from transformers.utils import logging as hf_logging

        hf_logging.get_logger()
    except ImportError:  # _transformers_model says which package to install
        hf_logging = None
    with quiet_loggers(("torchao", "torch.utils._pytree", "transformers", "sentence_transformers")):
        if hf_logging is None:
            yield
            return
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            yield
        finally:
            if bars:
                hf_logging.enable_progress_bar()


def _transformers_model(path: Path, task: str | None) -> Any:
    transformers = require("transformers", "transformers", _WHAT)  # a dependency; missing only in a broken install
    from attn_export.checkpoint.loader import read_checkpoint_config

    raw = read_checkpoint_config(path)[2]  # schema-checked, the family supported (or refused, in one line)
    auto = {None: transformers.AutoModel, "sequence": transformers.AutoModelForSequenceClassification,
            "token": transformers.AutoModelForTokenClassification}[task]  # fmt: skip
    kwargs: dict[str, Any] = {"local_files_only": True, "attn_implementation": "eager", "dtype": torch.float32}
    if "model_type" not in raw:  # very old BERT exports: the loader read them as BERT, so does the reference
        kwargs["config"] = transformers.BertConfig.from_pretrained(str(path), local_files_only=True)
    try:
        model = auto.from_pretrained(str(path), **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"transformers could not load {path} as {auto.__name__} ({first}); the reference needs the checkpoint's own library to load it") from err
    return model.eval()


def _sentence_transformer(path: Path, pooling: PoolingConfig) -> Any:
    st = require("sentence_transformers", "sentence-transformers", _ST_WHAT)
    try:
        pipeline = st.SentenceTransformer(str(path), device="cpu", local_files_only=True, trust_remote_code=False,
                                          model_kwargs={"attn_implementation": "eager", "dtype": torch.float32})  # fmt: skip
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"sentence-transformers could not load {path} ({first}); the reference needs the model's own pipeline") from err
    if pooling.source == "--pooling":  # the library's own Pooling class, with the overriding mode
        for name, module in pipeline.named_children():
            if type(module).__name__ == "Pooling":
                dim = getattr(module, "embedding_dimension", None) or module.word_embedding_dimension
                modes = pooling.modes[0] if len(pooling.modes) == 1 else pooling.modes
                pipeline._modules[name] = type(module)(dim, pooling_mode=modes)
    return pipeline.eval()


def load_reference(checkpoint_dir: str | os.PathLike[str], pooling: PoolingConfig | None = None, task: str | None = None) -> LibraryReference:
    """The library reference of a checkpoint folder; ``pooling`` and ``task`` as the loaded ``SentenceEncoder`` has them."""
    return LibraryReference(checkpoint_dir, pooling or PoolingConfig(), task)
