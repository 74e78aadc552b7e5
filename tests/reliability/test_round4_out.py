"""``--out`` owns only what it wrote (issue 28, class 21).

A file in ``--out`` with a name a command writes (``model.onnx``, ``report.md``, ``latency.png``,
``bench.json``...) that no complete ``run.json`` of attn-export lists with its bytes is the
user's: every command that writes into ``--out`` (the main command, ``encoder``, ``sweep``,
``bench``, ``report``) refuses the folder in one line naming the file, before any work;
``--force`` moves such files, byte for byte, into a new folder beside ``--out``
(``OUT.attn-export-aside-<UTC time>``) and the run goes on. An earlier run's own files are
still kept aside until the new run commits, then dropped, as before.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rel_helpers import (
    TINY,
    asides,
    assert_refused,
    earlier_run,
    files_of,
    good_report,
    plant,
    run_cli,
    stamped_run,
    write_json,
)

from attn_export.errors import ConfigError

USER = {"model.onnx": b"mine\n", "report.md": b"notes\n"}


def _users_folder(out: Path, files: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """``mkdir -p p && echo mine > p/model.onnx && echo notes > p/report.md``."""
    return plant(out, USER if files is None else files)


def _assert_names_the_file_and_the_fix(err: str, out: Path, rel: str) -> None:
    assert f"{out / rel}, which attn-export did not write" in err, err
    assert "--force" in err and f"{out}.attn-export-aside-" in err, err


# -- the reproduction, and --force ------------------------------------------------------------------
def test_c21_out_with_users_model_onnx_and_report_md_is_refused_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p"
    out.mkdir()
    before = _users_folder(out)
    o = run_cli([*TINY, "--out", out], capsys, tmp_path)
    assert_refused(o, "which attn-export did not write", max_seconds=60)  # no new file: not even the lock was taken
    _assert_names_the_file_and_the_fix(o.err, out, "model.onnx")
    assert files_of(out) == before and sorted(os.listdir(out)) == ["model.onnx", "report.md"]
    assert not asides(out)


def test_c21_force_moves_the_users_files_into_a_named_sibling_and_the_run_succeeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p"
    out.mkdir()
    before = _users_folder(out)
    o = run_cli([*TINY, "--out", out, "--force", "--quiet"], capsys, tmp_path)
    assert o.code == 0, o.err
    (aside,) = asides(out)
    assert aside.parent == out.parent, "beside --out, not inside it"
    assert files_of(aside) == before, "every conflicting file, byte for byte"
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["moved_aside"] == {"folder": str(aside), "files": ["model.onnx", "report.md"]}, "run.json names the folder"
    assert (out / "model.onnx").read_bytes() != USER["model.onnx"] and set(USER) <= set(manifest["artifacts"])
    from attn_export.outdir.recovery import named_like_ours

    assert all(named_like_ours(rel) for rel in manifest["artifacts"]), "a name the run writes that the refusal would not protect"


def test_c21_a_normal_rerun_into_our_own_out_still_replaces_the_earlier_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p"
    assert run_cli([*TINY, "--out", out, "--quiet", "--seed", "1"], capsys, tmp_path).code == 0
    first = files_of(out)
    o = run_cli([*TINY, "--out", out, "--quiet", "--seed", "2"], capsys, tmp_path)
    assert o.code == 0, o.err
    assert files_of(out)["model.onnx"] != first["model.onnx"], "the earlier run was replaced"
    assert json.loads((out / "run.json").read_text())["seed"] == 2
    assert not (out / ".attn-export-previous").exists() and not asides(out), "kept aside until the commit, then dropped"


def test_c21_a_file_edited_after_its_run_is_the_users_and_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p"
    earlier_run(out)
    (out / "model.onnx").write_bytes(b"my fine-tuned model\n")  # same name, the user's bytes now
    before = files_of(out)
    o = run_cli([*TINY, "--out", out], capsys, tmp_path)
    assert_refused(o, "which attn-export did not write", max_seconds=60)
    _assert_names_the_file_and_the_fix(o.err, out, "model.onnx")
    assert files_of(out) == before


def test_c21_a_folder_without_run_json_is_no_longer_taken_for_an_earlier_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The old "written before run manifests existed" rule moved and dropped any report.json folder's files."""
    out = tmp_path / "p"
    before = _users_folder(out, {"report.json": b"{}", "latency.png": b"my plot", "notes.txt": b"mine"})
    o = run_cli([*TINY, "--out", out], capsys, tmp_path)
    assert_refused(o, "which attn-export did not write", max_seconds=60)
    _assert_names_the_file_and_the_fix(o.err, out, "latency.png")
    assert files_of(out) == before


def test_c21_a_run_json_that_is_not_ours_is_refused_and_moved_aside_with_force(tmp_path: Path) -> None:
    from attn_export.outdir.claim import claim

    out = tmp_path / "p"
    before = _users_folder(out, {"run.json": b'{"my": "experiment log"}', "model.onnx": b"mine"})
    with pytest.raises(ConfigError, match="not an attn-export run manifest.*--force"), claim(out):
        pass
    assert files_of(out) == before
    with claim(out, force=True) as owner:
        (owner.out / "model.onnx").write_bytes(b"ours")
    (aside,) = asides(out)
    assert files_of(aside) == before and (out / "model.onnx").read_bytes() == b"ours"


def test_c21_files_with_other_names_are_left_alone(tmp_path: Path) -> None:
    from attn_export.outdir.claim import claim

    out = tmp_path / "p"
    before = _users_folder(out, {"notes.txt": b"mine", "holiday.jpg": b"jpeg", "data/model.onnx": b"not a name a run writes"})
    with claim(out) as owner:
        (owner.out / "model.onnx").write_bytes(b"ours")
    assert {k: v for k, v in files_of(out).items() if k in before} == before and not asides(out)


# -- every command that writes --------------------------------------------------------------------
def _report_args(t: Path) -> list[object]:
    return ["report", write_json(t / "src" / "report.json", good_report()), "--no-attention-maps"]


@pytest.mark.parametrize(
    ("argv", "rel"),
    [
        pytest.param(["encoder"], "model.onnx", id="c21-encoder"),
        pytest.param(["sweep", "--quick"], "sweep.json", id="c21-sweep"),
        pytest.param(["sweep", "--quick", "--save-models"], "models/lowrank.onnx", id="c21-sweep-save-models"),
        pytest.param(["bench", "--quick"], "bench.json", id="c21-bench"),
        pytest.param(["bench", "--quick"], "seq_scaling.png", id="c21-bench-plot"),
        pytest.param(["--checkpoint", "minilm"], "report.html", id="c21-checkpoint"),
        pytest.param(None, "report.html", id="c21-report-out"),
        pytest.param(None, "error_histograms.png", id="c21-report-out-plot"),
    ],
)
def test_c21_every_command_that_writes_refuses_the_users_file(argv: list[str] | None, rel: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p"
    head = _report_args(tmp_path) if argv is None else argv
    before = _users_folder(out, {rel: b"the user's own bytes\n"})
    o = run_cli([*head, "--out", out], capsys, tmp_path)
    assert_refused(o, "which attn-export did not write", max_seconds=60)
    _assert_names_the_file_and_the_fix(o.err, out, rel)
    assert files_of(out) == before


def test_c21_report_force_moves_the_users_file_and_a_later_report_needs_no_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r"
    before = _users_folder(out, {"report.html": b"<p>my page</p>", "report.json": b"{}"})
    o = run_cli([*_report_args(tmp_path), "--out", out, "--force", "-q"], capsys, tmp_path)
    assert o.code == 0, o.err
    (aside,) = asides(out)
    assert files_of(aside) == {"report.html": before["report.html"]}, "only the names report writes"
    assert (out / "report.json").read_bytes() == b"{}", "the user's report.json is no name `report` writes: left alone"
    manifest = json.loads((out / "run.json").read_text())
    assert {"report.md", "report.html"} <= set(manifest["artifacts"]) and "report.json" not in manifest["artifacts"]
    assert run_cli([*_report_args(tmp_path), "--out", out, "-q"], capsys, tmp_path).code == 0, "it wrote them: they are its own now"


def test_c21_report_into_a_run_folder_keeps_the_run_and_its_manifest_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`attn-export report OUT/report.json` re-renders in place; the run's model stays listed, so a later run needs no --force."""
    from attn_export.outdir.claim import claim

    report = stamped_run(tmp_path / "p")
    out = report.parent
    o = run_cli(["report", report, "--no-attention-maps", "-q"], capsys, tmp_path)
    assert o.code == 0, o.err
    manifest = json.loads((out / "run.json").read_text())
    assert {"model.onnx", "model.int8.onnx", "report.json", "report.md"} <= set(manifest["artifacts"])
    assert manifest["amended"][0]["command"][:2] == ["attn-export", "report"]
    baseline = tmp_path / "baseline.json"  # check still finds the report its run.json recorded, and the models it judged
    assert run_cli(["check", report, "--baseline", baseline, "--update-baseline", "-q"], capsys, tmp_path).code == 0
    with claim(out) as owner:  # the next run takes the folder over without a word
        (owner.out / "model.onnx").write_bytes(b"next")
    assert sorted(os.listdir(out)) == ["model.onnx", "run.json"] and not asides(out)


# -- the claim itself, under its lock ---------------------------------------------------------------
def test_c21_the_claim_refuses_a_file_that_appeared_after_validation(tmp_path: Path) -> None:
    from attn_export.outdir.claim import check_owned, claim

    out = tmp_path / "p"
    out.mkdir()
    check_owned(out)  # empty: fine
    before = _users_folder(out, {"report.json": b"mine"})
    with pytest.raises(ConfigError, match="holds .*report.json, which attn-export did not write"), claim(out):
        pass
    assert files_of(out) == before and sorted(os.listdir(out)) == ["report.json"], "no lock, no run.json left"


def test_c21_force_keeps_the_users_files_aside_when_the_run_fails(tmp_path: Path) -> None:
    from attn_export.outdir.claim import claim

    out = tmp_path / "p"
    before = _users_folder(out)
    with pytest.raises(RuntimeError), claim(out, force=True) as owner:
        (owner.out / "model.onnx").write_bytes(b"half")
        raise RuntimeError("boom")
    (aside,) = asides(out)
    assert files_of(aside) == before and not os.listdir(out), "nothing lost, and nothing of the failed run left"


def test_c21_the_aside_folder_is_always_new_and_never_a_link(tmp_path: Path) -> None:
    from attn_export.outdir.fs import OutDir, make_sibling, move_into

    out = tmp_path / "p"
    _users_folder(out)
    taken = tmp_path / "p.attn-export-aside-20260101T000000Z"
    taken.mkdir()
    (taken / "model.onnx").write_bytes(b"an earlier aside")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "p.attn-export-aside-20260101T000000Z-1").symlink_to(elsewhere)
    od = OutDir(out, "--out")
    try:
        folder = make_sibling(od, "20260101T000000Z")
        move_into(od, ["model.onnx"], folder)
    finally:
        od.close()
    assert folder.name == "p.attn-export-aside-20260101T000000Z-2" and not folder.is_symlink()
    assert (folder / "model.onnx").read_bytes() == USER["model.onnx"]
    assert (taken / "model.onnx").read_bytes() == b"an earlier aside" and not os.listdir(elsewhere)


# -- a name over NAME_MAX ---------------------------------------------------------------------------
@pytest.mark.parametrize("head", [[], ["bench", "--quick"], ["sweep", "--quick"], None], ids=["c21-main", "c21-bench", "c21-sweep", "c21-report"])
def test_c21_an_out_name_over_name_max_is_refused_by_name(head: list[str] | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _report_args(tmp_path) if head is None else head
    o = run_cli([*argv, "--out", tmp_path / ("a" * 300)], capsys, tmp_path)
    o.new_files = [f for f in o.new_files if not f.startswith("src")]
    assert_refused(o, "within 255 bytes", max_seconds=60)
    assert "internal error" not in o.err
