"""Bad files through the library readers: calibration sets, engine sidecars, run manifests and
checkpoints. Each must raise an ``AttnExportError`` with a one-line message naming the file (never
a bare ``ValueError``/``TypeError``/``UnicodeDecodeError``), and read nothing it should not."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import rel_inputs as mk
from rel_helpers import assert_one_line_error

TRT_OWNER = "owned by the TensorRT work (runtime/trt_sidecar.py read_sidecar); see docs/reliability.md"


# -- calibration files (attn_export.compress.calib.data.load_calibration) -----------------------------
def _arrays_with(**override: object) -> Callable[[Path], Path]:
    def build(t: Path) -> Path:
        arrays = {**mk.calib_arrays(), **override}
        return mk.npz(t / "c.npz", **{k: v for k, v in arrays.items() if v is not None})

    return build


CALIB: dict[str, tuple[Callable[[Path], Path], str]] = {
    "c10-calib-random-bytes-npz": (lambda t: mk.random_bytes(t / "r.npz"), "not a .npz archive"),
    "c10-calib-random-bytes-npy": (lambda t: mk.random_bytes(t / "r.npy"), "not a .npy array"),
    "c10-calib-pickle-npy": (lambda t: mk.real_pickle(t / "p.npy"), "pickle"),
    "c10-calib-pickle-npz": (lambda t: mk.real_pickle(t / "p.npz"), "pickle"),
    "c10-calib-object-array": (lambda t: mk.npz(t / "o.npz", calib_x=np.array([{"a": 1}], dtype=object), val_x=np.zeros((1, 2, 3), np.float32)), "object array"),
    "c06-calib-forged-shape": (lambda t: mk.forged_npy(t / "f.npy"), "declares shape"),
    "c07-calib-empty-file": (lambda t: mk.make_file(t / "e.npz", ""), "empty"),
    "c07-calib-truncated-npz": (lambda t: mk.truncated(mk.npz(t / "ok.npz", **mk.calib_arrays()), t / "c.npz", 0.5), "cannot be read"),
    "c07-calib-int-dtype": (_arrays_with(calib_x=np.ones((4, 8, 32), np.int32)), "float"),
    "c07-calib-2d": (_arrays_with(calib_x=np.ones((4, 32), np.float32)), "3-D"),
    "c07-calib-empty-axis": (_arrays_with(calib_x=np.ones((0, 8, 32), np.float32)), "empty axis"),
    "c07-calib-mask-values": (_arrays_with(calib_key_padding_mask=np.full((8, 8), 7, np.int32)), "0/1"),
    "c07-calib-mask-shape": (_arrays_with(calib_key_padding_mask=np.ones((8, 3), np.int32)), "shape"),
    "c07-calib-all-masked": (_arrays_with(calib_key_padding_mask=np.zeros((8, 8), np.int32)), "masks every token"),
    "c07-calib-missing-val": (_arrays_with(val_x=None, val_key_padding_mask=None), "val_x"),
    "c07-calib-no-known-arrays": (lambda t: mk.npz(t / "c.npz", weights=np.zeros(3, np.float32)), "expected arrays"),
    "c08-calib-inf-values": (_arrays_with(calib_x=np.full((8, 8, 32), np.inf, np.float32)), "NaN/Inf"),
    "c08-calib-overlapping-splits": (_arrays_with(val_x=mk.calib_arrays()["calib_x"][:2], val_key_padding_mask=None), "disjoint"),
    "c10-calib-unknown-suffix": (lambda t: mk.make_file(t / "c.pkl", "x"), "unsupported format"),
}


@pytest.mark.parametrize("case", list(CALIB), ids=list(CALIB))
def test_bad_calibration_file_is_one_line_naming_the_file(case: str, tmp_path: Path) -> None:
    from attn_export.compress.calib.data import load_calibration
    from attn_export.errors import DataError

    build, expect = CALIB[case]
    path = build(tmp_path)
    with pytest.raises(Exception) as err:  # noqa: PT011 - the type is what is asserted
        load_calibration(path, 32)
    assert_one_line_error(err.value, DataError, expect)
    assert str(path) in str(err.value)
    if case.startswith("c10-calib-random"):
        assert "pickle" not in str(err.value), "random bytes are not a pickle"


def test_c10_calib_zip_bomb_is_refused_by_its_uncompressed_size(tmp_path: Path) -> None:
    from attn_export.compress.calib.data import load_calibration
    from attn_export.errors import DataError

    path = mk.npz(tmp_path / "z.npz", calib_x=np.zeros((64, 64, 64), np.float32), val_x=np.ones((1, 64, 64), np.float32))
    np.savez_compressed(path, calib_x=np.zeros((256, 256, 64), np.float32), val_x=np.ones((1, 256, 64), np.float32))
    assert path.stat().st_size < 200_000
    with pytest.raises(DataError) as err:
        load_calibration(path, 64, max_bytes=1_000_000)
    assert_one_line_error(err.value, DataError, "exceeds")


# -- engine sidecars (attn_export.runtime.tensorrt.sidecar.read_sidecar) ------------------------------------
def _sidecar(**override: object) -> dict:
    base = {"tensorrt_version": "10.3.0", "gpu_name": "Orin", "compute_capability": "8.7", "precision": "fp16", "strongly_typed": False,
            "builder_flags": [], "profiles": {}, "onnx_sha256": "0" * 64, "engine_sha256": "0" * 64, "engine_size_bytes": 4}  # fmt: skip
    base.update(override)
    return base


SIDECARS: dict[str, tuple[bytes | None, str | None, str | None]] = {
    # id: (sidecar bytes or None for no sidecar, expected words, xfail reason)
    "c07-sidecar-missing": (None, "no sidecar", None),
    "c07-sidecar-malformed-json": (b"{oops", "is not valid JSON", None),
    "c07-sidecar-a-list": (b"[]", "not a valid engine sidecar", None),
    "c07-sidecar-missing-fields": (json.dumps({"precision": "fp16"}).encode(), "not a valid engine sidecar", None),
    "c07-sidecar-non-utf8": (b"\xff\xfe\x00garbage\x80", "is not UTF-8 text", None),
    "c07-sidecar-schema-a-string": (json.dumps(_sidecar(schema="two")).encode(), "schema", None),
    "c07-sidecar-size-a-string": (json.dumps(_sidecar(engine_size_bytes="big")).encode(), "engine_size_bytes", None),
}


def _sidecar_params() -> list[object]:
    return [pytest.param(k, id=k, marks=[pytest.mark.xfail(strict=True, reason=v[2])] if v[2] else []) for k, v in SIDECARS.items()]


@pytest.mark.parametrize("case", _sidecar_params())
def test_bad_engine_sidecar_is_one_line(case: str, tmp_path: Path) -> None:
    from attn_export.errors import EngineError
    from attn_export.runtime.tensorrt.sidecar import read_sidecar, sidecar_path_for, verify_engine_file

    data, expect, _ = SIDECARS[case]
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"\0" * 8)
    if data is not None:
        sidecar_path_for(engine).write_bytes(data)
    with pytest.raises(Exception) as err:  # noqa: PT011
        verify_engine_file(engine, read_sidecar(engine))
    assert_one_line_error(err.value, EngineError, expect)


# -- run manifests (attn_export.outdir.claim) --------------------------------------------------------------
def _previous_run(out: Path, manifest: object) -> None:
    out.mkdir(parents=True)
    (out / "report.json").write_text("{}")
    (out / "run.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))


MANIFESTS: dict[str, tuple[object, str]] = {
    "c02-manifest-not-json": ("{oops", "run.json"),
    "c02-manifest-a-list": ([], "JSON object"),
    "c02-manifest-wrong-format": ({"format": "something-else/1", "status": "complete"}, "format"),
    "c02-manifest-bad-hash": ({"format": "attn-export-run/1", "status": "complete", "artifacts": {"model.onnx": {"sha256": "x", "size_bytes": 1}}}, "sha256"),
}


@pytest.mark.parametrize("case", list(MANIFESTS), ids=list(MANIFESTS))
def test_a_run_json_that_is_not_ours_makes_the_run_refuse_the_folder(case: str, tmp_path: Path) -> None:
    from attn_export.errors import ConfigError
    from attn_export.outdir.claim import claim

    manifest, expect = MANIFESTS[case]
    out = tmp_path / "out"
    _previous_run(out, manifest)
    before = sorted(os.listdir(out))
    with pytest.raises(ConfigError) as err, claim(out):
        pass
    assert_one_line_error(err.value, ConfigError, expect)
    assert sorted(os.listdir(out)) == before, "a refused claim must not touch the folder"


def test_c02_a_forged_manifest_never_removes_files_outside_out(tmp_path: Path) -> None:
    """A run.json listing ``../victim`` or an absolute path: only files inside --out are ever moved."""
    from attn_export.outdir.claim import claim

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    files = {name: {"sha256": "0" * 64, "size_bytes": 1} for name in ("../victim.txt", str(victim), "model.onnx")}
    _previous_run(out, {"format": "attn-export-run/1", "status": "complete", "artifacts": files})
    (out / "model.onnx").write_text("old")
    with claim(out, force=True) as owner:  # its files do not match the forged hashes: the user's (class 21), moved beside --out
        (owner.out / "model.onnx").write_text("new")
    assert victim.read_text() == "keep me"
    assert (out / "model.onnx").read_text() == "new"
    assert json.loads((out / "run.json").read_text())["artifacts"].keys() == {"model.onnx"}
    (aside,) = tmp_path.glob("out.attn-export-aside-*")
    assert sorted(os.listdir(aside)) == ["model.onnx", "report.json"] and (aside / "model.onnx").read_text() == "old"


# -- checkpoints: nothing outside the folder is opened --------------------------------------------------
def test_c05_symlinked_shard_and_config_outside_the_checkpoint_are_refused(tmp_path: Path) -> None:
    from attn_export.checkpoint.loader import load_bert_checkpoint, read_bert_config
    from attn_export.errors import CheckpointError

    outside = mk.checkpoint(tmp_path / "outside")
    ck = mk.checkpoint(tmp_path / "ck", weights=False)
    (ck / "model.safetensors").symlink_to(outside / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        load_bert_checkpoint(ck)
    assert_one_line_error(err.value, CheckpointError, "inside")
    ck2 = tmp_path / "ck2"
    ck2.mkdir()
    (ck2 / "config.json").symlink_to(outside / "config.json")
    with pytest.raises(CheckpointError) as err:
        read_bert_config(ck2)
    assert_one_line_error(err.value, CheckpointError, "inside")


def test_c05_huge_safetensors_header_is_refused_without_allocating(tmp_path: Path) -> None:
    from attn_export.checkpoint.loader import load_bert_checkpoint
    from attn_export.errors import CheckpointError

    ck = mk.checkpoint(tmp_path / "ck", weights=False)
    mk.huge_header_safetensors(ck / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        load_bert_checkpoint(ck)
    assert_one_line_error(err.value, CheckpointError)


def test_c06_the_divisor_suggestion_is_instant_for_any_d_model() -> None:
    from attn_export.vocab import choices as vocabulary
    from attn_export.errors import ConfigError
    from attn_export.layers.projections import check_heads

    bound = 2 * (vocabulary._DIVISOR_SEARCH + 1)  # candidates either side of the requested head count

    class CountingInt(int):  # counts the divisibility tests, and stops a search that is not bounded
        tests = 0

        def __mod__(self, other: int) -> int:
            CountingInt.tests += 1
            assert CountingInt.tests <= bound, f"more than {bound} divisibility tests: the search scans d_model"
            return int(self) % other

    # primes, asked for heads far from 1 as well: no divisor within the search, so the whole bound is walked
    for d_model, heads in ((999_999_937, 2), (2**61 - 1, 3), (10**12 + 39, 7), (999_999_937, 500_000_000), (2**61 - 1, 2**40)):
        with pytest.raises(ConfigError) as err:
            check_heads(d_model, heads)
        assert_one_line_error(err.value, ConfigError, "--heads")
        CountingInt.tests = 0
        suggestion = vocabulary._nearest_divisor(CountingInt(d_model), heads)
        assert d_model % suggestion == 0 and CountingInt.tests <= bound, (suggestion, CountingInt.tests)
    with pytest.raises(ConfigError, match="--heads 8"):
        check_heads(512, 7)
    with pytest.raises(ConfigError, match="integer"):
        check_heads(512, True)  # type: ignore[arg-type]
