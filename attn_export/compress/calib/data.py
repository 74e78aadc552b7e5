"""Calibration and validation activations: the two disjoint splits every compression step reads.

Every compression step needs inputs that look like what the layer sees in production:
low-rank whitening needs their second moment, distillation trains on them and int8 needs
their ranges. Every accuracy figure after compression must come from data the step never
saw, so a ``CalibrationData`` always holds two disjoint splits, ``calib`` and ``val``.

Files are read without unpickling (``calib_files``: ``np.load(allow_pickle=False)``,
safetensors) and checked for shape, dtype, finiteness and size before anything runs on
them; synthetic sets come from ``calib_generate``. The accepted layouts are documented in
``attn_export/data/calibration/README.md``.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attn_export.compress.calib.files import DEFAULT_MAX_BYTES, check_x, read_arrays
from attn_export.compress.calib.generate import generate_calibration
from attn_export.data import shipped_path
from attn_export.errors import DataError

__all__ = [
    "ActivationSet",
    "CalibrationData",
    "DEFAULT_MAX_BYTES",
    "default_calibration_path",
    "load_calibration",
]

log = logging.getLogger(__name__)

# Package data (attn_export/data/calibration/), read through importlib.resources so a wheel
# finds it as well as a source checkout.
SHIPPED_DIRS = (shipped_path("calibration"),)
_SPLITS = ("calib", "val")


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
    arrays = read_arrays(path, max_bytes)
    if "calib_x" in arrays or "val_x" in arrays:
        missing = [k for k in ("calib_x", "val_x") if k not in arrays]
        if missing:
            raise DataError(
                f"{path}: has {sorted(arrays)} but no {missing[0]}; store both calib_x and val_x, or a single x to split"
            )
        splits = {s: (arrays[f"{s}_x"], arrays.get(f"{s}_key_padding_mask")) for s in _SPLITS}
    elif "x" in arrays:
        x, kpm = arrays["x"], arrays.get("key_padding_mask")
        check_x(path, "x", x, d_model)
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


def _checked_set(path: Path, split: str, x: np.ndarray, kpm: np.ndarray | None, d_model: int | None) -> ActivationSet:
    check_x(path, f"{split}_x", x, d_model)
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

