"""Calibration and validation activations: load, check, generate.

Every compression step needs inputs that look like what the layer sees in production:
low-rank whitening needs their second moment, distillation trains on them and int8 needs
their ranges. Every accuracy figure after compression must come from data the step never
saw, so a ``CalibrationData`` always holds two disjoint splits, ``calib`` and ``val``.

Files are read without unpickling (``np.load(allow_pickle=False)``, safetensors) and
checked for shape, dtype, finiteness and size before anything runs on them. The accepted
layouts are documented in ``attn_export/data/calibration/README.md``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attn_export._atomic import atomic_path
from attn_export.data import shipped_path
from attn_export.errors import ConfigError, DataError
from attn_export.layers.registry import LAYERS, MaskedLayer

__all__ = [
    "ActivationSet",
    "CalibrationData",
    "DEFAULT_MAX_BYTES",
    "default_calibration_path",
    "device_of",
    "eval_mode",
    "forward_layer",
    "generate_calibration",
    "load_calibration",
    "synthesize_hidden_states",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 512 * 2**20
# Package data (attn_export/data/calibration/), read through importlib.resources so a wheel
# finds it as well as a source checkout.
SHIPPED_DIRS = (shipped_path("calibration"),)
_SPLITS = ("calib", "val")
_KEYS = ("calib_x", "calib_key_padding_mask", "val_x", "val_key_padding_mask", "x", "key_padding_mask")


@dataclass
class ActivationSet:
    """Layer inputs x (N, L, D) float32 and an optional key_padding_mask (N, L) int32, 1 = keep."""

    x: np.ndarray
    key_padding_mask: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.x.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.x.shape[-1])

    @property
    def num_tokens(self) -> int:
        """Real (non-padded) tokens."""
        return int(self.x.shape[0] * self.x.shape[1] if self.key_padding_mask is None else self.key_padding_mask.sum())

    def to_torch(self, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor | None]:
        x = torch.from_numpy(np.ascontiguousarray(self.x, dtype=np.float32)).to(device)
        kpm = self.key_padding_mask
        return x, None if kpm is None else torch.from_numpy(np.ascontiguousarray(kpm, dtype=np.int32)).to(device)

    def batches(
        self, batch_size: int, generator: torch.Generator | None = None, device: str | torch.device = "cpu"
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """(x (B, L, D), mask (B, L) | None) batches; shuffled when a (CPU) generator is given."""
        x, kpm = self.to_torch(device)
        order = torch.randperm(len(self), generator=generator) if generator is not None else torch.arange(len(self))
        for idx in order.split(batch_size):
            yield x[idx], None if kpm is None else kpm[idx]


@dataclass
class CalibrationData:
    """Two disjoint splits: ``calib`` feeds compression, ``val`` measures every accuracy figure."""

    calib: ActivationSet
    val: ActivationSet
    source: str

    @property
    def d_model(self) -> int:
        return self.calib.d_model

    def describe(self) -> str:
        c, v = self.calib, self.val
        masks = "yes" if c.key_padding_mask is not None else "no"
        return (
            f"{self.source}: d_model {self.d_model}, calib {len(c)} x {c.x.shape[1]} ({c.num_tokens} tokens), "
            f"val {len(v)} x {v.x.shape[1]} ({v.num_tokens} tokens), masks {masks}"
        )


def default_calibration_path(d_model: int = 512) -> Path:
    """The shipped synthetic set for ``d_model``; DataError with the generate command if none."""
    name = f"synthetic_d{d_model}.npz"
    for folder in SHIPPED_DIRS:
        if (folder / name).is_file():
            return folder / name
    raise DataError(
        f"no shipped calibration set for d_model {d_model} (looked for {name} in {', '.join(map(str, SHIPPED_DIRS))}); "
        f"generate one with: attn-export calib generate --d-model {d_model} --out calib_d{d_model}.npz"
    )


def load_calibration(
    path: str | os.PathLike[str],
    d_model: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    val_fraction: float = 0.25,
) -> CalibrationData:
    """Load and check calibration data; a file with only ``x`` is split, its last ``val_fraction`` to val."""
    path = Path(path)
    arrays = _read_arrays(path, max_bytes)
    if "calib_x" in arrays or "val_x" in arrays:
        missing = [k for k in ("calib_x", "val_x") if k not in arrays]
        if missing:
            raise DataError(
                f"{path}: has {sorted(arrays)} but no {missing[0]}; store both calib_x and val_x, or a single x to split"
            )
        splits = {s: (arrays[f"{s}_x"], arrays.get(f"{s}_key_padding_mask")) for s in _SPLITS}
    elif "x" in arrays:
        x, kpm = arrays["x"], arrays.get("key_padding_mask")
        _check_x(path, "x", x, d_model)
        if len(x) < 2 or not 0.0 < val_fraction < 1.0:
            raise DataError(f"{path}: splitting x needs >= 2 sequences and 0 < val_fraction < 1, got {len(x)}, {val_fraction}")
        cut = len(x) - max(1, int(np.ceil(len(x) * val_fraction)))  # the last sequences become val
        splits = {
            "calib": (x[:cut], None if kpm is None else kpm[:cut]),
            "val": (x[cut:], None if kpm is None else kpm[cut:]),
        }
    else:
        raise DataError(f"{path}: expected arrays calib_x and val_x (or a single x), found {sorted(arrays) or 'none'}")
    sets = {s: _checked_set(path, s, x, kpm, d_model) for s, (x, kpm) in splits.items()}
    if sets["calib"].d_model != sets["val"].d_model:
        dims = (sets["calib"].d_model, sets["val"].d_model)
        raise DataError(f"{path}: calib has d_model {dims[0]} but val has {dims[1]}; store both splits for one layer")
    _check_disjoint(path, sets["calib"], sets["val"])
    data = CalibrationData(sets["calib"], sets["val"], str(path))
    log.info("loaded %s", data.describe())
    return data


def _read_arrays(path: Path, max_bytes: int) -> dict[str, np.ndarray]:
    if not path.exists():
        raise DataError(
            f"calibration data {path} does not exist; use the shipped default or run attn-export calib generate --out {path}"
        )
    files = sorted(p for p in path.glob("*.npy") if p.stem in _KEYS) if path.is_dir() else [path]
    if not files:
        raise DataError(f"{path}: directory holds none of {', '.join(k + '.npy' for k in _KEYS)}")
    for f in files:
        if f.stat().st_size == 0:
            raise DataError(f"{f} is empty (0 bytes); regenerate it with attn-export calib generate --out {f}")
    size = sum(f.stat().st_size for f in files)
    if path.suffix == ".npz" and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:  # uncompressed size: a small archive may expand a lot
            size = max(size, sum(i.file_size for i in zf.infolist()))
    if size > max_bytes:
        raise DataError(f"{path}: {size} bytes exceeds the {max_bytes}-byte limit; use fewer sequences or raise max_bytes")
    try:
        if path.is_dir():
            return {f.stem: np.load(f, allow_pickle=False) for f in files}
        if path.suffix == ".safetensors":
            from safetensors.numpy import load_file

            return {k: v for k, v in load_file(str(path)).items() if k in _KEYS}
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                return {k: npz[k] for k in npz.files if k in _KEYS}
        if path.suffix == ".npy":
            return {"x": np.load(path, allow_pickle=False)}
    except ValueError as err:
        if "pickle" in str(err).lower():
            raise DataError(
                f"{path} holds a pickled object array, which attn-export never loads; save plain float arrays with np.savez"
            ) from err
        raise DataError(f"{path} cannot be read ({err}); save it with np.savez or safetensors") from err
    except Exception as err:  # corrupt zip, truncated npy, bad safetensors header
        what = f"{type(err).__name__}: {err}"
        raise DataError(f"{path} cannot be read ({what}); regenerate it with attn-export calib generate") from err
    raise DataError(f"{path}: unsupported format {path.suffix!r}; use .npz, .safetensors, .npy or a directory of .npy")


def _check_x(path: Path, name: str, x: np.ndarray, d_model: int | None) -> None:
    if x.dtype.kind not in "f":
        raise DataError(f"{path}: {name} must be float16/32/64, got dtype {x.dtype}; cast with x.astype(np.float32)")
    if x.ndim != 3:
        raise DataError(f"{path}: {name} must be 3-D [N, L, D], got shape {tuple(x.shape)}; add the sequence axis (x[:, None])")
    if min(x.shape) == 0:
        raise DataError(f"{path}: {name} has an empty axis, shape {tuple(x.shape)}; store at least one sequence and token")
    if d_model is not None and x.shape[-1] != d_model:
        raise DataError(
            f"{path}: {name} has feature size {x.shape[-1]}, the layer has d_model {d_model}; "
            f"use a set made for this layer (attn-export calib generate --d-model {d_model})"
        )
    bad = ~np.isfinite(x)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise DataError(f"{path}: {name} has {int(bad.sum())} NaN/Inf values (first at {first}); drop or recompute them")


def _checked_set(path: Path, split: str, x: np.ndarray, kpm: np.ndarray | None, d_model: int | None) -> ActivationSet:
    _check_x(path, f"{split}_x", x, d_model)
    if kpm is not None:
        name = f"{split}_key_padding_mask"
        if kpm.shape != x.shape[:2]:
            raise DataError(f"{path}: {name} must have shape [N, L] = {tuple(x.shape[:2])}, got {tuple(kpm.shape)}")
        if kpm.dtype.kind not in "biu" or not np.isin(kpm, (0, 1)).all():
            raise DataError(f"{path}: {name} must hold 0/1 integers (1 = keep), got dtype {kpm.dtype} with other values")
        if not kpm.any():
            raise DataError(f"{path}: {name} masks every token; keep at least one (1 = real token)")
        kpm = kpm.astype(np.int32)
    return ActivationSet(np.ascontiguousarray(x, dtype=np.float32), kpm)


def _check_disjoint(path: Path, calib: ActivationSet, val: ActivationSet) -> None:
    seen = {hashlib.sha1(s.tobytes()).digest() for s in calib.x}
    shared = sum(hashlib.sha1(s.tobytes()).digest() in seen for s in val.x)
    if shared:
        raise DataError(f"{path}: {shared} validation sequences also appear in calibration; the splits must be disjoint")


def device_of(model: nn.Module) -> torch.device:
    """Where the model's parameters live (CPU for a parameter-free module)."""
    return next(model.parameters(), torch.empty(0)).device


@contextmanager
def eval_mode(*models: nn.Module) -> Iterator[None]:
    """Put every module in eval mode and restore each one's own flag afterwards.

    ``model.train(flag)`` would instead force one flag on all children (a MaskedLayer is
    built in train mode around an eval-mode layer).
    """
    modes = [(m, m.training) for model in models for m in model.modules()]
    try:
        for model in models:
            model.eval()
        yield
    finally:
        for m, training in modes:
            m.training = training


def forward_layer(model: nn.Module, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Run a layer with ``MaskedLayer`` semantics and return y (B, L, D).

    A ``MaskedLayer`` gets the mask only when it takes one (mask="padding"); a bare reference
    layer is wrapped; any other module is called as ``model(x[, key_padding_mask])``.
    """
    if isinstance(model, MaskedLayer):
        out = model(x, key_padding_mask) if model.mask == "padding" else model(x)
    elif isinstance(model, tuple(info.cls for info in LAYERS.values())):
        out = MaskedLayer(model, "padding")(x, key_padding_mask)
    else:
        out = model(x) if key_padding_mask is None else model(x, key_padding_mask)
    return out[0] if isinstance(out, (tuple, list)) else out


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
    if min(n_calib, n_val, seq_len, d_model) < 1:
        raise ConfigError(f"expected positive n_calib, n_val, seq_len, d_model, got {n_calib}, {n_val}, {seq_len}, {d_model}")
    if dtype not in ("float16", "float32"):
        raise ConfigError(f"expected dtype float16 or float32, got {dtype!r}; use float16")
    path = Path(path)
    if path.suffix not in (".npz", ".safetensors"):
        raise ConfigError(f"expected an output path ending in .npz or .safetensors, got {path}")
    rng = np.random.default_rng(seed)
    x, kpm = synthesize_hidden_states(n_calib + n_val, seq_len, d_model, rng, decay, n_outliers, min_len_fraction)
    x = x.astype(dtype)
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
