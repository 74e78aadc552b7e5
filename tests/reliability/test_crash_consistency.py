"""A crash never loses the last complete run (issue 20, class 12).

A run killed with SIGKILL runs no clean-up: what it left is whatever was on disk at that
instant. ``_kill_at`` reproduces that exactly: it stops the run-directory code at a chosen step
by raising an exception nothing catches, and turns the clean-up off (the lock is released, as
the kernel does for a dead process). After each kill point, a run that fails must leave the last
*complete* run in ``--out``, and a run that succeeds must leave only its own files; ``check``
refuses the killed run's report. One test kills a real ``python -m attn_export.cli`` with SIGKILL
while it renders its report.
"""

from __future__ import annotations

import errno
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from rel_helpers import TINY, Proc, assert_refused, earlier_run, files_of, run_cli


class _Killed(BaseException):
    """Stands for SIGKILL: nothing may catch it (BaseException, and clean-up is disabled)."""


def _dead(self: object) -> None:
    """What the kernel does for a killed process: its file descriptors are closed (the flock goes)."""
    if self._fd is not None:  # type: ignore[attr-defined]
        os.close(self._fd)  # type: ignore[attr-defined]
        self._fd = None  # type: ignore[attr-defined]
    if self._dir is not None:  # type: ignore[attr-defined]
        self._dir.close()  # type: ignore[attr-defined]
        self._dir = None  # type: ignore[attr-defined]


def _after_calls(n: int, real: Callable[..., object]) -> Callable[..., object]:
    """``real``, but the ``n``-th call (0 = the first) is a kill before it happens."""
    calls = [0]

    def wrapper(*a: object, **k: object) -> object:
        calls[0] += 1
        if calls[0] > n:
            raise _Killed
        return real(*a, **k)

    return wrapper


def _run_killed_at(point: str, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second run into ``out`` killed at ``point``; its files are 'second ...'."""
    import attn_export.outdir.claim as rd
    from attn_export.outdir.fs import OutDir

    def body(owner: rd.RunDir) -> None:
        (out / "model.onnx").write_bytes(b"second model")
        (out / "model.int8.onnx").write_bytes(b"second int8 model")
        (out / "report.json").write_text('{"tag": "second"}')
        (out / ".report.html.abcd1234.tmp").write_text("half a report")  # an atomic write cut short
        (out / "triton" / "attn" / "2").mkdir(parents=True, exist_ok=True)
        (out / "triton" / "attn" / "2" / "model.onnx").write_bytes(b"second triton model")

    with monkeypatch.context() as m, pytest.raises(_Killed):
        m.setattr(rd.RunDir, "_unlock", _dead)
        if not point.startswith("aborting-"):
            m.setattr(rd.RunDir, "abort", _dead)  # a kill runs no clean-up
        if point.startswith("moving-aside-"):
            m.setattr(OutDir, "rename", _after_calls(int(point.rsplit("-", 1)[1]), OutDir.rename))
        elif point == "before-run-json-running":
            m.setattr(rd.RunDir, "_write_manifest", _after_calls(0, rd.RunDir._write_manifest))
        elif point == "after-commit":
            m.setattr(rd, "discard_aside", _after_calls(0, rd.discard_aside))
        with rd.claim(out) as owner:
            body(owner)
            if point in ("writing-files", "rendering"):
                raise _Killed
            if point == "aborting-before-restore":  # the run fails, and is killed while it cleans up
                m.setattr(rd, "restore", _after_calls(0, rd.restore))
            elif point == "aborting-mid-restore":
                m.setattr(OutDir, "rename", _after_calls(1, OutDir.rename))
            if point.startswith("aborting-"):
                raise RuntimeError("the second run fails")


KILL_POINTS = ["moving-aside-1", "moving-aside-3", "before-run-json-running", "writing-files", "rendering", "after-commit",
               "aborting-before-restore", "aborting-mid-restore"]  # fmt: skip


@pytest.mark.parametrize("point", KILL_POINTS, ids=[f"c12-killed-{p}-then-a-failing-run" for p in KILL_POINTS])
def test_a_failing_run_after_a_kill_leaves_the_last_complete_run(point: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attn_export.outdir.claim import claim

    out = tmp_path / "out"
    first = earlier_run(out, "first", subfolder=True)
    (out / "notes.txt").write_text("the user's")
    first["notes.txt"] = b"the user's"
    _run_killed_at(point, out, monkeypatch)
    if point == "after-commit":  # the kill came after the second run's commit: it is the last complete run
        first = {k: v for k, v in files_of(out).items() if not k.startswith(".attn-export")}
        assert first["model.onnx"] == b"second model"
    with pytest.raises(RuntimeError), claim(out) as owner:
        (owner.out / "model.onnx").write_bytes(b"third model")
        (owner.out / "bench.json").write_text("{}")
        raise RuntimeError("the third run fails")
    assert files_of(out) == first
    assert sorted(n for n in os.listdir(out) if n.startswith(".attn-export")) == []


@pytest.mark.parametrize("point", KILL_POINTS, ids=[f"c12-killed-{p}-then-a-run-that-succeeds" for p in KILL_POINTS])
def test_a_run_after_a_kill_leaves_only_its_own_files(point: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attn_export.outdir.claim import claim

    out = tmp_path / "out"
    earlier_run(out, "first", subfolder=True)
    (out / "notes.txt").write_text("the user's")
    _run_killed_at(point, out, monkeypatch)
    (out / "later.txt").write_text("written by the user after the crash")
    with claim(out) as owner:
        (owner.out / "model.onnx").write_bytes(b"third model")
    assert files_of(out).keys() == {"model.onnx", "run.json", "notes.txt", "later.txt"}
    assert json.loads((out / "run.json").read_text())["status"] == "complete" and not os.path.exists(out / "triton")


@pytest.fixture(scope="module")
def killed_while_rendering(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Run A completes (in a subprocess); run B is SIGKILLed while it renders its report."""
    root = tmp_path_factory.mktemp("sigkill")
    out = root / "out"
    a = Proc([*TINY, "--out", out, "--seed", "1", "--quiet"], cwd=root)
    code, _, lines = a.finish(timeout=240)
    assert code == 0, lines[-5:]
    complete = files_of(out)
    b = Proc([*TINY, "--out", out, "--seed", "2", "--progress"], cwd=root)
    try:
        b.wait_for("rendering report.md")
        b.p.send_signal(signal.SIGKILL)
        b.p.wait(timeout=30)
    finally:
        b.kill()
    return {"root": root, "out": out, "complete": complete, "killed": files_of(out)}


def test_c12_a_real_sigkill_while_rendering_leaves_a_running_run_json(killed_while_rendering: dict) -> None:
    out = killed_while_rendering["out"]
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    assert json.loads((out / "report.json").read_text())["inputs"]["seed"] == 2, "B's report was written before it was killed"
    assert os.path.isfile(out / ".attn-export-previous" / "run.json"), "A is kept aside"


def test_c12_check_refuses_the_report_of_a_killed_run(killed_while_rendering: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rel_helpers import write_json

    from attn_export.validate.gate.check import make_baseline

    out = killed_while_rendering["out"]
    report = json.loads((out / "report.json").read_text())
    baseline = write_json(tmp_path / "baseline.json", make_baseline(report))
    for extra in ([], ["--update-baseline"]):
        o = run_cli(["check", out / "report.json", "--baseline", baseline, *extra], capsys, tmp_path)
        assert_refused(o, "did not complete")
    aside = out / ".attn-export-previous" / "report.json"
    if aside.exists():  # A's report, set aside: checked only once a later run has put it back
        o = run_cli(["check", aside, "--baseline", baseline], capsys, tmp_path)
        assert_refused(o, "last complete run, set aside")


def test_c12_a_failing_run_after_a_real_sigkill_restores_the_last_complete_run(killed_while_rendering: dict, capsys: pytest.CaptureFixture[str],
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from attn_export.validate.report import Report

    out, root = killed_while_rendering["out"], killed_while_rendering["root"]

    def full_disk(self: object, path: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.chdir(root)
    monkeypatch.setattr(Report, "write", full_disk)
    o = run_cli([*TINY, "--out", out, "--seed", "3"], capsys, root)
    assert o.code == 2 and "No space left on device" in o.err, o.err
    assert files_of(out) == killed_while_rendering["complete"], "the last complete run (A) is back, whole"
    assert sorted(n for n in os.listdir(out) if n.startswith(".attn-export")) == []
    o = run_cli(["check", out / "report.json", "--baseline", root / "none.json", "--update-baseline", "-q"], capsys, root)
    assert o.code == 0, o.err  # A's report passes the run-folder check again
