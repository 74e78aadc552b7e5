"""Synthetic calibration sets: hidden states shaped like a transformer layer's inputs, written atomically.

``attn-export calib generate`` and the shipped default sets use them: an anisotropic
spectrum (``decay``), a few outlier channels, LayerNorm-like scales and ragged padding
masks, so every compression step sees ranges and second moments like a real layer's.
The arguments are bounded (``GENERATE_LIMITS``) and checked before anything is drawn.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from attn_export.outdir.atomic import atomic_path
from attn_export.compress.calib.files import DEFAULT_MAX_BYTES
from attn_export.errors import ConfigError

__all__ = ["GENERATE_LIMITS", "check_generate_args", "generate_calibration", "synthesize_hidden_states"]

log = logging.getLogger(__name__)


def synthesize_hidden_states(
    n: int,
    seq_len: int,
    d_model: int,
    rng: np.random.Generator,
    decay: float = 1.0,
    n_outliers: int = 4,
    min_len_fraction: float = 0.25,
) -> tuple[np.ndarray, np.ndarray]:
    """Hidden-state-like activations (n, L, D) and padding masks (n, L); recipe in attn_export/data/calibration/README.md."""
    basis, _ = np.linalg.qr(rng.standard_normal((d_model, d_model)))  # random orthonormal directions
    mix = basis * np.arange(1, d_model + 1) ** (-decay / 2)  # covariance spectrum k^-decay
    pos = np.arange(seq_len)[:, None] / 10000 ** (np.arange(d_model)[None, :] // 2 * 2 / d_model)
    pos = np.where(np.arange(d_model) % 2 == 0, np.sin(pos), np.cos(pos)) @ mix.T  # (L, D) smooth in position
    topic = rng.standard_normal((n, 1, d_model))  # shared by a sequence's tokens
    token = rng.standard_normal((n, seq_len, d_model))
    z = (0.35 * topic + 0.94 * token) @ mix.T + 0.3 * pos  # (n, L, D)
    z = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + 1e-5)  # LayerNorm
    gamma = 1.0 + 0.1 * rng.standard_normal(d_model)
    beta = 0.1 * rng.standard_normal(d_model)
    outliers = rng.choice(d_model, size=min(n_outliers, d_model), replace=False)
    gamma[outliers] = rng.uniform(6.0, 12.0, outliers.size)  # a few channels with huge gain and offset
    beta[outliers] = rng.choice([-1.0, 1.0], outliers.size) * rng.uniform(2.0, 5.0, outliers.size)
    x = z * gamma + beta
    lengths = rng.integers(max(1, round(seq_len * min_len_fraction)), seq_len + 1, size=n)
    kpm = (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int32)  # (n, L), 1 = keep
    return x.astype(np.float32), kpm


# What ``calib generate`` accepts. d_model is bounded by the cost of the random orthonormal basis
# (a d_model x d_model QR: 4096 takes seconds, 20000 took hours); the file by what the loader
# accepts (DEFAULT_MAX_BYTES), so a generated set can always be loaded.
GENERATE_LIMITS = {"d_model": 4096, "n_calib": 100_000, "n_val": 100_000, "seq_len": 65536, "seed": 2**32 - 1}


MAX_DECAY = 8.0


def _int_arg(flag: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"expected {flag} to be an integer, got {value!r}")
    if not lo <= int(value) <= hi:
        raise ConfigError(f"expected {flag} in [{lo}, {hi}], got {value}")
    return int(value)


def check_generate_args(
    path: Path, d_model: int, n_calib: int, n_val: int, seq_len: int, seed: int, decay: float, n_outliers: int,
    min_len_fraction: float, dtype: str, max_bytes: int = DEFAULT_MAX_BYTES,
) -> None:  # fmt: skip
    """Refuse, before any work, arguments that would fail, hang, or write a set the loader refuses."""
    if Path(path).suffix not in (".npz", ".safetensors"):
        raise ConfigError(f"expected an output path ending in .npz or .safetensors, got {path}")
    for flag, value in (("--d-model", d_model), ("--n-calib", n_calib), ("--n-val", n_val), ("--seq-len", seq_len)):
        _int_arg(flag, value, 1, GENERATE_LIMITS[flag[2:].replace("-", "_")])
    _int_arg("--seed", seed, 0, GENERATE_LIMITS["seed"])
    _int_arg("--outliers", n_outliers, 0, d_model)
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not (0.0 <= float(decay) <= MAX_DECAY):
        raise ConfigError(f"expected --decay in [0, {MAX_DECAY:g}] (eigenvalue k ~ k^-decay), got {decay}; use 1.0")
    if not (isinstance(min_len_fraction, (int, float)) and 0.0 < float(min_len_fraction) <= 1.0):
        raise ConfigError(f"expected min_len_fraction in (0, 1], got {min_len_fraction}")
    if dtype not in ("float16", "float32"):
        raise ConfigError(f"expected --dtype float16 or float32, got {dtype!r}; use float16")
    n = n_calib + n_val
    size = n * seq_len * d_model * np.dtype(dtype).itemsize
    if size > max_bytes:
        raise ConfigError(
            f"expected a set of at most {max_bytes:,} bytes (what the loader accepts), got {size:,} "
            f"({n} x {seq_len} x {d_model} {dtype}); use fewer --n-calib/--n-val or a shorter --seq-len"
        )
    from attn_export.host.memory import available_memory, format_bytes

    working = n * seq_len * d_model * 8 * 4 + d_model * d_model * 8 * 3  # float64 draws, mixes and LayerNorm; basis and QR
    free = available_memory()
    if free is not None and working > free:
        raise ConfigError(f"generating needs about {format_bytes(working)} of memory and {format_bytes(free)} is available; use fewer sequences")


def generate_calibration(
    path: str | os.PathLike[str],
    d_model: int = 512,
    n_calib: int = 32,
    n_val: int = 8,
    seq_len: int = 64,
    seed: int = 0,
    *,
    decay: float = 1.0,
    n_outliers: int = 4,
    min_len_fraction: float = 0.25,
    dtype: str = "float16",
) -> Path:
    """Write a synthetic set (.npz or .safetensors, by suffix) atomically; returns the path.

    Both splits come from one draw of one distribution, split by sequence, so they are
    disjoint. ``dtype="float16"`` halves the file; the loader returns float32.
    """
    path = Path(path)
    check_generate_args(path, d_model, n_calib, n_val, seq_len, seed, decay, n_outliers, min_len_fraction, dtype)
    rng = np.random.default_rng(seed)
    x, kpm = synthesize_hidden_states(n_calib + n_val, seq_len, d_model, rng, decay, n_outliers, min_len_fraction)
    x = x.astype(dtype)
    if not np.isfinite(x).all():  # never write a set the loader would refuse
        raise ConfigError(f"the generated activations are not finite (decay {decay}, dtype {dtype}); use a smaller --decay or --dtype float32")
    arrays = {
        "calib_x": x[:n_calib], "calib_key_padding_mask": kpm[:n_calib],
        "val_x": x[n_calib:], "val_key_padding_mask": kpm[n_calib:],
    }  # fmt: skip
    with atomic_path(path) as tmp:
        if path.suffix == ".npz":
            with open(tmp, "wb") as f:
                np.savez_compressed(f, **arrays)
        else:
            from safetensors.numpy import save_file

            save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(tmp), metadata={"seed": str(seed)})
    log.info("wrote %s (%d bytes)", path, path.stat().st_size)
    return path
