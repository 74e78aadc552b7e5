"""The text a sentence-transformers model really encodes: its prompt, prepended, and its length.

``SentenceTransformer.encode(texts)`` does not encode ``texts``: when
``config_sentence_transformers.json`` sets ``default_prompt_name`` (E5/BGE-style models ship
``{"query": "query: "}``), it prepends that prompt to every text before tokenization, and it
truncates to the model's ``max_seq_length`` tokens (special tokens included). A pipeline that
judged and calibrated on the bare texts judged another input than the one the model is used
on (issue 28: cosine 0.929 against ``encode`` with a default prompt, 0.952 with
``max_seq_length 8``).

``read_prompts`` reads the prompts (no torch); ``resolve_prompt`` picks one as
sentence-transformers does: ``--prompt NAME`` (a key of ``prompts``), ``--prompt ''`` (no
prompt, as ``encode(prompt="")``), else the default prompt, else none. The subject then
prepends ``TextPrompt.text`` to every text it tokenizes (``TextPrompt.apply``), so the
reference, the calibration data and the judged data are what ``encode`` sees.

A Pooling module with ``include_prompt: false`` pools without the prompt's tokens; the
exported graph has no notion of a prompt length, so that model is refused by name when a
prompt applies.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from attn_export.checkpoint.paths import inside
from attn_export.errors import CheckpointError, ConfigError
from attn_export.validate.schema import StrictSchema

__all__ = ["NO_PROMPT", "TextPrompt", "check_library_prompt", "effective_max_len", "lower_case_", "read_prompts", "resolve_prompt"]

log = logging.getLogger(__name__)

CONFIG_NAME = "config_sentence_transformers.json"
NO_PROMPT = ("", "none")  # --prompt '' or --prompt none: no prompt (sentence-transformers' encode(prompt=""))
_FIX = "fix the file or re-save the model with sentence-transformers"


class StModelConfigSchema(StrictSchema):
    """``config_sentence_transformers.json``: the prompts (name -> text) and the default prompt's name."""

    prompts: Annotated[dict[Annotated[str, Field(max_length=256)], Annotated[str, Field(max_length=4096)]], Field(max_length=256)] = {}
    default_prompt_name: Annotated[str, Field(max_length=256)] | None = None


@dataclass(frozen=True)
class TextPrompt:
    """The prompt prepended to every text (``""``: none), its name and where the choice came from."""

    text: str = ""
    name: str | None = None
    source: str = "none"

    def apply(self, texts: Sequence[str]) -> list[str]:
        """``prompt + text`` for each text, as sentence-transformers' Transformer module does before tokenizing."""
        return [self.text + t for t in texts]

    def to_dict(self) -> dict[str, str | None]:
        return {"text": self.text, "name": self.name, "source": self.source}


def read_prompts(checkpoint_dir: str | os.PathLike[str]) -> tuple[dict[str, str], str | None]:
    """The folder's prompts and default prompt name ({} and None without the file)."""
    from attn_export.validate.schema import read_json, validate

    root = Path(checkpoint_dir)
    if not (root / CONFIG_NAME).exists() and not (root / CONFIG_NAME).is_symlink():
        return {}, None
    path = inside(root, CONFIG_NAME, "sentence-transformers config")
    from attn_export.host.paths import check_regular_file

    check_regular_file(path, "checkpoint file", CheckpointError)
    cfg = validate(StModelConfigSchema, read_json(path, "a config_sentence_transformers.json", _FIX, error=CheckpointError), str(path), _FIX,
                   error=CheckpointError)  # fmt: skip
    if cfg.default_prompt_name is not None and cfg.default_prompt_name not in cfg.prompts:
        raise CheckpointError(
            f"{path}: default_prompt_name {cfg.default_prompt_name!r} is not one of its prompts ({_names(cfg.prompts)}); "
            "add the prompt or drop default_prompt_name"
        )
    return dict(cfg.prompts), cfg.default_prompt_name


def _names(prompts: dict[str, str]) -> str:
    return ", ".join(sorted(prompts)) if prompts else "none"


def resolve_prompt(checkpoint_dir: str | os.PathLike[str], choice: str | None = None, include_prompt: bool = True) -> TextPrompt:
    """The prompt ``encode`` applies: ``choice`` (``--prompt``) when given, else the model's default prompt."""
    prompts, default = read_prompts(checkpoint_dir)
    if choice is not None and choice not in prompts and choice.strip().lower() in NO_PROMPT:
        return TextPrompt("", None, "--prompt '' (no prompt)")
    if choice is not None:
        if choice not in prompts:
            raise ConfigError(
                f"expected --prompt to name one of the model's prompts ({_names(prompts)}) or '' for none, got {choice!r}; "
                f"the prompts are in {Path(checkpoint_dir) / CONFIG_NAME}"
            )
        prompt = TextPrompt(prompts[choice], choice, f"--prompt {choice}")
    elif default is not None:
        prompt = TextPrompt(prompts[default], default, f"default_prompt_name {default!r} ({CONFIG_NAME})")
    else:
        return TextPrompt()
    if prompt.text and not include_prompt:
        raise CheckpointError(
            f"{checkpoint_dir}: the Pooling module sets include_prompt false (the prompt's tokens are left out of the pooling), which "
            f"the exported graph cannot reproduce with prompt {prompt.text!r}; pass --prompt '' or re-save the Pooling with include_prompt true"
        )
    return prompt


def check_library_prompt(prompt: TextPrompt, choice: str | None, prompts: dict[str, str], default: str | None, where: str) -> None:
    """The prompt read from the files is the one sentence-transformers' loaded pipeline applies; else one line."""
    expected = "" if choice is not None and prompt.name is None else prompts.get(choice if choice is not None else default or "", "")
    if expected != prompt.text:
        raise CheckpointError(f"{where}: sentence-transformers applies the prompt {expected!r}, but {CONFIG_NAME} reads as {prompt.text!r}; "
                              f"re-save the model with sentence-transformers")  # fmt: skip


def effective_max_len(max_len: int, model_max: int | None) -> tuple[int, str | None]:
    """The token limit the data is cut to: ``--max-len``, lowered to the model's ``max_seq_length`` (as ``encode`` truncates)."""
    if model_max is None or max_len <= model_max:
        return max_len, None
    return model_max, (f"max_len {max_len} lowered to {model_max}: sentence-transformers truncates this model's texts to its max_seq_length "
                       f"({model_max} tokens, special tokens included), so the data and the reference are cut there too")  # fmt: skip


def lower_case_(tokenizer: Any) -> bool:
    """``do_lower_case: true`` (sentence_bert_config.json) as sentence-transformers applies it: a ``Lowercase`` normalizer
    put in front of the tokenizer's own, unless it already has one. Returns whether the tokenizer changed."""
    from tokenizers.normalizers import Lowercase
    from tokenizers.normalizers import Sequence as NormalizerSequence

    current = tokenizer.normalizer
    if isinstance(current, Lowercase) or (isinstance(current, NormalizerSequence) and any(isinstance(n, Lowercase) for n in current)):
        return False
    tokenizer.normalizer = NormalizerSequence([Lowercase(), *(current if isinstance(current, NormalizerSequence) else [current] if current else [])])
    return True
