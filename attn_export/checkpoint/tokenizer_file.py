"""A checkpoint's ``tokenizer.json``, read with ``tokenizers`` alone (no torch, no ``transformers``).

Flag validation loads it before any model is built (``subjects.kinds``), so a tokenizer that
cannot feed the model is refused in a second: a FIFO or a device under its name, a link out
of the checkpoint, a file past ``TOKENIZER_MAX_BYTES``, or one that can emit a token id the
embedding matrix has no row for (a 30k-token vocabulary on a ``vocab_size: 1000`` config, an
``[UNK]`` at id 40000, added tokens past the vocabulary), which would otherwise end in an
IndexError in the first forward or an InvalidArgument in ONNX Runtime's Gather.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from attn_export.errors import CheckpointError, DataError

__all__ = ["check_token_ids", "load_tokenizer", "pad_id"]

log = logging.getLogger(__name__)


def load_tokenizer(checkpoint_dir: str | os.PathLike[str], vocab_size: int | None = None) -> Any:
    """``tokenizers.Tokenizer`` from the checkpoint's ``tokenizer.json`` (no ``transformers``).

    The file must be a regular file (a FIFO or a device is named from its ``stat``, never
    opened) resolving inside the checkpoint, of at most ``TOKENIZER_MAX_BYTES`` (``fstat``,
    before it is read). With ``vocab_size`` (config.json's: the rows of the model's embedding
    matrix), a tokenizer that can emit an id the model has no row for is refused
    (``check_token_ids``), instead of an IndexError in the first forward.
    """
    from tokenizers import Tokenizer

    from attn_export.checkpoint.paths import TOKENIZER_MAX_BYTES, inside, regular_stat

    folder = Path(checkpoint_dir)
    path = folder / "tokenizer.json"
    try:
        st = path.stat()  # follows a link, never opens
    except FileNotFoundError:
        raise DataError(f"expected {path}; export a fast tokenizer with tokenizer.save_pretrained(dir) next to the weights") from None
    except OSError as err:
        raise DataError(f"{path} cannot be inspected ({err.strerror or err}); fix the checkpoint's tokenizer.json") from None
    regular_stat(path, st, None)
    inside(folder, "tokenizer.json", "tokenizer")
    try:
        with path.open("rb") as handle:
            regular_stat(path, os.fstat(handle.fileno()), TOKENIZER_MAX_BYTES)
            text = handle.read(TOKENIZER_MAX_BYTES + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path} is not a readable tokenizer.json ({err}); re-save it with tokenizers") from None
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
        raise DataError(f"{path} is not a readable tokenizer.json ({err}); re-save it with tokenizers") from err
    if vocab_size is not None:
        check_token_ids(tokenizer, vocab_size, str(path))
    return tokenizer


def check_token_ids(tokenizer: Any, vocab_size: int, source: str = "tokenizer.json") -> None:
    """Refuse a tokenizer that can emit an id >= ``vocab_size``: its vocabulary with added tokens, the special
    tokens its post-processor adds and its padding id must all index a row of the embedding matrix."""
    added = {int(i) for i in tokenizer.get_added_tokens_decoder()}
    where = {int(i): f"{token!r}" + (", an added token" if int(i) in added else "") for token, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    for i in tokenizer.encode("").ids:  # what tokenize() gets around every text
        where.setdefault(int(i), f"{tokenizer.id_to_token(i)!r}, a special token the post-processor adds")
    where.setdefault(pad_id(tokenizer), "the padding id")
    worst = max(where, default=-1)
    if worst >= vocab_size:
        out = sum(i >= vocab_size for i in where)
        fix = ("resize the model to the tokenizer (model.resize_token_embeddings(len(tokenizer))) and re-save both, or drop the added tokens"
               if worst in added else "use the tokenizer saved with this model")  # fmt: skip
        raise CheckpointError(
            f"{source}: expected token ids < {vocab_size} (config.json vocab_size, the rows of the embedding matrix), got id {worst} "
            f"({where[worst]}; {out} id{'s' if out > 1 else ''} out of range); {fix}"
        )


def pad_id(tokenizer: Any) -> int:
    """The id padded positions hold: the tokenizer's own padding id, else its [PAD] / <pad> token, else 0."""
    padding = tokenizer.padding
    if padding and "pad_id" in padding:
        return int(padding["pad_id"])
    for token in ("[PAD]", "<pad>"):  # BERT-style, then RoBERTa/XLM-R-style vocabularies (where id 0 is <s>)
        pad = tokenizer.token_to_id(token)
        if pad is not None:
            return int(pad)
    return 0
