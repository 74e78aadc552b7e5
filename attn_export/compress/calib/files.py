"""Calibration files, read safely: no pickle, bounded sizes, the containers and headers checked before a byte is parsed.

``calib_data.load_calibration`` reads its arrays through ``read_arrays`` (``.npz``, ``.npy``,
a folder of ``.npy``, ``.safetensors``): ``np.load(allow_pickle=False)`` and safetensors only,
a FIFO or a device refused from its stat, every ``.npy`` header parsed and bounded before the
data is mapped, and ``check_x`` holds each activation array to its shape, dtype and finiteness.
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

import numpy as np

from attn_export.compress.calib.bounds import check_data_scale
from attn_export.errors import DataError

__all__ = ["DEFAULT_MAX_BYTES", "check_arrays_file", "check_x", "read_arrays"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 512 * 2**20  # a calibration file larger than this is refused (--max-bytes raises it)
_KEYS = ("calib_x", "calib_key_padding_mask", "val_x", "val_key_padding_mask", "x", "key_padding_mask")


def check_arrays_file(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> list[Path]:
    """What a calibration file's stat and first bytes tell: it exists, is regular (or a folder of ``.npy``), not empty,
    within ``max_bytes`` (an ``.npz`` by its uncompressed size) and starts like its format; its files, in order.

    numpy only, no torch: the subject's preflight (``subjects.kinds``) runs it on ``--calib`` before torch is
    imported, and ``read_arrays`` runs it again before it parses a byte (one rule, refused in a second)."""
    path = Path(path)
    if not path.exists():
        raise DataError(
            f"calibration data {path} does not exist; use the shipped default or run attn-export calib generate --out {path}"
        )
    from attn_export.host.paths import check_regular_file

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
    return files


def read_arrays(path: Path, max_bytes: int) -> dict[str, np.ndarray]:
    files = check_arrays_file(path, max_bytes)
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


def check_x(path: Path, name: str, x: np.ndarray, d_model: int | None) -> None:
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
    check_data_scale(path, name, x)  # finite but overflowing float32 inside the layer (compress/calib/bounds.py)
