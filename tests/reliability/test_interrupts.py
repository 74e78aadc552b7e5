"""Interrupts and write failures (issue 13, class 9): Ctrl-C exits 130 and SIGTERM 143 with
"interrupted", at every stage, and nothing is left behind: no ``*.tmp``, no temporary folder, no
half-written --out. A full disk says so, and never suggests another attention form.

The signal tests run ``python -m attn_export.cli`` in a subprocess, wait for the progress line
of the stage (or, for the imports, a short delay), send the signal, and check the exit code,
the last stderr line, the files left in the working folder and in the process's TMPDIR. The
SIGINT and SIGTERM runs of one stage run side by side to keep the suite short.
"""

from __future__ import annotations

import errno
import signal
import time
from pathlib import Path

import pytest
from rel_helpers import TINY, Proc, run_cli

# stage -> (extra options, progress line that starts it, seconds to wait after it, a line that must
# not have appeared before the interrupt: the stage was still running)
STAGES: dict[str, tuple[list[str], str | None, float, str]] = {
    "import": ([], None, 0.7, "•"),
    "export": ([], "exporting model.onnx", 0.4, "exported:"),
    "quantization": (["--quantize", "int8", "--int8-mode", "static", "--calib-method", "entropy", "--calib", "<slow>"], "int8 static Q/DQ", 0.05, "timing eager"),
    "timing": (["--repeats", "10000"], "timing eager", 0.5, "judging"),
}


def _leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _temporaries(tmpdir: Path) -> list[str]:
    """What attn-export's own temporary files and folders look like (tempfile's default ``tmp*``,
    our ``attn*`` prefixes, ``*.tmp``); library caches that every run creates are not counted."""
    return sorted(p.name for p in tmpdir.iterdir() if p.name.startswith(("tmp", "attn", ".attn")) or p.name.endswith(".tmp"))


@pytest.mark.parametrize("stage", list(STAGES), ids=[f"c09-sigint-and-sigterm-during-{s}" for s in STAGES])
def test_signal_during_a_stage_exits_interrupted_and_leaves_nothing(stage: str, tmp_path: Path, calib32_slow: Path) -> None:
    extra, marker, delay, not_yet = STAGES[stage]
    extra = [str(calib32_slow) if a == "<slow>" else a for a in extra]
    for sig in (signal.SIGINT, signal.SIGTERM):  # one run at a time: each gets the whole stage as its window
        work = tmp_path / sig.name
        work.mkdir()
        args = [*TINY, *extra, "--out", "out", "--progress"]  # a repeated option: the last one wins
        proc = Proc(args, cwd=work, tmpdir=tmp_path / f"tmp-{sig.name}")
        try:
            if marker is not None:
                proc.wait_for(marker)
            time.sleep(delay)
            sent_after = list(proc.lines)
            proc.p.send_signal(sig)
            code, out, lines = proc.finish(timeout=60)
        finally:
            proc.kill()
        assert not any(not_yet in line for line in sent_after), f"{stage} had finished before {sig.name}: {sent_after}"
        assert code == 128 + sig, f"{sig.name} during {stage}: exit {code}; {lines[-5:]}"
        assert lines and lines[-1].startswith("attn-export: interrupted"), lines[-5:]
        assert not any("Traceback" in line or "error:" in line for line in lines), lines
        assert _leftovers(work) == [], f"{sig.name} during {stage} left {_leftovers(work)}"
        assert _temporaries(tmp_path / f"tmp-{sig.name}") == [], "temporary files left in TMPDIR"


def _wrapped(inner: BaseException, text: str = "\x1b[96mFailed to export the model with torch.export.\x1b[0m") -> RuntimeError:
    """What torch.onnx does with whatever happens inside it: a new exception with ``inner`` as its cause."""
    try:
        raise inner
    except BaseException as e:  # noqa: BLE001
        try:
            raise RuntimeError(text) from e
        except RuntimeError as wrapped:
            return wrapped


def _export_raising(monkeypatch: pytest.MonkeyPatch, inner: BaseException) -> None:
    import torch

    def fake_export(*_a: object, **_k: object) -> None:
        raise _wrapped(inner)

    monkeypatch.setattr(torch.onnx, "export", fake_export)


def test_c09_ctrl_c_inside_torch_onnx_export_is_an_interrupt_not_an_export_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _export_raising(monkeypatch, KeyboardInterrupt())
    o = run_cli([*TINY, "--out", tmp_path / "out"], capsys, tmp_path)
    assert o.code == 130, o.err
    assert o.err_lines == ["attn-export: interrupted"], o.err_lines
    assert "ONNX export failed" not in o.err and "--attention" not in o.err
    assert o.new_files == [], o.new_files


def test_c09_a_full_disk_during_export_says_so_and_suggests_no_attention_form(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _export_raising(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    o = run_cli([*TINY, "--out", tmp_path / "out"], capsys, tmp_path)
    assert o.code == 2 and len(o.err_lines) == 1 and o.err_lines[0].startswith("attn-export: error:"), o.err
    assert "No space left on device" in o.err and "--attention" not in o.err
    assert o.new_files == [], o.new_files


@pytest.mark.parametrize("err_no", [errno.ENOSPC, errno.EROFS], ids=["c09-disk-full-writing-the-report", "c07-read-only-disk-writing-the-report"])
def test_a_write_failure_at_the_end_is_one_line_and_leaves_no_half_run(err_no: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from attn_export.validate.report import Report

    def fail(self: object, path: object) -> None:
        raise OSError(err_no, os.strerror(err_no), str(path))

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Report, "write", fail)
    o = run_cli([*TINY, "--out", tmp_path / "out"], capsys, tmp_path)
    assert o.code == 2 and len(o.err_lines) == 1 and o.err_lines[0].startswith("attn-export: error:"), o.err
    assert os.strerror(err_no) in o.err and "report.json" in o.err
    assert o.new_files == [], o.new_files


def test_c09_ctrl_c_while_the_cli_imports_is_interrupted_not_a_traceback(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import builtins
    import sys

    from attn_export.cli import main

    real_import = builtins.__import__

    def interrupted_import(name: str, *a: object, **k: object) -> object:
        if name == "attn_export.cli.app":
            raise KeyboardInterrupt
        return real_import(name, *a, **k)  # type: ignore[arg-type]

    monkeypatch.delitem(sys.modules, "attn_export.cli.app", raising=False)
    monkeypatch.setattr(builtins, "__import__", interrupted_import)
    assert main(["--help"]) == 130
    assert capsys.readouterr().err.strip() == "attn-export: interrupted"
