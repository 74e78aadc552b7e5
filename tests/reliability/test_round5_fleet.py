"""The fleet (issue 39): a cache entry is verified before it is served, its key holds the content of
every input, and every input of a fleet (the file, texts, checkpoints, the cache, ``--ray``) is
checked before any work.

One real tiny fleet (the one-point fleet of docs/fleet.md) is built once per module; each cache
test tampers with a copy of it and reruns that one point (seconds). The key tests compare keys of
``build_points`` (no run); the refusals run the CLI in one subprocess that a hang cannot block.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from rel_helpers import assert_refused, run_cli, run_cli_batch
from rel_inputs import calib_arrays, checkpoint, hf_tensors, npz

from attn_export.campaigns.fleet.matrix import build_points
from attn_export.campaigns.fleet.schema import load_fleet
from attn_export.cli.fleet import main_command_config
from attn_export.outdir.manifest import sha256_file

OPTIONS = "--repeats 1 --warmup 0 --seq-len 8 --batch 2 --threads 1"
LAYER = "--d-model 32 --heads 4"
F_TOML = f"""[fleet]
options = "{OPTIONS}"
[[models]]
name = "tiny"
options = "{LAYER}"
[[recipes]]
name = "fp32"
[[targets]]
name = "cpu"
target = "ort-cpu"
"""


def _fleet(args: list[str]) -> int:
    from attn_export.cli import main

    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return main(args)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """F.toml run once: its cache holds one entry, fleet-out its point."""
    root = tmp_path_factory.mktemp("fleet-built")
    (root / "F.toml").write_text(F_TOML, encoding="utf-8")
    assert _fleet(["fleet", str(root / "F.toml"), "--quiet"]) == 0
    return root


def _copy(built: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A private copy of the built fleet: (its F.toml, its one cache entry)."""
    root = tmp_path / "w"
    shutil.copytree(built, root, symlinks=True)
    (entry,) = [p for p in (root / ".attn-export-cache" / "entries").iterdir() if not p.name.startswith(".")]
    return root / "F.toml", entry


# -- c30: a tampered entry is rebuilt, and the user is told -----------------------------------------
def _replace_model(entry: Path, tmp: Path) -> None:  # cp other.onnx .attn-export-cache/entries/*/model.onnx
    (entry / "model.onnx").write_bytes(b"\x08\x07planted, not the model that was judged")


def _replace_model_and_manifest(entry: Path, tmp: Path) -> None:
    """The model replaced and run.json rewritten to list it: the manifest no longer matches the key's record."""
    _replace_model(entry, tmp)
    manifest = json.loads((entry / "run.json").read_text())
    manifest["artifacts"]["model.onnx"] = {
        "sha256": sha256_file(entry / "model.onnx"),
        "size_bytes": (entry / "model.onnx").stat().st_size,
    }
    (entry / "run.json").write_text(json.dumps(manifest, indent=2) + "\n")


def _edit_report(entry: Path, tmp: Path) -> None:
    report = json.loads((entry / "report.json").read_text())
    report["verdict"].update(passed=True, state="PASS")
    report["stages"][-1]["accuracy"]["sqnr_db"] = 99.0
    (entry / "report.json").write_text(json.dumps(report))


def _remove_model(entry: Path, tmp: Path) -> None:
    (entry / "model.onnx").unlink()


def _link_out(entry: Path, tmp: Path) -> None:
    """The entry is a link to a folder outside the cache (holding a full copy, its record included)."""
    outside = tmp / "outside"
    shutil.move(entry, outside)
    entry.symlink_to(outside, target_is_directory=True)


def _report_not_json(entry: Path, tmp: Path) -> None:
    (entry / "report.json").write_text("{ not json")


def _report_without_verdict(entry: Path, tmp: Path) -> None:
    report = json.loads((entry / "report.json").read_text())
    del report["verdict"]["passed"]
    (entry / "report.json").write_text(json.dumps(report))


TAMPER: dict[str, Callable[[Path, Path], None]] = {
    "c30-model-replaced": _replace_model,
    "c30-model-and-manifest-replaced": _replace_model_and_manifest,
    "c30-failing-report-edited-to-pass": _edit_report,
    "c30-model-missing": _remove_model,
    "c30-entry-linked-out-of-the-cache": _link_out,
    "c30-report-not-json": _report_not_json,
    "c30-report-without-verdict-passed": _report_without_verdict,
}


@pytest.mark.parametrize("tamper", list(TAMPER), ids=list(TAMPER))
def test_c30_a_tampered_cache_entry_is_rebuilt_and_said(
    built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], tamper: str
) -> None:
    fleet_file, entry = _copy(built, tmp_path)
    TAMPER[tamper](entry, tmp_path)
    outside = (
        {p.name: p.read_bytes() for p in (tmp_path / "outside").iterdir()} if (tmp_path / "outside").is_dir() else None
    )
    o = run_cli(["fleet", fleet_file, "--json"], capsys, tmp_path)
    assert o.code == 0, o.err
    assert "Traceback" not in o.err and "internal error" not in o.err, o.err
    said = [line for line in o.err_lines if "failed verification" in line]
    assert len(said) == 1 and f"cache entry {entry.name} for point tiny/fp32/cpu" in said[0] and "rebuil" in said[0], (
        o.err_lines
    )
    (row,) = json.loads(o.out)["points"]
    assert row["status"] == "passed", row  # rebuilt and judged, not "cached"
    assert not entry.is_symlink() and entry.is_dir()
    manifest = json.loads((entry / "run.json").read_text())
    served = fleet_file.parent / "fleet-out" / "points" / "tiny" / "fp32" / "cpu"
    for name in ("model.onnx", "report.json"):
        assert sha256_file(served / name) == manifest["artifacts"][name]["sha256"] == sha256_file(entry / name), name
    if outside is not None:  # the folder the link pointed at is the user's: untouched
        assert {p.name: p.read_bytes() for p in (tmp_path / "outside").iterdir()} == outside


def test_c30_an_untouched_entry_is_still_a_hit(built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The verification passes what the fleet wrote (the guard against a check that refuses everything)."""
    fleet_file, _ = _copy(built, tmp_path)
    o = run_cli(["fleet", fleet_file, "--json"], capsys, tmp_path)
    assert o.code == 0 and json.loads(o.out)["points"][0]["status"] == "cached", o.err
    assert not [line for line in o.err_lines if "verification" in line]


# -- c30: the key holds the content of every input --------------------------------------------------
def _keys(fleet_file: Path) -> dict[str, str]:
    return {p.key: p.cache_key for p in build_points(load_fleet(fleet_file), main_command_config)}


def test_c30_editing_fleet_texts_changes_the_keys_of_the_points_that_calibrate_on_them(tmp_path: Path) -> None:
    npz(tmp_path / "texts.npz", **calib_arrays(seed=0))
    fleet_file = tmp_path / "F.toml"
    fleet_file.write_text(F_TOML.replace("[fleet]\n", '[fleet]\ntexts = "texts.npz"\n')
                          + '[[recipes]]\nname = "int8"\noptions = "--quantize int8"\n')  # fmt: skip
    before = _keys(fleet_file)
    npz(tmp_path / "texts.npz", **calib_arrays(seed=1))  # same path, other content
    after = _keys(fleet_file)
    assert after["tiny/int8/cpu"] != before["tiny/int8/cpu"]
    assert after["tiny/fp32/cpu"] == before["tiny/fp32/cpu"]  # it does not read the texts


def test_c30_replacing_a_recipes_checkpoint_changes_its_key(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    checkpoint(tmp_path / "ckc")
    fleet_file = tmp_path / "F.toml"
    fleet_file.write_text(
        F_TOML.replace(f'options = "{LAYER}"', 'options = ""').replace(
            'name = "fp32"', 'name = "ck"\noptions = "--checkpoint ckc"'
        )
    )
    before = _keys(fleet_file)
    save_file(hf_tensors(seed=1), str(tmp_path / "ckc" / "model.safetensors"))  # another model under the same name
    assert _keys(fleet_file) != before


def test_c30_a_relative_checkpoint_is_relative_to_the_fleet_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = tmp_path / "sub"
    checkpoint(sub / "ck")
    (sub / "F.toml").write_text(F_TOML.replace(f'options = "{LAYER}"', 'checkpoint = "ck"'))
    checkpoint(tmp_path / "ck")  # a folder of the same name in the current folder: not the one the file names
    monkeypatch.chdir(tmp_path)
    spec = load_fleet(Path("sub/F.toml"))
    assert Path(spec.models[0].checkpoint).resolve() == (sub / "ck").resolve()
    (p,) = build_points(spec, main_command_config)
    assert Path(p.config.checkpoint).resolve() == (sub / "ck").resolve()


# -- c33: every input is checked before any work ----------------------------------------------------
def _cases(tmp: Path) -> dict[str, tuple[list[object], Path, str]]:
    """id -> (argv, folder, what the one line says)."""
    cases: dict[str, tuple[list[object], Path, str]] = {}

    def add(
        cid: str,
        toml: str | bytes | None,
        expect: str,
        extra: list[object] = (),
        setup: Callable[[Path], None] | None = None,
    ) -> None:
        folder = tmp / cid
        folder.mkdir()
        if isinstance(toml, bytes):
            (folder / "F.toml").write_bytes(toml)
        elif toml is not None:
            (folder / "F.toml").write_text(toml, encoding="utf-8")
        if setup is not None:
            setup(folder)
        cases[cid] = (["fleet", "F.toml", *extra], folder, expect)

    add("c33-fleet-file-not-utf8", F_TOML.encode() + b"# caf\xe9\n", "not UTF-8")
    add("c33-fleet-file-is-a-folder", None, "is a directory", setup=lambda f: (f / "F.toml").mkdir())
    add("c33-fleet-file-nested-5000-deep", "x = " + "[" * 5000 + "]" * 5000 + "\n" + F_TOML, "nested")
    add("c33-model-name-300-characters", F_TOML.replace('name = "tiny"', f'name = "{"m" * 300}"'), "at most")
    add("c33-missing-fleet-texts", F_TOML.replace("[fleet]\n", '[fleet]\ntexts = "texts.npz"\n')
        + '[[recipes]]\nname = "int8"\noptions = "--quantize int8"\n', "texts.npz")  # fmt: skip
    texts_only = F_TOML.replace("[fleet]\n", '[fleet]\ntexts = "texts.npz"\n')
    add("c33-missing-fleet-texts-no-point-reads", texts_only, "texts.npz")
    add(
        "c33-checkpoint-usr-is-not-a-checkpoint-folder",
        F_TOML.replace(f'options = "{LAYER}"', 'checkpoint = "/usr"'),
        "config.json",
    )
    add("c33-cache-inside-out", F_TOML.replace("[fleet]\n", '[fleet]\nout = "fo"\ncache = "fo/cache"\n'), "inside")
    for opt, target in (
        ("--out", "ort-cpu"),
        ("--bundle", "jetson"),
        ("--triton", "tensorrt"),
    ):  # each on a target that takes it
        toml = F_TOML.replace('name = "fp32"', f'name = "fp32"\noptions = "{opt} somewhere"').replace(
            '"ort-cpu"', f'"{target}"'
        )
        add(f"c33-recipe-{opt[2:]}", toml, opt)
    add("c33-ray-nonsense", F_TOML, "--ray", ["--ray", "nonsense"])
    add("c33-ray-empty", F_TOML, "--ray", ["--ray", ""])
    add("c33-ray-nothing-listening", F_TOML, "cannot reach a Ray cluster at 127.0.0.1:1", ["--ray", "127.0.0.1:1"])
    (tmp / "c14-fleet-file-dev-zero").mkdir()
    cases["c14-fleet-file-dev-zero"] = (["fleet", "/dev/zero"], tmp / "c14-fleet-file-dev-zero", "not a regular file")
    return cases


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[object, str]]:
    tmp = tmp_path_factory.mktemp("fleet-refusals")
    cases = _cases(tmp)
    outcomes = run_cli_batch({cid: (argv, folder) for cid, (argv, folder, _) in cases.items()}, timeout=150)
    return {cid: (outcomes[cid], expect) for cid, (_a, _f, expect) in cases.items()}


REFUSAL_IDS = [
    "c33-fleet-file-not-utf8", "c33-fleet-file-is-a-folder", "c33-fleet-file-nested-5000-deep",
    "c33-model-name-300-characters", "c33-missing-fleet-texts", "c33-checkpoint-usr-is-not-a-checkpoint-folder",
    "c33-cache-inside-out", "c33-recipe-out", "c33-recipe-bundle", "c33-recipe-triton", "c33-ray-nonsense",
    "c33-ray-empty", "c33-ray-nothing-listening", "c14-fleet-file-dev-zero", "c33-missing-fleet-texts-no-point-reads",
]  # fmt: skip


@pytest.mark.parametrize("cid", REFUSAL_IDS, ids=REFUSAL_IDS)
def test_c33_a_bad_fleet_input_is_refused_in_one_line_before_work(
    refusals: dict[str, tuple[object, str]], cid: str
) -> None:
    outcome, expect = refusals[cid]
    assert_refused(outcome, expect)  # type: ignore[arg-type]


def test_c33_the_checkpoint_check_comes_before_hashing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``checkpoint = "/usr"``: refused by its missing config.json, before a single file of it is hashed."""
    import attn_export.campaigns.fleet.inputs as inputs

    hashed: list[str] = []
    real = inputs.sha256_file
    monkeypatch.setattr(inputs, "sha256_file", lambda p: hashed.append(str(p)) or real(p))
    (tmp_path / "F.toml").write_text(F_TOML.replace(f'options = "{LAYER}"', 'checkpoint = "/usr"'))
    o = run_cli(["fleet", tmp_path / "F.toml"], capsys, tmp_path)
    assert_refused(o, "config.json")
    assert hashed == []


def test_c33_an_oversized_checkpoint_folder_is_refused_before_hashing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import attn_export.campaigns.fleet.inputs as inputs

    checkpoint(tmp_path / "ck")
    for n in range(5):
        (tmp_path / "ck" / f"extra{n}.bin").write_bytes(np.zeros(8, np.uint8).tobytes())
    monkeypatch.setattr(inputs, "MAX_CHECKPOINT_FILES", 4)
    (tmp_path / "F.toml").write_text(F_TOML.replace(f'options = "{LAYER}"', 'checkpoint = "ck"'))
    o = run_cli(["fleet", tmp_path / "F.toml"], capsys, tmp_path)
    assert_refused(o, "files")


def test_c30_an_entry_changed_after_it_was_verified_is_not_copied_into_fleet_out(built: Path, tmp_path: Path) -> None:
    """The copy in fleet-out is checked too: a file changed between the hit and the copy fails that point."""
    from attn_export.campaigns.fleet.local import run_local
    from attn_export.campaigns.fleet.result import fleet_result, write_fleet

    fleet_file, entry = _copy(built, tmp_path)
    spec = load_fleet(fleet_file)
    points = build_points(spec, main_command_config)
    records = run_local(points, str(spec.fleet.cache), 2**30, lambda *a: None)
    assert records["tiny/fp32/cpu"]["status"] == "cached"
    _replace_model(entry, tmp_path)  # after the hit was verified, before fleet-out is written
    result = fleet_result(points, records)
    write_fleet(result, spec.fleet.out)
    (row,) = result["points"]
    assert row["status"] == "failed" and "changed after it was verified" in row["reason"], row
    assert result["counts"] == {"failed": 1} and result["pareto"]["cpu"] == []
    assert not (spec.fleet.out / "points" / "tiny" / "fp32" / "cpu").exists()
