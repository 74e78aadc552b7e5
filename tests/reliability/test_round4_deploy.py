"""Round four, deployment folders and the gate's JUnit file (issue 28, classes 21 and 29): nothing of the
user's in ``--bundle``, ``--triton``, ``--junit`` or ``report --out`` is overwritten or deleted.

Each case puts a user's files where the command writes (a ``thesis.txt`` and a ``sub/`` folder in
the bundle folder, a committed baseline named as ``--junit``, notes in a run folder) or points the
command at a folder it must not own (the parent of ``--out``, the current directory, ``--out``'s
bookkeeping), runs the real command, and checks the one-line refusal and that every file is
byte for byte as it was; ``--force`` moves the user's files into the folder the run names.
A folder another run holds (its ``flock``) is refused naming that run's PID.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rel_helpers import TINY, assert_refused, files_of, run_cli, stamped_run

from attn_export.outdir.claim import LOCK_NAME
from attn_export.outdir.fs import OutDir, take_lock

JETSON = [*TINY, "--target", "jetson"]
USERS = {"thesis.txt": b"chapter one, not attn-export's\n", "sub/data.csv": b"1,2,3\n"}


def _users_folder(folder: Path) -> dict[str, bytes]:
    for rel, data in USERS.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return files_of(folder)


class _Held:
    """The lock a run holds on a folder, taken the way a run takes it (``run_dir_fs.take_lock``)."""

    def __init__(self, folder: Path, pid: int = 4242) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.od = OutDir(folder, "--out")
        self.fd = take_lock(self.od, LOCK_NAME, {"pid": pid, "started": "2026-01-01T00:00:00+00:00"})

    def release(self) -> None:
        os.unlink(LOCK_NAME, dir_fd=self.od.fd)
        os.close(self.fd)
        self.od.close()


# -- --bundle / --triton: a folder with the user's files -----------------------------------------------
@pytest.mark.parametrize("flag", ["--bundle", "--triton"])
def test_c21_a_deploy_folder_with_users_files_is_refused_and_left_alone(flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if flag == "--triton":
        pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="tritonclient[grpc] writes the Triton configs")
    folder = tmp_path / "deploy"
    before = _users_folder(folder)
    o = run_cli([*JETSON, flag, folder, "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o, "did not write", max_seconds=60)
    assert files_of(folder) == before and sorted(os.listdir(folder)) == ["sub", "thesis.txt"]


def test_c29_the_refusal_names_the_first_foreign_file_and_both_fixes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "bundle"
    _users_folder(folder)
    o = run_cli([*JETSON, "--bundle", folder, "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o, "'sub' (and 1 more)", max_seconds=60)
    for words in ("--bundle", "pass another --bundle", "--force", "bundle.attn-export-aside-"):
        assert words in o.err, (words, o.err)


def test_c21_force_moves_the_users_files_aside_byte_for_byte_and_a_rerun_replaces_only_its_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle, out = tmp_path / "bundle", tmp_path / "out"
    before = _users_folder(bundle)
    o = run_cli([*JETSON, "--bundle", bundle, "--out", out, "--force", "--quiet"], capsys, tmp_path)
    assert o.code == 0, o.err
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("bundle.attn-export-aside-")]
    assert files_of(aside) == before
    assert "thesis.txt" not in os.listdir(bundle) and (bundle / "bundle.json").is_file()
    report = (out / "report.json").read_text()
    assert str(aside) in report  # the run names where the user's files went
    # a second run replaces the first bundle (ours) without --force, and keeps the bundle's manifest
    first = files_of(bundle)
    o = run_cli([*JETSON, "--bundle", bundle, "--out", tmp_path / "out2", "--seed", "1", "--quiet"], capsys, tmp_path)
    assert o.code == 0, o.err
    assert files_of(bundle)["reference.npz"] != first["reference.npz"] and files_of(aside) == before


def test_c21_force_on_a_bundle_inside_out_keeps_the_aside_folder_out_of_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The aside folder of a bundle inside --out is made before --out is claimed: run.json never lists the
    user's files as the run's own (the next run would discard them, a failed one delete them)."""
    import json

    out = tmp_path / "out"
    before = _users_folder(out / "b")
    o = run_cli([*JETSON, "--bundle", out / "b", "--out", out, "--force", "--quiet"], capsys, tmp_path)
    assert o.code == 0, o.err
    (aside,) = [p for p in out.iterdir() if p.name.startswith("b.attn-export-aside-")]
    assert files_of(aside) == before
    listed = json.loads((out / "run.json").read_text())["artifacts"]
    assert (out / "b" / "bundle.json").is_file() and not [rel for rel in listed if rel.startswith(aside.name)]


def test_c21_our_own_file_edited_by_the_user_is_not_ours_any_more(tmp_path: Path) -> None:
    """The manifest vouches for bytes, not names: an edited README is the user's and is refused."""
    from attn_export.deploy.folder import foreign_entries, publish, staging
    from attn_export.errors import ConfigError

    repo = tmp_path / "repo"
    with staging(repo) as tmp:
        (tmp / "README.md").write_text("ours\n")
        (tmp / "m" / "1").mkdir(parents=True)
        (tmp / "m" / "1" / "model.onnx").write_bytes(b"ours")
        publish(tmp, repo, "--triton", "test")
    assert foreign_entries(repo) == []
    (repo / "README.md").write_text("my notes on our README\n")
    (repo / "m" / "2").mkdir()
    (repo / "m" / "2" / "model.onnx").write_bytes(b"the user's model version 2")
    assert foreign_entries(repo) == ["README.md", "m/2"]
    with pytest.raises(ConfigError, match="did not write"), staging(repo) as tmp:
        (tmp / "README.md").write_text("new\n")
        publish(tmp, repo, "--triton", "test")
    assert (repo / "README.md").read_text() == "my notes on our README\n" and (repo / "m" / "2" / "model.onnx").read_bytes() == b"the user's model version 2"


def test_c21_the_triton_writer_never_clears_a_model_folder(tmp_path: Path) -> None:
    """``write_triton_repo`` used to ``rmtree`` ``<repo>/<model>`` with whatever else it held."""
    pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="tritonclient[grpc] writes the Triton configs")
    from fixtures import small_layer

    from attn_export.deploy.triton_repo import write_triton_repo
    from attn_export.errors import ConfigError
    from attn_export.export import ExportSpec, export_onnx

    model = tmp_path / "model.onnx"
    export_onnx(small_layer("transformer", "padding", d_model=32, heads=2), model, ExportSpec())
    repo = write_triton_repo(tmp_path / "repo", "attn", model)
    again = write_triton_repo(tmp_path / "repo", "attn", model)  # our own files: replaced
    assert again == repo and (repo / "attn" / "1" / "model.onnx").read_bytes() == model.read_bytes()
    (repo / "attn" / "2").mkdir()
    (repo / "attn" / "2" / "model.onnx").write_bytes(b"the user's version 2")
    with pytest.raises(ConfigError, match="attn/2"):
        write_triton_repo(tmp_path / "repo", "attn", model)
    assert (repo / "attn" / "2" / "model.onnx").read_bytes() == b"the user's version 2"


# -- --bundle / --triton: folders a run must not own ----------------------------------------------
PLACES = {
    "c21-bundle-is-the-parent-of-out": (["--bundle", "p", "--out", "p/out"], "above --out"),
    "c21-bundle-is-the-current-directory": (["--bundle", ".", "--out", "../../o"], "current directory"),
    "c21-bundle-is-above-the-current-directory": (["--bundle", "..", "--out", "../../o"], "current directory"),
    "c21-bundle-in-outs-previous-folder": (["--bundle", "out/.attn-export-previous/b", "--out", "out"], "bookkeeping"),
    "c21-triton-in-outs-previous-folder": (["--triton", "out/.attn-export-previous/t", "--out", "out"], "bookkeeping"),
    "c21-bundle-and-triton-the-same": (["--bundle", "d", "--triton", "d", "--out", "out"], "same folder"),
    "c21-triton-inside-bundle": (["--bundle", "d", "--triton", "d/t", "--out", "out"], "inside --bundle"),
}


@pytest.mark.parametrize("case", list(PLACES))
def test_c21_a_deploy_folder_that_is_not_its_own_is_refused(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    if "triton" in case:
        pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="tritonclient[grpc] writes the Triton configs")
    here = tmp_path / "p" / "here"
    here.mkdir(parents=True)
    (tmp_path / "p" / "notes.txt").write_text("the user's\n")
    (here / "notes.txt").write_text("the user's too\n")
    monkeypatch.chdir(here if "current" in case else tmp_path)
    args, expect = PLACES[case]
    before = files_of(tmp_path)
    o = run_cli([*JETSON, *args], capsys, tmp_path)
    assert_refused(o, expect, max_seconds=60)
    assert files_of(tmp_path) == before


# -- the lock ------------------------------------------------------------------------------------
def test_c21_a_bundle_another_run_holds_is_refused_naming_its_pid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two runs with different --out and the same --bundle: the second is refused at once, before any work."""
    bundle = tmp_path / "bundle"
    held = _Held(bundle, pid=4242)
    try:
        o = run_cli([*JETSON, "--bundle", bundle, "--out", tmp_path / "out"], capsys, tmp_path)
    finally:
        held.release()
    assert_refused(o, "in use by another attn-export run (PID 4242", max_seconds=60)
    assert os.listdir(bundle) == []


# -- check --junit --------------------------------------------------------------------------------
@pytest.fixture
def gate(tmp_path: Path) -> tuple[Path, Path]:
    from attn_export.cli import main

    report = stamped_run(tmp_path / "run")
    baseline = tmp_path / "baseline.json"
    assert main(["check", str(report), "--baseline", str(baseline), "--update-baseline", "--quiet"]) == 0
    return report, baseline


@pytest.mark.parametrize("case", ["baseline", "report", "run-json", "hard-link-to-baseline", "symlink-to-report"])
def test_c21_junit_onto_an_input_file_is_refused(case: str, gate: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report, baseline = gate
    junit = {"baseline": baseline, "report": report, "run-json": report.parent / "run.json"}.get(case, tmp_path / "ci" / "junit.xml")
    if case.startswith("hard-link"):
        junit.parent.mkdir()
        os.link(baseline, junit)
    elif case.startswith("symlink"):
        junit.parent.mkdir()
        junit.symlink_to(report)
    before = files_of(tmp_path)
    o = run_cli(["check", report, "--baseline", baseline, "--junit", junit], capsys, tmp_path)
    assert_refused(o, "--junit")
    assert "is the" in o.err and files_of(tmp_path) == before


def test_c21_junit_over_a_file_it_did_not_write_needs_force(gate: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report, baseline = gate
    junit = tmp_path / "results.xml"
    junit.write_text("<notes>the user's</notes>\n")
    o = run_cli(["check", report, "--baseline", baseline, "--junit", junit], capsys, tmp_path)
    assert_refused(o, "--force")
    assert junit.read_text() == "<notes>the user's</notes>\n"
    assert run_cli(["check", report, "--baseline", baseline, "--junit", junit, "--force", "--quiet"], capsys, tmp_path).code == 0
    assert junit.read_text().startswith('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites name="attn-export-gate"')
    junit.write_text("stale")  # ours no more: refused again
    assert run_cli(["check", report, "--baseline", baseline, "--junit", junit, "--quiet"], capsys, tmp_path).code == 2
    os.unlink(junit)
    assert run_cli(["check", report, "--baseline", baseline, "--junit", junit, "--quiet"], capsys, tmp_path).code == 0
    assert run_cli(["check", report, "--baseline", baseline, "--junit", junit, "--quiet"], capsys, tmp_path).code == 0  # our own: replaced


# -- report --out ------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["the-run-folder", "another-folder"])
def test_c21_report_into_a_folder_another_run_holds_is_refused(where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = stamped_run(tmp_path / "run")
    target = report.parent if where == "the-run-folder" else tmp_path / "other"
    before = files_of(tmp_path)
    held = _Held(target, pid=4343)
    try:
        o = run_cli(["report", report, "--out", target, "--no-attention-maps"], capsys, tmp_path)
    finally:
        held.release()
    assert_refused(o, "in use by another attn-export run (PID 4343")
    assert files_of(tmp_path) == before


def test_c21_report_never_overwrites_a_users_report_md(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = stamped_run(tmp_path / "run")
    assert run_cli(["report", report, "--no-attention-maps", "--quiet"], capsys, tmp_path).code == 0
    assert run_cli(["report", report, "--no-attention-maps", "--quiet"], capsys, tmp_path).code == 0  # what it rendered: replaced
    (report.parent / "report.md").write_text("my own notes\n")
    before = files_of(tmp_path)
    o = run_cli(["report", report, "--no-attention-maps"], capsys, tmp_path)
    assert_refused(o, "report.md")
    assert files_of(tmp_path) == before
