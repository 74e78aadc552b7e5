"""Round five, the process environment (issue 39, class 34; 29 for the unbounded message).

The environment is an input too: a file of texts that is not UTF-8, a folder name that is not
UTF-8 under ``LANG=C``, a current folder deleted under the shell, ``ulimit -n 12``, a reader that
closes the pipe (``| head -1``). Each used to end in a traceback, a native abort or a silent
exit 1, some with ``run.json`` left "running". Now each is one line ``attn-export: error:``
naming the problem and the fix, exit 2, before the heavy imports, with nothing written; a
passing run whose reader left keeps its exit code 0. The cases that change the process itself
(its current folder, its limits, its locale, its stdout) run the CLI in a subprocess.
"""

from __future__ import annotations

import logging
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rel_helpers import REPO, assert_refused, run_cli, stamped_run

ENV = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
TINY = ["--d-model", "32", "--heads", "4", "--seq-len", "8", "--batch", "2", "--repeats", "1", "--warmup", "0", "--threads", "1"]


def _cli(args: list[str | bytes], cwd: Path, env: dict[str, str] | None = None, preexec=None, timeout: float = 120):  # noqa: ANN001, ANN202
    return subprocess.run([sys.executable, "-m", "attn_export.cli", *args], cwd=cwd, env=env or ENV, preexec_fn=preexec,  # noqa: S603, PLW1509
                          capture_output=True, timeout=timeout)  # fmt: skip


def _assert_one_line_refusal(p: subprocess.CompletedProcess[bytes], *words: str) -> None:
    err = p.stderr.decode("utf-8", "replace")
    lines = [line for line in err.splitlines() if line.strip()]
    assert p.returncode == 2, (p.returncode, err[-2000:])
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("attn-export: error:"), err[-2000:]
    for word in words:
        assert word in lines[0], (word, lines[0])


# -- files and names that are not UTF-8 --------------------------------------------------------------
def test_c34_golden_texts_that_are_not_utf8_are_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model.onnx"
    model.write_bytes(b"not read: the texts are refused first")
    np.savez(tmp_path / "in.npz", input_ids=np.zeros((1, 4), np.int64))
    (tmp_path / "texts.txt").write_bytes("caf\u00e9 au lait\n".encode("latin-1"))
    o = run_cli(["golden", "record", model, "--inputs", tmp_path / "in.npz", "--golden", tmp_path / "g", "--texts", tmp_path / "texts.txt"],
                capsys, tmp_path)  # fmt: skip
    assert_refused(o, "is not UTF-8 (byte 0xe9 at offset 3)")
    assert "save it as UTF-8" in o.err


def test_c34_an_out_name_that_is_not_utf8_under_lang_c_is_refused_before_any_work(tmp_path: Path) -> None:
    env = {**ENV, "LANG": "C", "LC_ALL": "C"}
    p = _cli([*TINY, "--out", b"o\xff"], tmp_path, env)
    _assert_one_line_refusal(p, "not valid UTF-8", "rename")
    assert os.listdir(tmp_path) == []


# -- a deleted current folder -----------------------------------------------------------------------------
@pytest.mark.parametrize("absolute", [False, True], ids=["c34-relative-out", "c34-absolute-out"])
def test_c34_a_deleted_current_folder_is_refused_up_front(absolute: bool, tmp_path: Path) -> None:
    """With an absolute --out, torch's oneMKL used to abort the process ("Cannot load libtorch_cpu.so")."""
    gone = tmp_path / "gone"
    gone.mkdir()
    out = tmp_path / "o" if absolute else "o"
    p = _cli([*TINY, "--out", str(out)], gone, preexec=lambda: os.rmdir(gone))  # the child is inside it, then it is removed
    _assert_one_line_refusal(p, "current folder was deleted", "cd into a folder")
    assert os.listdir(tmp_path) == []


# -- file descriptors ------------------------------------------------------------------------------------
def test_c34_ulimit_n_12_is_refused_naming_the_limit_and_leaves_no_running_run_json(tmp_path: Path) -> None:
    p = _cli([*TINY, "--out", "o"], tmp_path, preexec=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (12, 12)))
    _assert_one_line_refusal(p, "open-file limit is 12", "ulimit -n")
    assert os.listdir(tmp_path) == [], "refused before --out was made: no run.json 'running'"


def test_c34_a_low_soft_limit_under_a_higher_hard_one_is_raised_not_refused() -> None:
    """``ulimit -S -n 12``: the soft limit may be raised up to the hard one, as the run does for itself."""
    from attn_export.host.preflight import MIN_OPEN_FILES, environment_problem

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < MIN_OPEN_FILES:
        pytest.skip(f"this machine's hard open-file limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (12, hard))
    try:
        assert environment_problem([]) is None
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= MIN_OPEN_FILES
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# -- a reader that closes the pipe --------------------------------------------------------------------------
def test_c34_a_passing_command_whose_reader_closed_the_pipe_exits_0_without_a_word(tmp_path: Path) -> None:
    """``attn-export check REPORT --baseline B | head -0``: the reader is gone before the first line (rich used to exit 1, silently)."""
    report = stamped_run(tmp_path / "run")
    baseline = ["--baseline", str(tmp_path / "baseline.json")]
    assert _cli(["check", str(report), *baseline, "--update-baseline"], tmp_path).returncode == 0
    p = subprocess.Popen([sys.executable, "-m", "attn_export.cli", "check", str(report), *baseline], cwd=tmp_path, env=ENV,  # noqa: S603
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert p.stdout is not None
    p.stdout.close()  # the reader left: every write to stdout now fails with EPIPE
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, (p.returncode, err.decode()[-2000:])
    assert err.decode().strip() == "", err.decode()


# -- an unbounded list in a message ---------------------------------------------------------------------------
def test_c29_force_over_10001_files_warns_in_one_short_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from attn_export.outdir.claim import claim

    out = tmp_path / "out"
    out.mkdir()
    for i in range(10_001):
        (out / f"model{i}.onnx").write_bytes(b"the user's")
    with caplog.at_level(logging.WARNING, logger="attn_export.outdir.claim"), claim(out, force=True) as owner:
        (owner.out / "model.onnx").write_bytes(b"ours")
    (record,) = [r for r in caplog.records if "--force" in r.getMessage()]
    message = record.getMessage()
    assert "\n" not in message and len(message) < 600, len(message)
    assert "moved 10001 file(s)" in message and "10001 in all" in message, message


def test_c34_running_out_of_file_descriptors_mid_run_is_one_line_and_no_run_json_stays_running(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A limit above the preflight's minimum that a bigger run still exhausts: EMFILE is the environment, not a bug."""
    import errno

    import attn_export.subjects as subjects

    def no_descriptors_left(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(subjects, "make_subject", no_descriptors_left)
    o = run_cli([*TINY, "--out", tmp_path / "o"], capsys, tmp_path)
    assert_refused(o, "Too many open files; raise the open-file limit (ulimit -n")
    assert not (tmp_path / "o").exists(), "the run's claim was undone: no run.json 'running'"


# -- a run.json left "running": killed, or still under way ---------------------------------------------------
@pytest.mark.parametrize("live", [False, True], ids=["c34-killed", "c34-live"])
def test_c34_check_tells_a_killed_run_from_one_still_running(live: bool, tmp_path: Path) -> None:
    """A run the environment killed leaves run.json "running"; ``check`` used to say "killed or still running"."""
    import json

    from attn_export.errors import DataError
    from attn_export.outdir.fs import OutDir, take_lock
    from attn_export.validate.gate.hashes import check_run_folder

    report = stamped_run(tmp_path / "run")
    manifest = report.parent / "run.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "status": "running", "pid": 4242}))
    od = OutDir(report.parent, "--out")
    fd = take_lock(od, ".attn-export.lock", {"pid": 4242, "started": "then"})  # what the run's lock file holds
    if not live:
        os.close(fd)  # the process died: the kernel dropped its flock, the file stays
    try:
        with pytest.raises(DataError) as err:
            check_run_folder(report)
    finally:
        if live:
            os.close(fd)
        od.close()
    text = str(err.value)
    assert "killed or is still running" not in text, text
    assert ("still running (pid 4242 holds .attn-export.lock)" if live else "it was killed (no process holds .attn-export.lock)") in text, text
