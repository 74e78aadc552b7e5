"""Round five, output-folder ownership (issue 39, class 32): a folder of the user's named like our bookkeeping.

A name proved nothing: a user's ``bundle/.attn-export-staging-mine/`` was deleted as a staging
leftover (and the run said PASS), and a user's ``out/.attn-export-previous/keep.txt`` was taken
for an interrupted run (the folder removed, ``keep.txt`` moved into ``out/``). Now only what
carries the record a run of ours leaves (``outdir.bookkeeping``: a marker with the run's id) is
ours. Each case plants such a folder where a command writes, runs the real command (or, where
the command needs a backend this suite does not assume, the check it calls before any work),
and checks the one-line refusal naming the folder and ``--force``, and that every file is byte
for byte where it was; ``--force`` moves the folder, whole, into ``DIR.attn-export-aside-<time>``.
Our own bookkeeping (a killed run's aside folder) is still recognised and put back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rel_helpers import TINY, asides, assert_refused, earlier_run, files_of, good_report, plant, run_cli, write_json

from attn_export.errors import ConfigError

KEEP = {".attn-export-previous/keep.txt": b"the user's notes, not a run's\n"}
STAGING = {".attn-export-staging-mine/k.txt": b"the user's draft\n"}


def _report_args(t: Path) -> list[object]:
    return ["report", write_json(t / "src" / "report.json", good_report()), "--no-attention-maps"]


# -- --out of every command that writes one ---------------------------------------------------------
COMMANDS = {
    "main": [*TINY],
    "encoder": ["encoder"],
    "sweep": ["sweep", "--quick"],
    "bench": ["bench", "--quick"],
    "report": None,
}


@pytest.mark.parametrize("planted", [KEEP, STAGING, {".attn-export-discard-1/x.txt": b"mine\n"}], ids=["c32-previous", "c32-staging", "c32-discard"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_c32_a_users_folder_named_like_our_bookkeeping_in_out_is_refused_and_kept(command: str, planted: dict[str, bytes], tmp_path: Path,
                                                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "out"
    before = plant(out, planted)
    head = _report_args(tmp_path) if COMMANDS[command] is None else COMMANDS[command]
    o = run_cli([*head, "--out", out], capsys, tmp_path)
    assert_refused(o, "which attn-export did not make")
    name = next(iter(planted)).split("/")[0]
    assert f"{out / name}" in o.err and "--force" in o.err and f"{out}.attn-export-aside-" in o.err, o.err
    assert files_of(out) == before and sorted(os.listdir(out)) == [name] and not asides(out)


def test_c32_the_issues_keep_txt_is_neither_removed_nor_moved_into_out(tmp_path: Path) -> None:
    """The claim itself (what runs under the lock), on a folder with an earlier complete run of ours."""
    from attn_export.outdir.claim import claim

    out = tmp_path / "out"
    earlier = earlier_run(out)
    before = plant(out, KEEP)
    with pytest.raises(ConfigError, match=r"\.attn-export-previous, which attn-export did not make"), claim(out):
        pass
    assert files_of(out) == before and not (out / "keep.txt").exists()
    assert {k: v for k, v in before.items() if k in earlier} == earlier


def test_c32_force_moves_the_users_previous_folder_aside_whole_and_the_run_completes(tmp_path: Path) -> None:
    from attn_export.outdir.claim import claim

    out = tmp_path / "out"
    earlier_run(out)
    plant(out, KEEP)
    with claim(out, force=True) as owner:
        (owner.out / "model.onnx").write_bytes(b"new")
    (aside,) = asides(out)
    assert files_of(aside) == KEEP and not (out / "keep.txt").exists()
    assert sorted(os.listdir(out)) == ["model.onnx", "run.json"]
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "complete" and manifest["moved_aside"]["files"] == [".attn-export-previous"]


def test_c32_a_user_file_at_the_locks_name_is_never_truncated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    before = plant(out, {".attn-export.lock": b"my lock notes\n"})
    o = run_cli([*TINY, "--out", out], capsys, tmp_path)
    assert_refused(o, "not a lock attn-export wrote")
    assert files_of(out) == before


# -- our own bookkeeping is still ours ----------------------------------------------------------------
def test_c32_a_killed_runs_own_aside_folder_is_still_put_back(tmp_path: Path) -> None:
    """A run killed after it moved the earlier run aside (its marker in place, its run.json "running")."""
    from attn_export.outdir.claim import RunDir, claim

    out = tmp_path / "out"
    earlier = earlier_run(out)
    killed = RunDir(out).acquire()  # the earlier run aside, run.json "running"
    (out / "model.onnx").write_bytes(b"half-written by the killed run")
    os.close(killed._fd)  # the kernel drops the flock of a dead process; nothing of abort() runs
    killed.dir.close()
    assert (out / ".attn-export-previous" / ".attn-export-moved").is_file()
    with pytest.raises(RuntimeError), claim(out):  # the next run recovers, then fails: the earlier run must be whole again
        raise RuntimeError("the next run fails")
    assert files_of(out) == earlier


def test_c32_a_marker_from_another_format_does_not_make_a_users_folder_ours(tmp_path: Path) -> None:
    from attn_export.outdir.claim import claim

    out = tmp_path / "out"
    before = plant(out, {**KEEP, ".attn-export-previous/.attn-export-moved": b'{"pid": 1, "files": ["keep.txt"]}'})
    with pytest.raises(ConfigError, match="did not make"), claim(out):
        pass
    assert files_of(out) == before


# -- deployment folders: --bundle, --triton, golden record's --golden, fleet's --out ---------------------
@pytest.mark.parametrize("flag", ["--bundle", "--triton"], ids=["c32-bundle", "c32-triton"])
def test_c32_a_users_staging_named_folder_in_a_deploy_folder_is_refused_and_kept(flag: str, tmp_path: Path,
                                                                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    if flag == "--triton":
        pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="tritonclient[grpc] writes the Triton configs")
    folder = tmp_path / "b"
    before = plant(folder, STAGING)
    o = run_cli([*TINY, "--target", "jetson", flag, folder, "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o, ".attn-export-staging-mine")
    assert "did not write" in o.err and "--force" in o.err, o.err
    assert files_of(folder) == before and sorted(os.listdir(folder)) == [".attn-export-staging-mine"]


@pytest.mark.parametrize("flag", ["--golden", "--out"], ids=["c32-golden-record", "c32-fleet-out"])
def test_c32_golden_and_fleet_folders_refuse_a_users_staging_named_folder(flag: str, tmp_path: Path) -> None:
    """The checks ``golden record`` and ``fleet`` make before any work (``refuse_foreign``, ``check_fleet_out``)."""
    from attn_export.campaigns.fleet.result import check_fleet_out
    from attn_export.deploy.folder import refuse_foreign

    folder = tmp_path / "g"
    before = plant(folder, STAGING)
    with pytest.raises(ConfigError, match=r"'\.attn-export-staging-mine'.*--force"):
        check_fleet_out(folder) if flag == "--out" else refuse_foreign(folder, flag)
    assert files_of(folder) == before


def test_c32_force_moves_a_users_staging_named_folder_aside_and_a_killed_runs_staging_is_still_removed(tmp_path: Path) -> None:
    from attn_export.deploy.folder import DeployClaim, staging

    folder, out = tmp_path / "b", tmp_path / "out"
    folder.mkdir()
    with pytest.raises(KeyboardInterrupt), staging(folder) as tmp:  # a run's staging folder, killed: its marker is in it
        (tmp / "bundle.json").write_text("{}")
        (name,) = [n for n in os.listdir(folder) if n.startswith(".attn-export-staging-")]
        ours = folder / name
        os.rename(ours, tmp_path / "kept")  # what a SIGKILL leaves: the folder, not removed by staging()'s finally
        raise KeyboardInterrupt
    os.rename(tmp_path / "kept", ours)
    plant(folder, STAGING)
    claim = DeployClaim(folder, "--bundle", out).acquire(force=True)
    try:
        claim.make_room(True)
        (aside,) = asides(folder)
        assert files_of(aside) == STAGING
        assert not ours.exists(), "a staging folder with our marker is a killed run's leftover: removed"
    finally:
        claim.release()
