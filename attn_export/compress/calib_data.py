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
from attn_export.compress.calib_bounds import check_data_scale
from attn_export.data import shipped_path
from attn_export.errors import ConfigError, DataError
from attn_export.layers.registry import LAYERS, MaskedLayer

__all__ = [
    "ActivationSet",
    "CalibrationData",
    "DEFAULT_MAX_BYTES",
    "GENERATE_LIMITS",
    "check_generate_args",
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


def shipped_or_generated(d_model: int, folder: Path, seed: int = 0) -> Path:
    """The shipped set for ``d_model``, else a seeded synthetic one written to ``folder`` (the same file for the same seed).

    For the sweep and the bench, which run many configurations of one width: every point
    calibrates on the same data, and the file stays beside their results so each recipe
    (``--calib FILE``) rebuilds its point exactly.
    """
    try:
        return default_calibration_path(d_model)
    except DataError:
        path = Path(folder) / f"calib_d{d_model}_seed{seed}.npz"
        return path if path.is_file() else generate_calibration(path, d_model, n_calib=16, n_val=4, seed=seed)


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
    from attn_export.paths import check_regular_file

    check_regular_file(path, "calibration data", DataError, allow_dir=True)  # a FIFO or /dev/zero is never opened
    files = sorted(p for p in path.glob("*.npy") if p.stem in _KEYS) if path.is_dir() else [path]
    if not files:
        raise DataError(f"{path}: directory holds none of {', '.join(k + '.npy' for k in _KEYS)}")
    for f in files:
        check_regular_file(f, "calibration data", DataError)
        if f.stat().st_size == 0:
            raise DataError(f"{f} is empty (0 bytes); regenerate it with attn-export calib generate --out {f}")
    size = sum(f.stat().st_size for f in files)
    if path.suffix == ".npz" and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:  # uncompressed size: a small archive may expand a lot
            size = max(size, sum(i.file_size for i in zf.infolist()))
    if size > max_bytes:
        raise DataError(f"{path}: {size} bytes exceeds the {max_bytes}-byte limit; use fewer sequences or raise max_bytes")
    if path.is_dir() or path.suffix in (".npy", ".npz"):
        for f in files:
            _check_container(f, ".npy" if path.is_dir() else path.suffix)
    try:
        if path.is_dir():
            arrays = {f.stem: _load_npy(f) for f in files}
        elif path.suffix == ".safetensors":
            from safetensors.numpy import load_file

            arrays = {k: v for k, v in load_file(str(path)).items() if k in _KEYS}
        elif path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                arrays = {}
                for k in npz.files:
                    if k in _KEYS:
                        _check_npy_header(path, npz.zip.open(f"{k}.npy"), f"member {k}.npy", npz.zip.getinfo(f"{k}.npy").file_size)
                        arrays[k] = npz[k]
        elif path.suffix == ".npy":
            arrays = {"x": _load_npy(path)}
        else:
            raise DataError(f"{path}: unsupported format {path.suffix!r}; use .npz, .safetensors, .npy or a directory of .npy")
    except DataError:
        raise
    except ValueError as err:
        if "object arrays" in str(err).lower():
            raise DataError(
                f"{path} holds a pickled object array, which attn-export never loads; save plain float arrays with np.savez"
            ) from err
        raise DataError(f"{path} cannot be read ({_first_line(err)}); save it with np.savez or safetensors") from err
    except MemoryError as err:
        raise DataError(f"{path} cannot be read: its arrays do not fit in memory; use fewer sequences") from err
    except Exception as err:  # corrupt zip, truncated npy, bad safetensors header
        what = f"{type(err).__name__}: {_first_line(err)}"
        raise DataError(f"{path} cannot be read ({what}); regenerate it with attn-export calib generate") from err
    for k, v in arrays.items():
        if not isinstance(v, np.ndarray):  # an .npz member that is not a .npy array comes back as raw bytes
            raise DataError(f"{path}: {k} is not a NumPy array (its member lacks the .npy header); save plain float arrays with np.savez")
    return arrays


_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _check_container(path: Path, kind: str) -> None:
    """The file starts like the format its name says; else say what it is, without unpickling it.

    ``np.load`` takes any file without the NumPy or zip header for a pickle, so random bytes
    used to be reported as "a pickled object array".
    """
    with open(path, "rb") as f:
        head = f.read(8)
    expected = _NPY_MAGIC if kind == ".npy" else _ZIP_MAGICS
    if head.startswith(expected if isinstance(expected, tuple) else (expected,)):
        return
    what = "a .npy array" if kind == ".npy" else "a .npz archive (a zip of .npy arrays)"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:  # a pickle stream (protocol 2-5)
        raise DataError(f"{path} is a Python pickle, not {what}; attn-export never unpickles data: save plain float arrays with np.savez")
    raise DataError(f"{path} is not {what} (it starts with bytes {head[:8].hex(' ')}); save plain float arrays with np.savez")


def _check_npy_header(path: Path, f: object, what: str, size: int) -> None:
    """The shape and dtype an .npy header declares fit in the bytes that follow it (no huge allocation)."""
    from numpy.lib import format as npy_format

    try:
        version = npy_format.read_magic(f)  # type: ignore[arg-type]
    except ValueError:
        raise DataError(f"{path}: {what} is not a NumPy array (no .npy header); save plain float arrays with np.savez") from None
    try:
        read = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0  # 3.0: utf-8, same layout
        shape, _fortran, dtype = read(f)  # type: ignore[arg-type]
        header_end = f.tell()  # type: ignore[attr-defined]
    except ValueError as err:
        raise DataError(f"{path}: {what} has a malformed .npy header ({_first_line(err)}); save it with np.save or np.savez") from err
    if dtype.hasobject:
        raise DataError(f"{path} holds a pickled object array, which attn-export never loads; save plain float arrays with np.savez")
    needed = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if needed > size - header_end:
        raise DataError(
            f"{path}: {what} declares shape {tuple(shape)} of {dtype} ({needed:,} bytes) but holds {max(0, size - header_end):,}; "
            "the file is truncated or forged: regenerate it"
        )


def _load_npy(path: Path) -> np.ndarray:
    with open(path, "rb") as f:
        _check_npy_header(path, f, "the array", path.stat().st_size)
    return np.load(path, allow_pickle=False)


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
    check_data_scale(path, name, x)  # finite but overflowing float32 inside the layer (compress/calib_bounds.py)


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
    from attn_export.resources import available_memory, format_bytes

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
