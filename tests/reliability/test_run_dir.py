"""Outputs of different runs never mix: a run owns its --out (issue 13, class 2).

One int8 run in a subprocess holds the folder while a second run into it refuses at once
naming the first one's PID; a plain run afterwards leaves none of the int8 run's files; the
report's artifact hashes match the files beside it, and ``check`` says so when they do not.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from rel_helpers import TINY, assert_refused, run_cli


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): _sha(p) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def int8_run(tmp_path_factory: pytest.TempPathFactory, calib32: Path) -> dict:
    """Run A (int8, subprocess) into OUT; while it holds OUT, run B into OUT in this process."""
    from rel_helpers import Proc, heavy_watch

    from attn_export.cli import main

    root = tmp_path_factory.mktemp("concurrent")
    out = root / "out"
    args = [*TINY, "--quantize", "int8", "--calib", calib32, "--out", out]
    a = Proc([*args, "--progress", "--seed", "1"], cwd=root)
    try:
        a.wait_for("building the subject")  # A holds the lock from before it builds anything
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err), heavy_watch() as b_reached:
            b_code = main([str(x) for x in args])
        a_code, _, a_lines = a.finish(timeout=240)
    finally:
        a.kill()
    return {"out": out, "pid": a.p.pid, "a_code": a_code, "a_lines": a_lines, "b_code": b_code, "b_err": err.getvalue(), "b_reached": b_reached}


def test_c02_two_runs_into_one_out_one_runs_the_other_refuses_naming_its_pid(int8_run: dict) -> None:
    assert int8_run["a_code"] == 0, int8_run["a_lines"][-5:]
    lines = [ln for ln in int8_run["b_err"].splitlines() if ln.strip()]
    assert int8_run["b_code"] == 2 and len(lines) == 1, lines
    assert lines[0].startswith("attn-export: error:") and f"PID {int8_run['pid']}" in lines[0], lines[0]
    assert "in use by another attn-export run" in lines[0]
    assert int8_run["b_reached"] == [], "the second run must refuse at once, not after building"


def test_c02_the_finished_reports_artifact_hashes_match_the_files_on_disk(int8_run: dict) -> None:
    from attn_export.validate.gate.check import verify_artifact_hashes

    out: Path = int8_run["out"]
    report = json.loads((out / "report.json").read_text())
    assert report["inputs"]["seed"] == 1, "the report is run A's"
    checks = verify_artifact_hashes(report, out)
    names = {c.stage for c in checks}
    assert {"onnx-fp32", "int8-static", "int8-per-token", "selection.int8"} <= names, names
    assert all(c.ok for c in checks), [c.message for c in checks if not c.ok]
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "complete" and manifest["seed"] == 1 and manifest["pid"] == int8_run["pid"]
    assert manifest["command"][:1] == ["attn-export"] and "--quantize" in manifest["command"]
    on_disk = {k: v for k, v in _files(out).items() if k != "run.json"}
    assert {k: v["sha256"] for k, v in manifest["artifacts"].items()} == on_disk
    assert not (out / ".attn-export.lock").exists() and not (out / ".attn-export-previous").exists()


def test_c02_a_plain_run_after_an_int8_run_leaves_no_int8_model(int8_run: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    shutil.copytree(int8_run["out"], out)
    assert (out / "model.int8.onnx").is_file()
    o = run_cli([*TINY, "--out", out, "--quiet"], capsys, tmp_path)
    assert o.code == 0, o.err
    report = json.loads((out / "report.json").read_text())
    mentioned = {Path(s["artifact"]).name for s in report["stages"] if s.get("artifact")}
    models = {p.name for p in out.glob("model*.onnx")}
    assert models == mentioned == {"model.onnx"}, (models, mentioned)
    manifest = json.loads((out / "run.json").read_text())
    assert set(manifest["artifacts"]) == set(_files(out)) - {"run.json"}


def test_c02_check_fails_when_the_model_beside_the_report_is_another_runs(int8_run: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    shutil.copytree(int8_run["out"], out)
    baseline = tmp_path / "baseline.json"
    assert run_cli(["check", out / "report.json", "--baseline", baseline, "--update-baseline", "-q"], capsys, tmp_path).code == 0
    assert run_cli(["check", out / "report.json", "--baseline", baseline, "-q"], capsys, tmp_path).code == 0
    data = bytearray((out / "model.int8.onnx").read_bytes())
    data[-1] ^= 0xFF  # another run's model: same name, other bytes
    (out / "model.int8.onnx").write_bytes(bytes(data))
    o = run_cli(["check", out / "report.json", "--baseline", baseline], capsys, tmp_path)
    assert o.code == 1, o.out
    assert "model.int8.onnx is not the file this report judged" in o.out and "two runs are mixed" in o.out


def test_c02_a_held_lock_is_refused_at_once_naming_the_holder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out / ".attn-export.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps({"pid": 4242, "started": "then"}).encode())
        o = run_cli([*TINY, "--out", out], capsys, tmp_path)
        o.new_files = []
        assert_refused(o, "PID 4242", max_seconds=5)
        assert sorted(os.listdir(out)) == [".attn-export.lock"]
    finally:
        os.close(fd)


def test_c02_a_killed_runs_leftovers_are_cleared_and_user_files_kept(tmp_path: Path) -> None:
    from attn_export.outdir.claim import claim

    out = tmp_path / "out"
    (out / ".attn-export-previous").mkdir(parents=True)
    (out / ".attn-export-previous" / "report.json").write_text("{}")
    earlier = {"report.json": {"sha256": hashlib.sha256(b"{}").hexdigest(), "size_bytes": 2}}  # the last complete run, kept aside
    (out / ".attn-export-previous" / "run.json").write_text(json.dumps({"format": "attn-export-run/1", "status": "complete", "artifacts": earlier}))
    marker = {"format": "attn-export-previous/1", "run": "0123456789abcdef", "pid": 1, "started": "then", "files": ["report.json", "run.json"]}
    (out / ".attn-export-previous" / ".attn-export-moved").write_text(json.dumps(marker))  # the record the killed run left: the folder is its own
    (out / "run.json").write_text(json.dumps({"format": "attn-export-run/1", "status": "running", "pid": 1}))
    for name in ("model.int8.onnx", "model.onnx", "latency.png", "notes.txt"):
        (out / name).write_text("old")
    with claim(out, config={"x": 1}, seed=3) as owner:
        (owner.out / "model.onnx").write_text("new")
    assert sorted(os.listdir(out)) == ["model.onnx", "notes.txt", "run.json"]
    manifest = json.loads((out / "run.json").read_text())
    assert set(manifest["artifacts"]) == {"model.onnx"} and manifest["seed"] == 3 and manifest["config"] == {"x": 1}


def test_c02_a_failed_run_puts_the_previous_run_back(tmp_path: Path) -> None:
    from attn_export.outdir.claim import claim

    out = tmp_path / "out"
    with claim(out) as owner:
        for name in ("model.onnx", "report.json"):
            (owner.out / name).write_text("first")
    before = _files(out)
    with pytest.raises(KeyboardInterrupt), claim(out) as owner:
        (owner.out / "model.int8.onnx").write_text("second")
        (owner.out / "model.onnx").write_text("second")
        raise KeyboardInterrupt
    assert _files(out) == before
    fresh = tmp_path / "fresh" / "nested"
    with pytest.raises(RuntimeError), claim(fresh) as owner:
        (owner.out / "model.onnx").write_text("x")
        raise RuntimeError("boom")
    assert not (tmp_path / "fresh").exists(), "folders the failed run created are removed"


def test_c02_files_in_subfolders_are_tracked_replaced_and_restored(tmp_path: Path) -> None:
    """--triton OUT/triton: the repository's files are the run's too (listed, replaced, restored)."""
    from attn_export.outdir.claim import claim

    out = tmp_path / "out"
    (out / "user").mkdir(parents=True)
    (out / "user" / "keep.txt").write_text("mine")
    with claim(out) as owner:
        (owner.out / "triton" / "attn" / "1").mkdir(parents=True)
        (owner.out / "triton" / "attn" / "1" / "model.onnx").write_text("first")
        (owner.out / "report.json").write_text("{}")
    first = json.loads((out / "run.json").read_text())["artifacts"]
    assert set(first) == {"triton/attn/1/model.onnx", "report.json"}
    before = _files(out)
    with pytest.raises(KeyboardInterrupt), claim(out) as owner:
        (owner.out / "triton" / "attn" / "2").mkdir(parents=True)
        (owner.out / "triton" / "attn" / "2" / "model.onnx").write_text("second")
        raise KeyboardInterrupt
    assert _files(out) == before and not (out / "triton" / "attn" / "2").exists()
    with claim(out) as owner:
        (owner.out / "report.json").write_text("{}")
    assert not (out / "triton").exists(), "the earlier run's repository is gone, folders included"
    assert (out / "user" / "keep.txt").read_text() == "mine"


def test_c02_a_forged_manifest_cannot_reach_outside_through_a_symlinked_folder(tmp_path: Path) -> None:
    from attn_export.errors import ConfigError
    from attn_export.outdir.claim import claim

    secret = tmp_path / "elsewhere"
    secret.mkdir()
    (secret / "passwd").write_text("root:x:0:0")
    out = tmp_path / "out"
    out.mkdir()
    (out / "link").symlink_to(secret)
    files = {"link/passwd": {"sha256": _sha(secret / "passwd"), "size_bytes": 10}}
    (out / "run.json").write_text(json.dumps({"format": "attn-export-run/1", "status": "complete", "artifacts": files}))
    with pytest.raises(ConfigError, match="link is a symbolic link"), claim(out):
        pass
    assert (secret / "passwd").read_text() == "root:x:0:0" and sorted(os.listdir(secret)) == ["passwd"]
    assert sorted(os.listdir(out)) == ["link", "run.json"], "refused before anything moved"
