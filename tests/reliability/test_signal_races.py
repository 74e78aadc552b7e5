"""Interrupts that land where an exception cannot propagate (issue 20, class 19).

Python runs a signal handler at the next bytecode of the main thread, which may be inside a
finalizer (a ``__del__`` or a weakref callback the garbage collector runs; matplotlib frees
figures that way while a report renders). An exception raised there is printed with a
traceback and dropped, so SIGTERM while rendering used to print a traceback beside
"interrupted (terminated)" and leave the complete run. The subprocess test makes that
landing certain with a ``sitecustomize`` that sends SIGTERM from the finalizer of the first
matplotlib figure freed; the others send SIGTERM at the "rendering report" progress line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
from rel_helpers import REPO, TINY, Proc

from attn_export.host.signals import Terminated, announce, interrupt_signals, received

RENDERING = "rendering report"
_SHIM = '''"""The first matplotlib Figure freed sends SIGTERM to this process from inside its finalizer."""
import os, signal, weakref

import matplotlib.figure

_fired = []


def _kill():
    if not _fired:
        _fired.append(1)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10000):  # bytecode boundaries inside the finalizer: the handler runs here
            pass


_init = matplotlib.figure.Figure.__init__


def _init_and_arm(self, *a, **k):
    _init(self, *a, **k)
    weakref.finalize(self, _kill)


matplotlib.figure.Figure.__init__ = _init_and_arm
'''


def _clean_interrupt(code: int, lines: list[str], work: Path) -> None:
    """143, progress lines then exactly one "interrupted (terminated)" line, and no half run left."""
    assert code == 143, lines[-8:]
    other = [ln for ln in lines if ln.strip() and not ln.startswith("•")]
    assert other == ["attn-export: interrupted (terminated)"], other
    assert not any("Traceback" in ln or "Exception ignored" in ln for ln in lines), lines
    assert sorted(p.name for p in work.iterdir()) == [], sorted(p.name for p in work.iterdir())


def test_c19_sigterm_inside_a_finalizer_while_rendering_is_one_line_and_leaves_no_run(tmp_path: Path) -> None:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(_SHIM)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=f"{shim}{os.pathsep}{REPO}", PYTHONUNBUFFERED="1")
    run = subprocess.run([sys.executable, "-m", "attn_export.cli", *TINY, "--out", "out", "--progress"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    lines = run.stderr.splitlines()
    assert any(RENDERING in ln for ln in lines), lines[-5:]  # the signal came while the report rendered
    _clean_interrupt(run.returncode, lines, work)


@pytest.mark.parametrize("delay", [0.0, 0.1, 0.4], ids=[f"c19-sigterm-while-rendering-{i}" for i in range(3)])
def test_sigterm_while_rendering_is_one_line(delay: float, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    proc = Proc([*TINY, "--out", "out", "--progress"], cwd=work, tmpdir=tmp_path / "tmp")
    try:
        proc.wait_for(RENDERING, timeout=240)
        time.sleep(delay)
        proc.p.send_signal(signal.SIGTERM)
        code, _out, lines = proc.finish(timeout=120)
    finally:
        proc.kill()
    _clean_interrupt(code, lines, work)


class _Freed:
    """An object whose weakref callback raises SIGTERM in this process (what the garbage collector may run anywhere)."""


def test_c19_an_interrupt_a_finalizer_swallowed_is_raised_again_in_the_main_flow(capsys: pytest.CaptureFixture[str]) -> None:
    with interrupt_signals():
        obj = _Freed()
        weakref.finalize(obj, lambda: [signal.raise_signal(signal.SIGTERM), sum(range(1000))])
        with pytest.raises(Terminated):
            del obj  # the callback runs here; Python drops what it raises
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the main flow: the re-delivered interrupt lands here
                time.sleep(0.001)
        assert received() == signal.SIGTERM
    err = capsys.readouterr().err
    assert "Exception ignored" not in err and "Traceback" not in err, err


def test_c19_a_swallowed_interrupt_raised_in_the_main_flow_is_not_delivered_again_into_its_clean_up() -> None:
    """The finalizer swallows SIGTERM; ``raise_if_interrupted`` raises it before the commit; the
    clean-up that follows (removing the half run) must not be hit by the pending re-delivery."""
    from attn_export.host.signals import raise_if_interrupted

    cleaned = []
    with interrupt_signals():
        obj = _Freed()
        weakref.finalize(obj, lambda: [signal.raise_signal(signal.SIGTERM), sum(range(1000))])
        del obj  # swallowed here: a re-delivery is scheduled
        try:
            raise_if_interrupted()  # the main flow takes it first (runner.run before the commit)
        except Terminated:
            deadline = time.monotonic() + 0.5  # 100x the re-delivery delay: the clean-up runs its course
            while time.monotonic() < deadline:
                time.sleep(0.001)
            cleaned.append(True)
        assert received() == signal.SIGTERM
    assert cleaned == [True]


def test_c19_a_second_signal_during_the_clean_up_does_not_interrupt_it(capsys: pytest.CaptureFixture[str]) -> None:
    cleaned = []
    with interrupt_signals():
        try:
            signal.raise_signal(signal.SIGTERM)
            time.sleep(1)  # pragma: no cover - the handler raises before
        except Terminated:
            signal.raise_signal(signal.SIGINT)  # a second signal while the first one's clean-up runs
            sum(range(1000))
            cleaned.append(True)
        assert announce(signal.SIGTERM) == 143 and announce(signal.SIGINT) == 143  # one line, for the first signal
    assert cleaned == [True]
    assert capsys.readouterr().err.splitlines() == ["attn-export: interrupted (terminated)"]
