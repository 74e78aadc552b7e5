"""Pooling as the model ships it: sentence-transformers' formulas, its files, the override, and the exported graph."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_models import build, probe, save, transformers_module

from attn_export.checkpoint.loader import load_bert_checkpoint
from attn_export.checkpoint.pooling import parse_pooling, read_sentence_transformers, resolve_pooling
from attn_export.errors import CheckpointError, ConfigError
from attn_export.layers.pooling import PoolingConfig, pool
from attn_export.vocab.choices import POOLING_MODES

_TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
_POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
_NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}


def _st_pooling_class():
    pytest.importorskip("sentence_transformers", reason="the formulas are sentence-transformers': pip install sentence-transformers")
    try:
        from sentence_transformers.sentence_transformer.modules import Pooling
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import Pooling
    return Pooling


@pytest.mark.parametrize("modes", [(m,) for m in POOLING_MODES] + [("cls", "mean"), ("max", "mean_sqrt_len_tokens", "lasttoken")])
def test_pool_is_sentence_transformers_pooling(modes):
    """Right padding, left padding and a one-token row; every mode and concatenations, against the library's module."""
    Pooling = _st_pooling_class()
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, 9, 8, generator=g) * 3
    mask = torch.tensor([[1] * 9, [1] * 4 + [0] * 5, [1] + [0] * 8, [0] * 3 + [1] * 6, [0] * 7 + [1] * 2])
    ref = Pooling(8, pooling_mode=modes[0] if len(modes) == 1 else modes)({"token_embeddings": hidden, "attention_mask": mask})["sentence_embedding"]
    np.testing.assert_allclose(pool(hidden, mask, modes, normalize=False).numpy(), ref.numpy(), atol=1e-6, rtol=1e-6)
    unit = pool(hidden, mask, modes, normalize=True)
    np.testing.assert_allclose(unit.numpy(), torch.nn.functional.normalize(ref, dim=-1).numpy(), atol=1e-6)


def _st_folder(tmp_path: Path, pooling: dict | None, modules: list[dict] | None = None) -> Path:
    folder = tmp_path / "st"
    folder.mkdir(exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules if modules is not None else [_TRANSFORMER, _POOLING, _NORMALIZE]))
    if pooling is not None:
        (folder / "1_Pooling").mkdir(exist_ok=True)
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    return folder


@pytest.mark.parametrize(
    ("pooling", "modes"),
    [
        ({"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, ("cls",)),
        ({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, ("cls", "mean")),
        ({"word_embedding_dimension": 32}, ("mean",)),
        ({"embedding_dimension": 32, "pooling_mode": "lasttoken"}, ("lasttoken",)),
        ({"embedding_dimension": 32, "pooling_mode": ["weightedmean", "max"], "pooling_mode_cls_token": True}, ("weightedmean", "max")),
    ],
    ids=["legacy-cls", "legacy-cls-mean", "legacy-none", "v6-lasttoken", "v6-list-wins"],
)
def test_pooling_read_from_sentence_transformers_files(tmp_path, pooling, modes):
    folder = _st_folder(tmp_path, pooling)
    config = resolve_pooling(folder)
    assert (config.modes, config.normalize, config.source) == (modes, True, "1_Pooling/config.json")
    assert read_sentence_transformers(folder).max_seq_length == 128
    (folder / "modules.json").write_text(json.dumps([_TRANSFORMER, _POOLING]))  # no Normalize: none applied
    assert resolve_pooling(folder).normalize is False


def test_override_and_default(tmp_path):
    folder = _st_folder(tmp_path, {"pooling_mode_mean_tokens": True})
    assert resolve_pooling(folder, "cls") == PoolingConfig(("cls",), True, "--pooling")
    assert resolve_pooling(tmp_path / "plain") == PoolingConfig(("mean",), True, "default mean")  # no sentence-transformers files
    assert parse_pooling("CLS+mean-sqrt-len") == ("cls", "mean_sqrt_len_tokens")
    with pytest.raises(ConfigError, match=r"expected --pooling one of cls, max, mean.*got 'median'"):
        resolve_pooling(folder, "median")


@pytest.mark.parametrize(
    ("modules", "pooling", "message"),
    [
        ([_TRANSFORMER, _POOLING, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}, _NORMALIZE],
         {"pooling_mode_mean_tokens": True}, r"module 'sentence_transformers\.models\.Dense' is not supported; supported .*Transformer, Pooling, Normalize"),
        ([_TRANSFORMER, {**_POOLING, "path": "../outside"}], {"pooling_mode_mean_tokens": True}, r"expected a file inside the checkpoint directory"),
        ([_TRANSFORMER, _POOLING], {"pooling_mode": "median"}, r"1_Pooling/config\.json: pooling_mode: expected"),
        ([{**_TRANSFORMER, "path": "0_Transformer"}, _POOLING], {"pooling_mode_mean_tokens": True}, r"pass --checkpoint .*0_Transformer"),
        ([_POOLING, _TRANSFORMER], {"pooling_mode_mean_tokens": True}, r"expected Transformer, then Pooling"),
    ],
    ids=["dense", "outside", "bad-mode", "subfolder", "order"],
)
def test_unsupported_pipelines_are_one_line(tmp_path, modules, pooling, message):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    folder = _st_folder(tmp_path, pooling, modules)
    with pytest.raises(CheckpointError, match=message) as info:
        resolve_pooling(folder)
    assert "\n" not in str(info.value)


def test_pooling_is_exported_inside_the_graph(tmp_path):
    """Every mode at once (concatenated, one export), on padded batches of two shapes."""
    ort = pytest.importorskip("onnxruntime", reason="the exported graph runs on pip install onnxruntime")
    from attn_export.checkpoint.export import export_encoder

    folder = save(build("roberta"), tmp_path / "ckpt")
    ours = load_bert_checkpoint(folder, pooling="+".join(POOLING_MODES))
    assert ours.config.pooling.source == "--pooling" and ours.config.pooling.modes == POOLING_MODES
    export_encoder(ours, tmp_path / "m.onnx")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for lengths in ((20, 9, 5, 1), (3, 2)):
        ids, mask = probe(1, lengths=lengths)
        with torch.no_grad():
            ref = ours(torch.from_numpy(ids), torch.from_numpy(mask))[1].numpy()
        got = session.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})[0]
        np.testing.assert_allclose(got, ref, atol=1e-5)


# --- all-MiniLM-L6-v2 as it ships (mean + Normalize) and with its pooling switched to CLS -----------


def _copy_checkpoint(src: Path, dst: Path) -> Path:
    """Hard links where the filesystem allows (the 90 MB weights), copies otherwise; 1_Pooling is copied to be edited."""
    for item in src.rglob("*"):
        target = dst / item.relative_to(src)
        if item.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            if "1_Pooling" in item.parts:
                raise OSError
            os.link(item, target)
        except OSError:
            shutil.copyfile(item, target)
    return dst


@pytest.fixture(scope="module")
def minilm_cls_dir(minilm_dir, tmp_path_factory) -> Path:
    folder = _copy_checkpoint(minilm_dir, tmp_path_factory.mktemp("minilm-cls"))
    cfg = json.loads((folder / "1_Pooling" / "config.json").read_text())
    cfg.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(cfg))
    return folder


def _encode(folder: Path, texts: list[str]) -> np.ndarray:
    st = pytest.importorskip("sentence_transformers", reason="the peer is SentenceTransformer.encode: pip install sentence-transformers")
    return st.SentenceTransformer(str(folder), device="cpu", local_files_only=True).encode(texts, batch_size=32, convert_to_numpy=True)


def _texts() -> list[str]:
    from attn_export.checkpoint.corpus import load_text_corpus

    corpus = load_text_corpus()
    return corpus.test[:40] + corpus.calib[:24]  # every language, 64 texts


def test_minilm_ships_mean_and_normalize(minilm):
    assert minilm.config.pooling == PoolingConfig(("mean",), True, "1_Pooling/config.json")


def test_minilm_switched_to_cls_matches_sentence_transformers_encode(minilm_cls_dir):
    from attn_export.checkpoint.metrics import embedding_agreement
    from attn_export.checkpoint.text import load_tokenizer, tokenize

    texts = _texts()
    ref = _encode(minilm_cls_dir, texts)
    ours = load_bert_checkpoint(minilm_cls_dir)
    assert ours.config.pooling == PoolingConfig(("cls",), True, "1_Pooling/config.json")
    tokens = tokenize(load_tokenizer(minilm_cls_dir), texts, max_len=256)
    with torch.no_grad():
        got = ours(*tokens.to_torch())[1].numpy()
    agreement = embedding_agreement(ref, got)
    assert agreement["min_cosine"] >= 0.9999, agreement
    mean = load_bert_checkpoint(minilm_cls_dir, pooling="mean")  # what the project did before: refused by the fidelity check
    with torch.no_grad():
        assert embedding_agreement(ref, mean(*tokens.to_torch())[1].numpy())["mean_cosine"] < 0.9


def test_fidelity_refuses_the_wrong_pooling_on_real_weights(minilm_cls_dir):
    transformers_module()
    from attn_export.checkpoint.fidelity import check_fidelity

    ours = load_bert_checkpoint(minilm_cls_dir)
    result = check_fidelity(ours, minilm_cls_dir)
    assert result.passed and result.probes["7 real texts"] == 7 and not result.notes
    ours.pooling.config = PoolingConfig(("mean",), True, "default mean")  # the pre-issue-19 behaviour
    with pytest.raises(CheckpointError, match=r"sentence_embedding min cosine"):
        check_fidelity(ours, minilm_cls_dir)
