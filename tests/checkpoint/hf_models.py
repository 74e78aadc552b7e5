"""Tiny random-init encoders built and saved by transformers itself, and a padded probe batch.

The checkpoints are written with ``save_pretrained`` (safetensors), so the weight names,
prefixes and config keys are the library's, not the loader's idea of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attn_export.runtime import EagerRunner
from attn_export.runtime.base import Feed, Runner

SIZES = dict(vocab_size=100, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, max_position_embeddings=64)
DISTIL_SIZES = dict(vocab_size=100, dim=32, n_heads=4, n_layers=2, hidden_dim=64, max_position_embeddings=64)
ROBERTA_LIKE = dict(type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5)  # as the released checkpoints ship

# name -> (config class, model class, config kwargs)
MODELS: dict[str, tuple[str, str, dict]] = {
    "bert": ("BertConfig", "BertModel", SIZES),
    "roberta": ("RobertaConfig", "RobertaModel", {**SIZES, **ROBERTA_LIKE}),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", {**SIZES, **ROBERTA_LIKE}),
    "camembert": ("CamembertConfig", "CamembertModel", {**SIZES, "pad_token_id": 1}),  # type_vocab_size absent: default 2
    "distilbert": ("DistilBertConfig", "DistilBertModel", DISTIL_SIZES),
    "electra": ("ElectraConfig", "ElectraModel", {**SIZES, "embedding_size": 16}),
    "bert-seq": ("BertConfig", "BertForSequenceClassification", {**SIZES, "num_labels": 3}),
    "roberta-seq": ("RobertaConfig", "RobertaForSequenceClassification", {**SIZES, **ROBERTA_LIKE, "num_labels": 3}),
    "distilbert-seq": ("DistilBertConfig", "DistilBertForSequenceClassification", {**DISTIL_SIZES, "num_labels": 2}),
    "electra-seq": ("ElectraConfig", "ElectraForSequenceClassification", {**SIZES, "embedding_size": 16, "num_labels": 4}),
    "bert-token": ("BertConfig", "BertForTokenClassification", {**SIZES, "num_labels": 5}),
    "bert-rerank": ("BertConfig", "BertForSequenceClassification", {**SIZES, "num_labels": 1}),  # a [CLS] A [SEP] B [SEP] cross-encoder
    "xlm-roberta-rerank": ("XLMRobertaConfig", "XLMRobertaForSequenceClassification", {**SIZES, **ROBERTA_LIKE, "num_labels": 1}),  # a cross-encoder
    "xlm-roberta-token": ("XLMRobertaConfig", "XLMRobertaForTokenClassification", {**SIZES, **ROBERTA_LIKE, "num_labels": 5}),
}


def transformers_module():
    return pytest.importorskip("transformers", reason="the reference is transformers' own model: pip install transformers")


def build(name: str, seed: int = 0, **overrides):
    """A random-init transformers model with LayerNorms and heads scaled away from their init (so a swapped key shows)."""
    T = transformers_module()
    config_cls, model_cls, kwargs = MODELS[name]
    torch.manual_seed(seed)
    model = getattr(T, model_cls)(getattr(T, config_cls)(**{**kwargs, **overrides})).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "LayerNorm" in pname or "layer_norm" in pname:
                p.add_(0.1 * torch.randn_like(p))
            elif "classifier" in pname or "pooler" in pname:
                p.mul_(20.0)  # logits of a few units, not ~1e-2: label agreement means something
    return model


def save(model, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))  # safetensors by default
    return folder


SMALL_RUN = dict(max_len=32, seq_len=16, batch=2, threads=1, max_texts=16)  # RunConfig fields of a quick subject over a tiny checkpoint


def saved_with_wordpiece(name: str, folder: Path) -> Path:
    """``build(name)`` saved in ``folder`` beside a small real WordPiece tokenizer.json (its vocabulary sizes the model)."""
    from fixtures import wordpiece_tokenizer

    return save(build(name, vocab_size=wordpiece_tokenizer(folder)), folder)


def probe(pad_id: int, vocab: int = 100, lengths: tuple[int, ...] = (20, 9, 5, 1), seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """input_ids (B, S) and attention_mask with rows of ``lengths`` real tokens, pads = ``pad_id``."""
    g = np.random.default_rng(seed)
    seq = max(lengths)
    mask = (np.arange(seq)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    ids = g.integers(3, vocab, size=mask.shape)
    return np.where(mask == 1, ids, pad_id).astype(np.int64), mask


def hf_forward(model, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(last hidden state, logits or None) of transformers' own forward."""
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True)
    logits = getattr(out, "logits", None)
    return out.hidden_states[-1].numpy(), None if logits is None else logits.numpy()


def agreement(ref: np.ndarray, got: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """(min per-row cosine, max abs) over real tokens (per-token arrays) or rows."""
    if ref.ndim == 3:
        keep = mask.astype(bool)
        ref, got = ref[keep], got[keep]
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    cos = (ref * got).sum(-1) / np.maximum(np.linalg.norm(ref, axis=-1) * np.linalg.norm(got, axis=-1), 1e-30)
    return float(cos.min()), float(np.abs(ref - got).max())


MIN_COSINE, MAX_ABS = 0.9999, 1e-4  # the fp32 bar against transformers: two float32 implementations of the same maths


def assert_close(ref: np.ndarray, got: np.ndarray, mask: np.ndarray, what: str) -> tuple[float, float]:
    """The fp32 bar on real tokens (per-token arrays) or rows: min cosine >= 0.9999 and max abs <= 1e-4; returns both figures."""
    cos, err = agreement(ref, got, mask)
    assert cos >= MIN_COSINE and err <= MAX_ABS, f"{what}: cosine {cos:.7f}, max abs {err:.2e}"
    return cos, err


def assert_matches_transformers(ref: tuple[np.ndarray, np.ndarray | None], got: list[np.ndarray], mask: np.ndarray, what: str) -> None:
    """Our (hidden, sentence embedding[, logits]) against transformers' (hidden, logits or None): the bar, and the same labels."""
    ref_hidden, ref_logits = ref
    assert_close(ref_hidden, got[0], mask, f"{what} hidden states")
    if ref_logits is None:
        assert len(got) == 2, f"{what}: a bare encoder exports no logits"
        return
    assert_close(ref_logits, got[2], mask, f"{what} logits")
    keep = mask.astype(bool) if ref_logits.ndim == 3 else slice(None)  # a token head's labels on real tokens only
    assert np.array_equal(ref_logits[keep].argmax(-1), got[2][keep].argmax(-1)), f"{what}: labels differ"


def assert_onnx_matches_transformers(session: Any, hf: Any, batches: list[tuple[np.ndarray, np.ndarray]], what: str) -> None:
    """An exported encoder's ONNX Runtime session against transformers' own forward on each (ids, mask) batch: hidden
    states, and logits when the model has a head, at the fp32 bar on real tokens."""
    for ids, mask in batches:
        out = session.run(None, {"input_ids": ids, "attention_mask": mask})
        ref_hidden, ref_logits = hf_forward(hf, ids, mask)
        assert_close(ref_hidden, out[0], mask, f"{what} ONNX hidden states {mask.sum(1)}")
        if ref_logits is not None:
            assert_close(ref_logits, out[2], mask, f"{what} ONNX logits {mask.sum(1)}")


def assert_trt_parsable(path: Path, versions: tuple[str, ...] = ("10.3", "11.4")) -> None:
    """A decomposed fp32 export passes check-trt for JetPack 6's TensorRT 10.3 and the newest release the tables know.

    Every family's position and bias maths must use ops and dtypes TensorRT's ONNX parser takes: RoBERTa-style
    positions were once an int64 CumSum and MPNet's buckets an int64 Clip, refused for every release. Cheap (no
    export of its own): the families' ONNX tests call it on the file they exported anyway.
    """
    from attn_export.checks.trt_compat import check_trt_compat
    from attn_export.runtime.tensorrt.spec import ShapeProfile

    for version in versions:
        report = check_trt_compat(path, version, ShapeProfile((1, 1), (8, 64), (32, 128)), "fp32")
        assert not report.errors, f"{path.name} for TensorRT {version}:\n{report}"


def model_cache(tmp_path_factory, build_model):
    """name -> (transformers model, its saved folder), each built once: a module-scoped fixture's body."""
    cache: dict[str, tuple[object, Path]] = {}

    def get(name: str):
        if name not in cache:
            model = build_model(name)
            cache[name] = (model, save(model, tmp_path_factory.mktemp(name)))
        return cache[name]

    return get


def ours_forward(model, ids: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """Our encoder's outputs on numpy inputs, without autograd."""
    with torch.no_grad():
        return [t.numpy() for t in model(torch.from_numpy(ids), torch.from_numpy(mask))]

def char_tokenizer(folder: Path, specials: list[str], cls: str, sep: str, unk: str, pad: tuple[int, str] | None = None) -> int:
    """A character-level WordPiece tokenizer.json in ``folder`` whose first ids are ``specials`` (the family's own
    special tokens, in its id order), wrapping a text as ``cls $A sep``; returns its size (the config's ``vocab_size``)."""
    import string

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    chars = sorted(set(string.ascii_lowercase + string.digits + string.punctuation))
    vocab = {w: i for i, w in enumerate([*specials, *chars, *(f"##{c}" for c in chars)])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single=f"{cls} $A {sep}", special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    if pad is not None:
        tok.enable_padding(pad_id=pad[0], pad_token=pad[1])
    tok.save(str(folder / "tokenizer.json"))
    return len(vocab)


class Altered(Runner):
    """The eager encoder with its outputs changed by ``change(feed, outputs)``: an artifact whose errors are chosen."""

    name = "altered"

    def __init__(self, subject: Any, change: Any) -> None:
        super().__init__()
        self.eager = EagerRunner(subject.encoder, subject.input_names, subject.output_names)
        self.change = change

    @property
    def input_names(self) -> list[str]:
        return self.eager.input_names

    @property
    def output_names(self) -> list[str]:
        return self.eager.output_names

    def _activate(self) -> None:
        self.eager.activate()

    def _infer(self, feed: Feed) -> dict[str, np.ndarray]:
        out = {k: np.array(v, dtype=np.float32) for k, v in self.eager.infer(feed).items()}
        self.change(feed, out)
        return out
