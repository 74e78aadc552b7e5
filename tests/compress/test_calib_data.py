"""Calibration data: the shipped set, the generator, every loader check, and the ``calib`` CLI."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import typer
from typer.testing import CliRunner

from attn_export.cli.calib import register
from attn_export.compress.calib.data import ActivationSet, default_calibration_path, load_calibration
from attn_export.compress.calib.generate import generate_calibration
from attn_export.compress.layer_forward import eval_mode, forward_layer
from attn_export.errors import DataError
from attn_export.layers import MaskedLayer, build_layer

D = 32


def _arrays(n_calib: int = 6, n_val: int = 2, seq: int = 8, d: int = D, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    kpm = np.ones((n_calib + n_val, seq), np.int32)
    kpm[:, seq - 2 :] = 0
    x = rng.standard_normal((n_calib + n_val, seq, d)).astype(np.float32)
    return {
        "calib_x": x[:n_calib], "calib_key_padding_mask": kpm[:n_calib],
        "val_x": x[n_calib:], "val_key_padding_mask": kpm[n_calib:],
    }  # fmt: skip


def _npz(tmp_path, name: str = "set.npz", **override) -> str:
    arrays = {**_arrays(), **override}
    path = tmp_path / name
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return str(path)


def test_shipped_default_set_loads_with_disjoint_splits_and_masks():
    path = default_calibration_path(512)
    assert path.stat().st_size < 3 * 2**20, "the shipped set must stay a few MB"
    data = load_calibration(path, d_model=512)
    assert data.calib.x.dtype == np.float32 and data.calib.x.shape[1:] == (64, 512)
    assert len(data.calib) == 32 and len(data.val) == 8
    lengths = data.calib.key_padding_mask.sum(1)
    assert lengths.min() < lengths.max() == 64, "variable-length padding expected"


def test_default_path_without_a_shipped_set_names_the_generate_command():
    with pytest.raises(DataError, match="attn-export calib generate --d-model 100"):
        default_calibration_path(100)


def test_generated_activations_are_anisotropic_with_outlier_channels(tmp_path):
    data = load_calibration(generate_calibration(tmp_path / "g.npz", d_model=128, n_calib=32, n_val=8, seq_len=32, seed=1))
    x = data.calib.x[data.calib.key_padding_mask != 0]  # (T, D) real tokens
    centered = x - x.mean(0)
    eig = np.linalg.eigvalsh(centered.T @ centered / len(x))[::-1]
    assert eig[:16].sum() / eig.sum() > 0.5, "top 1/8 of directions should carry most variance (isotropic: 1/8)"
    scale = np.abs(x).mean(0)
    assert (scale > 4 * np.median(scale)).sum() >= 2, "expected a few outlier channels"


def test_generation_is_deterministic_and_both_formats_round_trip(tmp_path):
    a = load_calibration(generate_calibration(tmp_path / "a.npz", d_model=D, n_calib=4, n_val=2, seq_len=8, seed=3))
    b = load_calibration(generate_calibration(tmp_path / "b.safetensors", d_model=D, n_calib=4, n_val=2, seq_len=8, seed=3))
    c = load_calibration(generate_calibration(tmp_path / "c.npz", d_model=D, n_calib=4, n_val=2, seq_len=8, seed=4))
    np.testing.assert_array_equal(a.calib.x, b.calib.x)
    np.testing.assert_array_equal(a.val.key_padding_mask, b.val.key_padding_mask)
    assert not np.array_equal(a.calib.x, c.calib.x)
    assert not list(tmp_path.glob(".*.tmp")), "atomic write left a temporary file"


def test_directory_of_npy_files_and_single_npy_are_accepted(tmp_path):
    arrays = _arrays()
    folder = tmp_path / "dir"
    folder.mkdir()
    for key, value in arrays.items():
        np.save(folder / f"{key}.npy", value)
    data = load_calibration(folder, d_model=D)
    np.testing.assert_array_equal(data.val.x, arrays["val_x"])
    single = tmp_path / "x.npy"
    np.save(single, np.concatenate([arrays["calib_x"], arrays["val_x"]]))
    split = load_calibration(single, d_model=D, val_fraction=0.25)
    assert (len(split.calib), len(split.val)) == (6, 2)
    assert split.calib.key_padding_mask is None


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"val_x": np.full((2, 8, D), np.nan, np.float32)}, "NaN/Inf"),
        ({"calib_x": np.where(np.eye(8, D, dtype=bool)[None], np.inf, _arrays()["calib_x"]).astype(np.float32)}, "NaN/Inf"),
        ({"calib_x": np.zeros((6, D), np.float32)}, r"3-D \[N, L, D\]"),
        ({"calib_x": np.zeros((6, 8, D + 1), np.float32), "val_x": np.zeros((2, 8, D + 1), np.float32)}, "feature size 33"),
        ({"calib_key_padding_mask": np.ones((6, 7), np.int32)}, "must have shape"),
        ({"calib_key_padding_mask": np.full((6, 8), 2, np.int32)}, "0/1"),
        ({"calib_x": np.zeros((6, 8, D), np.int64)}, "float16/32/64"),
        ({"val_x": None, "val_key_padding_mask": None}, "no val_x"),
    ],
    ids=["nan", "inf", "wrong-rank", "wrong-feature-size", "mask-shape", "mask-values", "int-dtype", "no-val"],
)
def test_malformed_arrays_raise_data_error_naming_the_file(tmp_path, override, match):
    path = _npz(tmp_path, **override)
    with pytest.raises(DataError, match=match) as err:
        load_calibration(path, d_model=D)
    assert path in str(err.value) and "\n" not in str(err.value)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.npz"
    path.write_bytes(b"")
    with pytest.raises(DataError, match="empty") as err:
        load_calibration(path)
    assert str(path) in str(err.value)


def test_pickled_object_array_is_never_unpickled(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, calib_x=np.array([{"a": 1}], dtype=object), val_x=np.zeros((1, 2, 3), np.float32))
    with pytest.raises(DataError, match="pickled object array") as err:
        load_calibration(path)
    assert str(path) in str(err.value)
    raw = tmp_path / "raw.npy"
    raw.write_bytes(pickle.dumps({"calib_x": 1}))
    with pytest.raises(DataError, match=str(raw)):
        load_calibration(raw)


def test_missing_file_names_it_and_the_fix(tmp_path):
    with pytest.raises(DataError, match="does not exist.*calib generate") as err:
        load_calibration(tmp_path / "nope.npz")
    assert "nope.npz" in str(err.value)


def test_size_limit_overlapping_splits_and_corrupt_files(tmp_path):
    with pytest.raises(DataError, match="exceeds the 100-byte limit"):
        load_calibration(_npz(tmp_path), max_bytes=100)
    arrays = _arrays()
    with pytest.raises(DataError, match="also appear in calibration"):
        load_calibration(_npz(tmp_path, "dup.npz", val_x=arrays["calib_x"][:2]))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(DataError, match="cannot be read"):
        load_calibration(bad)


def test_activation_set_batches_cover_every_sequence_once():
    acts = ActivationSet(np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3), np.ones((5, 2), np.int32))
    seen = torch.cat([xb[:, 0, 0] for xb, _ in acts.batches(2, torch.Generator().manual_seed(0))])
    assert sorted(seen.tolist()) == [0.0, 6.0, 12.0, 18.0, 24.0]
    assert len(acts) == 5 and acts.num_tokens == 10 and acts.d_model == 3


@pytest.mark.parametrize("name", ["transformer", "mha", "self-attention"])
def test_forward_layer_runs_bare_and_wrapped_layers_alike(name):
    layer = build_layer(name, 32, 4, mask="padding")
    x = torch.randn(2, 6, 32)
    kpm = torch.tensor([[1] * 6, [1] * 3 + [0] * 3], dtype=torch.int32)
    with torch.no_grad():
        torch.testing.assert_close(forward_layer(layer, x, kpm), MaskedLayer(layer, "padding")(x, kpm))


def test_eval_mode_restores_each_modules_own_flag():
    wrapped = MaskedLayer(build_layer("transformer", 32, 4), "padding")  # wrapper train, layer eval
    with eval_mode(wrapped):
        assert not any(m.training for m in wrapped.modules())
    assert wrapped.training and not wrapped.layer.training


def test_cli_generate_then_check(tmp_path):
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    out = tmp_path / "cli.npz"
    runner = CliRunner()
    result = runner.invoke(app, ["calib", "generate", "--out", str(out), "--d-model", "16", "--n-calib", "3", "--n-val", "2", "--seq-len", "4"])
    assert result.exit_code == 0, result.output
    assert "calib 3 x 4" in result.output
    assert runner.invoke(app, ["calib", "generate", "--out", str(out)]).exit_code != 0, "must not overwrite silently"
    result = runner.invoke(app, ["calib", "check", str(out), "--d-model", "16"])
    assert result.exit_code == 0 and "ok:" in result.output
    from attn_export.cli import main

    assert main(["calib", "check", str(out), "--d-model", "8"]) == 2  # the one error path: one line, exit 2
