"""Toy layers and inputs shared by the tests (small shapes so the suite stays fast)."""

from __future__ import annotations

import numpy as np
import torch

from attn_export.layers import LAYERS, MaskedLayer, build_layer

D_MODEL = 64
HEADS = 4

LAYER_MASKS: list[tuple[str, str]] = [(name, m) for name, info in LAYERS.items() for m in info.masks]


def small_layer(name: str = "transformer", mask: str = "none", d_model: int = D_MODEL, heads: int = HEADS, **kw) -> MaskedLayer:
    kw.setdefault("block_size", 8)
    kw.setdefault("window", 3)
    return MaskedLayer(build_layer(name, d_model, heads, mask=mask, **kw), mask)


def padding_mask(batch: int, seq: int, seed: int = 0, fully_masked_row: int | None = None) -> np.ndarray:
    """(B, L) int32, 1 = keep, with random padded tails; optionally one all-padding sequence."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, seq // 3), seq + 1, size=batch)
    lengths[0] = seq  # at least one unpadded sequence
    kpm = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    if fully_masked_row is not None:
        kpm[fully_masked_row] = 0
    return kpm


def feed_for(layer: MaskedLayer, batch: int, seq: int, seed: int = 0, fully_masked_row: int | None = None, d_model: int = D_MODEL) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feed = {"x": rng.standard_normal((batch, seq, d_model)).astype(np.float32)}
    if layer.mask == "padding":
        feed["key_padding_mask"] = padding_mask(batch, seq, seed, fully_masked_row)
    return feed


def eager(layer: MaskedLayer, feed: dict[str, np.ndarray]) -> np.ndarray:
    args = [torch.from_numpy(feed[n]) for n in layer.input_names]
    with torch.no_grad():
        return layer(*args).numpy()


def deploy_u8u8() -> bool:
    """Whether int8 sessions on this CPU need ONNX Runtime's U8U8 option, as ``--int8-encoding auto``
    decides for the product (x86 without VNNI: the U8S8 kernel saturates). Tests run int8 models the
    way the report tells a deployment on this CPU to run them, so they hold on AVX2 and VNNI alike."""
    from attn_export.compress.quant.int8_encoding import choose_cpu_encoding

    return choose_cpu_encoding("auto").session_u8u8


def run_onnx(path: str, feed: dict[str, np.ndarray], dtype=np.float32) -> np.ndarray:
    import onnxruntime as ort

    from attn_export.compress.quant.int8_encoding import U8U8_SESSION_OPTION

    so = ort.SessionOptions()
    if deploy_u8u8():
        so.add_session_config_entry(*U8U8_SESSION_OPTION)
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    cast = {k: (v.astype(dtype) if v.dtype == np.float32 else v) for k, v in feed.items() if k in names}
    return sess.run(None, cast)[0].astype(np.float32)


def small_layer_subject(tmp):  # type: ignore[no-untyped-def]
    """A 64-wide TransformerLayer subject with 30 calibration (24 train / 6 select) and 8 report sequences of 16 tokens."""
    from attn_export.compress.calib.generate import synthesize_hidden_states
    from attn_export.config.run import RunConfig
    from attn_export.subjects.layer import LayerSubject

    x, kpm = synthesize_hidden_states(38, 16, D_MODEL, np.random.default_rng(0))
    np.savez(tmp / "acts.npz", calib_x=x[:30], calib_key_padding_mask=kpm[:30], val_x=x[30:], val_key_padding_mask=kpm[30:])
    cfg = RunConfig(quantize="int8", d_model=D_MODEL, heads=HEADS, calib=tmp / "acts.npz", out=tmp / "out", seq_len=16, batch=4, threads=1)
    return LayerSubject(cfg)


# --- a tiny sentence-transformers model, saved by sentence-transformers itself ----------------------
ST_WORDS = ("the", "a", "query", "passage", "cat", "dog", "sat", "on", "mat", "is", "was", "of", "and", "to", "in", "red", "blue", "big")


def st_checkpoint(folder, prompts=None, default_prompt_name=None, max_seq_length=None, seed=0, pooling="mean", normalize=True, lowercase=True):  # type: ignore[no-untyped-def]
    """A random-init 2-layer BERT (hidden 32) with a WordPiece tokenizer of 100 ids, wrapped in
    sentence-transformers' Transformer -> Pooling -> Normalize and written by ``SentenceTransformer.save``."""
    import pytest

    st = pytest.importorskip("sentence_transformers", reason="the model is sentence-transformers': pip install sentence-transformers")
    transformers = pytest.importorskip("transformers", reason="the encoder is transformers': pip install transformers")
    from pathlib import Path

    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    folder = Path(folder)
    hf = folder.parent / f"{folder.name}-hf"
    hf.mkdir(parents=True, exist_ok=True)
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *".,:;!?'-", *ST_WORDS, *letters, *(f"##{c}" for c in letters)]
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    transformers.BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                                   mask_token="[MASK]", do_lower_case=lowercase).save_pretrained(str(hf))  # fmt: skip
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                                     max_position_embeddings=64)  # fmt: skip
    model = transformers.BertModel(config, add_pooling_layer=False).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):  # distinct biases: a fresh init's equal zeros hide swapped keys
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(str(hf))
    modules = [Transformer(str(hf), max_seq_length=max_seq_length), Pooling(32, pooling_mode=pooling)] + ([Normalize()] if normalize else [])
    st.SentenceTransformer(modules=modules, prompts=prompts, default_prompt_name=default_prompt_name, device="cpu").save(str(folder))
    return folder


# --- a BERT-style tokenizer of real words, for tiny checkpoints saved by transformers -------------------
def wordpiece_tokenizer(folder, vocab_size: int = 400) -> int:  # type: ignore[no-untyped-def]
    """A BERT-style WordPiece tokenizer.json trained on the shipped English corpus (real words, not [UNK]) in ``folder``;
    returns its vocab size (the checkpoint's ``vocab_size``)."""
    from pathlib import Path

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    corpus = Path(__file__).resolve().parents[1] / "attn_export" / "data" / "text" / "corpus_en.txt"
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    lines = [s for s in corpus.read_text(encoding="utf-8").splitlines() if s.strip() and not s.startswith("#")]
    tok.train_from_iterator(lines, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(Path(folder) / "tokenizer.json"))
    return tok.get_vocab_size()


def main_option_defaults() -> dict[str, tuple[str, object, str]]:
    """Main-command flag (``--quantize``) -> (its parameter name, its Python default, the text inside ``[default: ...]`` of
    its --help, click's brackets around a described default removed; "" for a switch, which shows none)."""
    import re

    import typer

    from attn_export.cli.app import _register, app

    _register()
    root = typer.main.get_command(app)
    ctx = root.make_context("attn-export", [], resilient_parsing=True)
    out = {}
    for p in root.params:
        if p.param_type_name == "option" and p.name != "help":
            found = re.search(r"\[default: (.*)\]", " ".join(p.get_help_record(ctx)[1].split()))
            shown = found.group(1) if found else ""
            out[p.opts[0]] = (p.name, p.default, shown[1:-1] if shown.startswith("(") and shown.endswith(")") else shown)
    return out
