"""Helpers for the reliability suite: run the CLI in-process or in a subprocess, and check that a
refusal is clean (exit code, one line starting ``attn-export: error:``, nothing left on disk)."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The smallest pipeline run (about 5 s in-process once torch.onnx is warm).
TINY = ["--d-model", "32", "--heads", "4", "--seq-len", "8", "--batch", "2", "--repeats", "1", "--warmup", "0", "--threads", "1"]


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    seconds: float  # recorded for the reader; no test asserts on it (speed belongs in bench/)
    new_files: list[str] = field(default_factory=list)
    reached: list[str] | None = None  # the heavy stages the run entered (HEAVY); None: not watched (a subprocess)

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def snapshot(root: Path) -> set[str]:
    """Every path under ``root`` (files and folders), relative."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# The run's heavy work, by the call that marks it: a subject built (``make_subject`` returned: the
# model, the checkpoint's weights and the data are in memory; reading and checking the input files
# inside it is still validation) and the ONNX export begun. A refusal of bad input comes before both.
HEAVY = {"subject": ("attn_export.subjects", "make_subject", "returned"), "export": ("torch.onnx", "export", "entered")}


@contextlib.contextmanager
def heavy_watch() -> Iterator[list[str]]:
    """Within the block, record (in order, once each) which ``HEAVY`` stages were reached; the
    calls still run, so a run that goes on is unchanged."""
    reached: list[str] = []
    saved = []
    for stage, (module_name, attr, when) in HEAVY.items():
        module = importlib.import_module(module_name)
        real = getattr(module, attr)

        def spy(*args: object, _real: object = real, _stage: str = stage, _when: str = when, **kwargs: object) -> object:
            if _when == "entered" and _stage not in reached:
                reached.append(_stage)
            result = _real(*args, **kwargs)  # type: ignore[operator]
            if _stage not in reached:
                reached.append(_stage)
            return result

        setattr(module, attr, spy)
        saved.append((module, attr, real))
    try:
        yield reached
    finally:
        for module, attr, real in saved:
            setattr(module, attr, real)


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str], root: Path) -> Outcome:
    """``attn_export.cli.main(args)`` in this process; reports what appeared under ``root`` and which
    heavy stages the run reached."""
    from attn_export.cli import main

    before = snapshot(root)
    capsys.readouterr()
    t0 = time.perf_counter()
    with heavy_watch() as reached:
        code = main([str(a) for a in args])
    seconds = time.perf_counter() - t0
    cap = capsys.readouterr()
    return Outcome(code, cap.out, cap.err, seconds, sorted(snapshot(root) - before), list(reached))


def assert_refused(o: Outcome, expect: str | None = None, code: int = 2, max_seconds: float | None = None,
                   after: tuple[str, ...] = ()) -> None:
    """A clean refusal: the exit code, exactly one line ``attn-export: error: ...`` on stderr, no
    traceback, nothing new on disk, and validation before work: the run reached none of the heavy
    stages (``HEAVY``: a subject built, the ONNX export begun) except those named in ``after``, for a
    refusal that only the work can find (a range found while calibrating, after the export).

    ``max_seconds`` is accepted for the callers written when this checked the clock, and ignored:
    a wall-clock bound is a flaky proxy for "before work", which ``reached`` states exactly."""
    del max_seconds
    assert o.code == code, f"exit {o.code}, expected {code}; stderr: {o.err!r}"
    assert "Traceback" not in o.err and "Traceback" not in o.out, o.err
    assert len(o.err_lines) == 1, f"expected one line on stderr, got {o.err_lines}"
    assert o.err_lines[0].startswith("attn-export: error:"), o.err_lines[0]
    assert "\x1b[" not in o.err, "ANSI codes in the message"
    if expect is not None:
        assert expect.lower() in o.err.lower(), f"expected {expect!r} in {o.err!r}"
    assert not o.new_files, f"left behind: {o.new_files}"
    if o.reached is not None:
        unexpected = [stage for stage in o.reached if stage not in after]
        assert not unexpected, f"refused only after {unexpected} began: validation should come before work"


def assert_one_line_error(err: BaseException, kind: type[BaseException] | None = None, expect: str | None = None) -> None:
    """A library-level refusal: an AttnExportError (or ``kind``) whose message is one line."""
    from attn_export.errors import AttnExportError

    assert isinstance(err, kind or AttnExportError), f"{type(err).__name__}: {err}"
    text = str(err)
    assert "\n" not in text.strip(), f"message spans lines: {text!r}"
    if expect is not None:
        assert expect.lower() in text.lower(), f"expected {expect!r} in {text!r}"


# -- subprocesses ----------------------------------------------------------------------------------
_BATCH_DRIVER = r"""
import contextlib, io, json, os, sys, time
sys.path.insert(0, os.environ["REL_HELPERS_DIR"])
from rel_helpers import heavy_watch
from attn_export.cli import main
for line in sys.stdin:
    case = json.loads(line)
    os.chdir(case["cwd"])
    print(json.dumps({"start": case["id"]}), flush=True)
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), heavy_watch() as reached:
        code = main(case["argv"])
    print(json.dumps({"id": case["id"], "code": code, "out": out.getvalue(), "err": err.getvalue(), "seconds": time.perf_counter() - t0,
                      "reached": list(reached)}), flush=True)
"""


def run_cli_batch(cases: dict[str, tuple[list[object], Path]], timeout: float = 180.0) -> dict[str, Outcome]:
    """Run each case's ``attn_export.cli.main(argv)`` (in its own folder) in one subprocess, killed
    after ``timeout`` seconds: a command that blocks (on a FIFO, say) fails its case, and those
    after it, instead of hanging the suite. One process pays the CLI's imports once."""
    before = {cid: snapshot(cwd) for cid, (_a, cwd) in cases.items()}
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", REL_HELPERS_DIR=str(Path(__file__).parent))
    lines = "".join(json.dumps({"id": cid, "argv": [str(a) for a in argv], "cwd": str(cwd)}) + "\n" for cid, (argv, cwd) in cases.items())
    p = subprocess.Popen([sys.executable, "-c", _BATCH_DRIVER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # noqa: S603
                         stderr=subprocess.PIPE, text=True, cwd=REPO)  # fmt: skip
    try:
        stdout, stderr = p.communicate(lines, timeout=timeout)
        blocked = None
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, stderr = p.communicate()
        blocked = timeout
    outcomes: dict[str, Outcome] = {}
    started = None
    for line in stdout.splitlines():
        rec = json.loads(line)
        if "start" in rec:
            started = rec["start"]
            continue
        cwd = cases[rec["id"]][1]
        outcomes[rec["id"]] = Outcome(rec["code"], rec["out"], rec["err"], rec["seconds"], sorted(snapshot(cwd) - before[rec["id"]]), rec["reached"])
    for cid in cases:
        if cid not in outcomes:
            why = f"no answer within {blocked} s: the command blocked" if cid == started else f"not run: the batch stopped at {started} ({stderr[-300:]!r})"
            outcomes[cid] = Outcome(-9, "", why + "\n", blocked or 0.0)
    return outcomes


class Proc:
    """``python -m attn_export.cli ARGS`` in a subprocess, its stderr read line by line in a thread."""

    def __init__(self, args: list[str], cwd: Path, tmpdir: Path | None = None) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        if tmpdir is not None:
            tmpdir.mkdir(parents=True, exist_ok=True)
            env["TMPDIR"] = str(tmpdir)  # every temporary file the run makes lands here, to be counted
        self.started = time.perf_counter()
        self.p = subprocess.Popen(  # noqa: S603 - our own CLI
            [sys.executable, "-m", "attn_export.cli", *map(str, args)],
            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_default_sigint,  # a background pytest may ignore SIGINT; the CLI must see it
        )  # fmt: skip
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.p.stderr is not None
        for line in iter(self.p.stderr.readline, ""):
            with self._seen:
                self.lines.append(line.rstrip("\n"))
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def wait_for(self, marker: str, timeout: float = 90.0) -> float:
        """Block until a stderr line contains ``marker``; returns the seconds since start."""
        deadline = time.monotonic() + timeout
        with self._seen:
            while not any(marker in line for line in self.lines):
                if self.p.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"exited {self.p.returncode} before {marker!r}: {self.lines}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {marker!r} within {timeout} s: {self.lines}")
                self._seen.wait(min(left, 0.5))
        return time.perf_counter() - self.started

    def finish(self, timeout: float = 120.0) -> tuple[int, str, list[str]]:
        out = self.p.stdout.read() if self.p.stdout else ""  # type: ignore[union-attr]
        code = self.p.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code, out, list(self.lines)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(timeout=30)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _report_object(folder: str = "") -> object:
    from attn_export.validate import Accuracy, Latency, Report, Stage

    r = Report(model={"layer": "transformer", "d_model": 32, "heads": 4}, environment={"cpu": {"isa_class": "x86-avx2", "u8s8_saturates": True}})
    r.add(Stage("onnx-fp32", os.path.join(folder, "model.onnx"), "fp32", Accuracy(2e-6, 3e-7, 1e-6, 0.9999999, 120.0),
                {"artifact": Latency(1.0, 1.2, 1.3), "eager": Latency(2.0, 2.2, 2.3)}, 2.0, passed=True))  # fmt: skip
    r.add(Stage("onnx-int8", os.path.join(folder, "model.int8.onnx"), "int8", Accuracy(0.05, 0.01, 0.03, 0.9995, 30.5),
                {"artifact": Latency(0.5, 0.6, 0.7), "eager": Latency(2.0, 2.2, 2.3)}, 4.0, passed=True))  # fmt: skip
    return r


def good_report() -> dict:
    """A small valid report.json (two stages) as the gate reads it."""
    return json.loads(json.dumps(_report_object().to_dict()))  # type: ignore[attr-defined]


def stamped_run(out: Path) -> Path:
    """A complete run folder as the runner leaves it, without building a model: ``good_report``'s two
    stages with their artifacts beside it, the report stamped with their sha256, ``run.json`` complete."""
    from attn_export.outdir.claim import claim

    with claim(out, seed=0) as owner:
        report = _report_object(str(out))
        (out / "model.onnx").write_bytes(b"the fp32 model")
        (out / "model.int8.onnx").write_bytes(b"the int8 model")
        assert owner.stamp(report) == 2
        report.write(out / "report.json")  # type: ignore[attr-defined]
    return out / "report.json"


def write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return path


# -- output folders ----------------------------------------------------------------------------------
def tree(path: Path) -> object:
    """Everything about ``path`` that an attack could change, without following a link: a file's
    bytes and mtime, a link's target, a folder's entries (recursively)."""
    st = os.lstat(path)
    if os.path.islink(path):
        return ("link", os.readlink(path))
    if path.is_dir():
        return {p.name: tree(p) for p in sorted(path.iterdir())}
    if not path.is_file():
        return ("special", st.st_mode)
    return (path.read_bytes(), st.st_mtime_ns)


def files_of(folder: Path) -> dict[str, bytes]:
    """Relative path -> bytes of every regular file under ``folder`` (links are not followed)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def earlier_run(out: Path, tag: str = "earlier", subfolder: bool = False) -> dict[str, bytes]:
    """A complete run in ``out``, made by the run-directory code itself; returns its files."""
    from attn_export.outdir.claim import claim

    with claim(out, config={"tag": tag}, seed=1):
        (out / "model.onnx").write_bytes(f"{tag} model".encode())
        (out / "latency.png").write_bytes(f"{tag} plot".encode())
        (out / "report.json").write_text(json.dumps({"tag": tag}), encoding="utf-8")
        if subfolder:
            (out / "triton" / "attn" / "1").mkdir(parents=True, exist_ok=True)
            (out / "triton" / "attn" / "1" / "model.onnx").write_bytes(f"{tag} triton model".encode())
    return files_of(out)


def plant(folder: Path, files: dict[str, bytes]) -> dict[str, bytes]:
    """Write a user's ``files`` (relative path -> bytes) under ``folder``; returns every file there, for comparing after."""
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return files_of(folder)


def asides(folder: Path) -> list[Path]:
    """The ``FOLDER.attn-export-aside-*`` siblings ``--force`` moved a user's files into."""
    return sorted(folder.parent.glob(f"{folder.name}.attn-export-aside-*"))
