"""The library reference (transformers / sentence-transformers from the folder) and the classifier metric."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from hf_models import build, hf_forward, probe, save, transformers_module

from attn_export.checkpoint.loader import load_bert_checkpoint
from attn_export.checkpoint.metrics import classification_agreement
from attn_export.checkpoint.reference import load_reference
from attn_export.errors import DataError, MissingDependencyError
from attn_export.layers.pooling import PoolingConfig, pool


def test_without_transformers_the_reference_names_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(MissingDependencyError, match=r"transformers .* is not installed; pip install transformers$") as info:
        load_reference(tmp_path)
    assert "\n" not in str(info.value)


def test_plain_folder_reference_is_automodel_plus_the_documented_pooling(tmp_path):
    transformers_module()
    hf = build("electra")
    folder = save(hf, tmp_path / "ckpt")
    ref = load_reference(folder, PoolingConfig(("cls",), False, "--pooling"))
    assert ref.description.startswith("transformers ElectraModel (eager)") and ref.pipeline is None
    ids, mask = probe(0)
    out = ref(ids, mask)
    hidden, _ = hf_forward(hf, ids, mask)
    np.testing.assert_allclose(out.last_hidden_state, hidden, atol=1e-5)  # the in-memory model runs sdpa, the reference eager
    np.testing.assert_array_equal(out.sentence_embedding, out.last_hidden_state[:, 0])  # cls, not normalised
    assert out.logits is None


def test_token_classification_reference_gives_per_token_logits(tmp_path):
    transformers_module()
    hf = build("bert-token")
    folder = save(hf, tmp_path / "ckpt")
    ours = load_bert_checkpoint(folder)
    ref = load_reference(folder, ours.config.pooling, ours.config.head.task)
    ids, mask = probe(0)
    out = ref(ids, mask, token_type_ids=np.zeros_like(ids))
    assert out.logits.shape == (4, 20, 5)
    with torch.no_grad():
        got = ours(torch.from_numpy(ids), torch.from_numpy(mask))
    np.testing.assert_allclose(out.sentence_embedding, pool(torch.from_numpy(out.last_hidden_state), torch.from_numpy(mask)).numpy(), atol=1e-6)
    agreement = classification_agreement(out.logits, got[2].numpy(), mask)
    assert agreement["label_agreement"] == 1.0 and agreement["min_cosine"] > 0.9999 and agreement["num_rows"] == 35


def test_classification_agreement_counts_flipped_labels():
    ref = np.array([[2.0, 0.0, 0.0], [0.0, 1.0, 0.9], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
    out = ref.copy()
    out[1] = [0.0, 0.9, 1.0]  # a close call flipped: cosine stays high, the label does not
    a = classification_agreement(ref, out)
    assert a["label_agreement"] == 0.75 and a["min_cosine"] > 0.99 and a["max_abs"] == pytest.approx(0.1)
    tokens = np.stack([ref, out])  # (2, 4, 3) token logits; the mask drops the flipped row's copy
    mask = np.array([[1, 1, 1, 1], [1, 0, 1, 1]])
    assert classification_agreement(tokens, tokens, mask)["num_rows"] == 7
    with pytest.raises(DataError, match="a \\(B, S\\) mask"):
        classification_agreement(tokens, tokens)
    assert np.isnan(classification_agreement(ref, np.full_like(ref, np.nan))["min_cosine"])
