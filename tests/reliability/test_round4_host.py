"""Round four, the host the run lives in (class 28, with 09): memory limits, closed or full standard
streams, and what libraries print under ``--quiet``.

Each case runs the CLI the way the attack did: in a subprocess under ``ulimit -v`` (RLIMIT_AS set
in the child before exec), with descriptor 1 or 2 really closed, with stdout on /dev/full, or on a
bare BERT checkpoint (saved by transformers without its pooler) whose loading prints a report.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from rel_helpers import REPO, TINY, assert_refused, run_cli

# ``ulimit -v 2500000``: 2.5 GB of address space, in bytes
ULIMIT_2500000 = 2_500_000 * 1024
# one export (--encoder-form padded): c28 is about what a quiet run prints, not the forms (test_encoder_forms.py)
BARE_RUN = ["--max-len", "32", "--repeats", "1", "--warmup", "0", "--batch", "2", "--seq-len", "16", "--max-texts", "16", "--threads", "1",
            "--encoder-form", "padded"]


def cli(args: list[object], cwd: Path, address_space: int | None = None, close: tuple[int, ...] = (), stdout: object = subprocess.PIPE,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``python -m attn_export.cli ARGS`` in a subprocess; ``address_space`` as ``ulimit -v`` sets it, ``close`` closes those
    descriptors in the child before exec (``>&-``), so Python starts with them closed."""

    def before_exec() -> None:
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        for fd in close:
            os.close(fd)

    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    env.pop("PYTHONFAULTHANDLER", None)
    return subprocess.run([sys.executable, "-m", "attn_export.cli", *map(str, args)], cwd=cwd, env=env, text=True, timeout=timeout,  # noqa: S603
                          stdout=stdout, stderr=subprocess.PIPE if 2 not in close else None, preexec_fn=before_exec, check=False)  # fmt: skip


def one_error_line(p: subprocess.CompletedProcess[str], expect: str) -> str:
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2, f"exit {p.returncode}: {p.stderr[-2000:]}"
    assert "Traceback" not in p.stderr and "Fatal Python error" not in p.stderr, p.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("attn-export: error:"), lines
    assert expect in lines[0], lines[0]
    return lines[0]


# -- memory limits -----------------------------------------------------------------------------------
def test_c28_ulimit_v_too_small_for_minilm_int8_is_refused_up_front_and_a_tiny_run_still_fits(tmp_path: Path) -> None:
    """The attack: ``ulimit -v 2500000`` with ``--checkpoint minilm --quantize int8`` ran 25 s into int8
    calibration, then ended in an internal MemoryError (or, with --quiet, a segmentation fault in
    protobuf leaving a "running" run.json). The estimate counts the address space the libraries and
    the six sessions map, so it is refused before the model is built, naming the limit."""
    p = cli(["--checkpoint", "minilm", "--quantize", "int8", "--quiet", "--out", tmp_path / "out"], tmp_path, address_space=ULIMIT_2500000)
    line = one_error_line(p, "the address-space limit (ulimit -v)")
    assert "expected the run to fit in memory" in line and "raise the limit" in line, line
    assert not (tmp_path / "out").exists()
    # the estimate is not a blanket refusal: a small layer fits in the same 2.5 GB and passes
    ok = cli([*TINY, "--quiet", "--out", tmp_path / "tiny"], tmp_path, address_space=ULIMIT_2500000)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads((tmp_path / "tiny" / "run.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("failure", [MemoryError(), RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : std::bad_alloc")],
                         ids=["c28-memory-error", "c28-native-bad-alloc"])  # fmt: skip
def test_c28_memory_running_out_mid_run_is_one_line_and_rolls_back(failure: BaseException, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Where the estimate was short, an allocation that fails inside the run (Python's MemoryError, or a
    native library's bad_alloc) is "memory ran out" with the limits in force, exit 2, and --out is rolled back."""
    import attn_export.subjects as subjects

    def no_memory(cfg: object) -> None:
        raise failure

    monkeypatch.setattr(subjects, "make_subject", no_memory)
    o = run_cli([*TINY, "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o, "memory ran out", max_seconds=120)
    assert "raise the limit" in o.err and "internal error" not in o.err


def test_c28_a_native_crash_leaves_its_stacks_in_a_crash_file_not_on_the_terminal(tmp_path: Path) -> None:
    """If a native library still crashes (SIGSEGV), Python's fault handler writes the stacks into
    ``$TMPDIR/attn-export-crash-*.txt`` instead of a wall of frames on the terminal; a clean exit removes it."""
    driver = ("import ctypes, sys\nfrom attn_export.cli.app import crash_file\n"
              "with crash_file():\n    pass\nwith crash_file():\n    ctypes.string_at(0)\n")  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path))
    env.pop("PYTHONFAULTHANDLER", None)
    p = subprocess.run([sys.executable, "-c", driver], env=env, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
    assert p.returncode == -11, (p.returncode, p.stderr)
    assert "Fatal Python error" not in p.stderr, p.stderr
    crashes = sorted(tmp_path.glob("attn-export-crash-*.txt"))
    assert len(crashes) == 1, crashes  # the first block exited cleanly: its file is gone
    text = crashes[0].read_text()
    assert "crashed in native code" in text and "Segmentation fault" in text and "<string>" in text, text


# -- standard streams ------------------------------------------------------------------------------
def test_c28_closed_stdout_still_runs_and_commits(tmp_path: Path) -> None:
    """``attn-export ... >&-`` ended in ``AttributeError: 'NoneType' object has no attribute 'isatty'``."""
    p = cli([*TINY, "--out", tmp_path / "out"], tmp_path, close=(1,), stdout=None)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "internal error" not in p.stderr, p.stderr
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "complete"
    assert (tmp_path / "out" / "model.onnx").is_file()


def test_c28_closed_stderr_still_refuses_bad_input_with_exit_2(tmp_path: Path) -> None:
    """With stderr closed (``2>&-``) the refusal cannot be read, but it is still a refusal: exit 2, nothing written."""
    p = cli([*TINY, "--heads", "5", "--out", tmp_path / "out"], tmp_path, close=(2,))
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("quiet", [False, True], ids=["c28-c09-dev-full-table", "c28-c09-dev-full-quiet"])
def test_c28_c09_stdout_on_dev_full_names_stdout_and_says_the_run_completed(quiet: bool, tmp_path: Path) -> None:
    """``attn-export > /dev/full`` committed the run and then blamed --out ("... pass another --out")."""
    with open("/dev/full", "w") as full:
        p = cli([*TINY, *(["--quiet"] if quiet else []), "--out", tmp_path / "out"], tmp_path, stdout=full)
    line = one_error_line(p, "cannot write to standard output: No space left on device")
    assert "--out" not in line.split(";", 1)[1].replace(f"is in {tmp_path / 'out'}", ""), line
    assert "the run completed (PASS)" in line and str(tmp_path / "out") in line, line
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "complete"


# -- library output under --quiet ------------------------------------------------------------------
@pytest.fixture(scope="module")
def bare_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT checkpoint saved by transformers without its pooler (BertModel(add_pooling_layer=False)):
    transformers' AutoModel prints a LOAD REPORT with the pooler MISSING when it loads it."""
    transformers = pytest.importorskip("transformers", reason="the reference is transformers' own model")
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    folder = tmp_path_factory.mktemp("bare-bert")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                                     max_position_embeddings=64)  # fmt: skip
    transformers.BertModel(config, add_pooling_layer=False).eval().save_pretrained(str(folder))
    words = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{f"w{i}": i for i in range(4, 100)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(folder / "tokenizer.json"))
    return folder


def test_c28_quiet_prints_only_the_verdict_and_the_load_report_goes_to_the_run_log(bare_bert: Path, tmp_path: Path) -> None:
    p = cli(["--checkpoint", bare_bert, "--quiet", *BARE_RUN, "--out", tmp_path / "out"], tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == f"PASS: {tmp_path / 'out' / 'report.json'}", p.stdout
    assert p.stderr.strip() == "", p.stderr
    log = (tmp_path / "out" / "run.log").read_text()
    assert "LOAD REPORT" in log and "pooler.dense.weight" in log and "MISSING" in log, log
    assert "\x1b[" not in log
    assert "run.log" in json.loads((tmp_path / "out" / "run.json").read_text())["artifacts"]  # the run's own file, moved aside by the next run


def test_c28_diverted_library_logs_reach_the_run_log_and_the_loggers_are_restored(tmp_path: Path) -> None:
    """No process-wide side effect: a library logger's handlers, level and propagate are as before the run,
    a warning below the threshold reached the run's log and not the library's handler, and Python warnings
    are captured only for the run."""
    import warnings

    from attn_export.host.quiet import quiet_loggers, run_log

    lib = logging.getLogger("some_library")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    own = Keep()
    lib.addHandler(own)
    lib.setLevel(logging.WARNING)
    lib.propagate = False
    root_handlers = list(logging.getLogger().handlers)
    chatty = logging.getLogger("chatty_library")
    chatty.setLevel(logging.INFO)  # as onnxruntime's quantizer sets itself up: one INFO line per node
    try:
        with run_log(tmp_path / "run.log", terminal=False), quiet_loggers(["some_library"]), quiet_loggers(["chatty_library"], logging.WARNING):
            chatty.info("quantizing node 17")
            lib.warning("\x1b[1mLOAD REPORT\x1b[0m pooler MISSING")
            lib.error("an error the user must see")
            warnings.warn("a library's deprecation", UserWarning, stacklevel=1)
        assert seen == ["an error the user must see"]
        assert lib.handlers == [own] and lib.level == logging.WARNING and lib.propagate is False
        assert chatty.level == logging.INFO and chatty.handlers == [] and chatty.propagate is True
        assert getattr(logging, "_warnings_showwarning", None) is None  # warnings no longer captured
        log = (tmp_path / "run.log").read_text()
        assert "quantizing node" not in log
        assert "LOAD REPORT pooler MISSING" in log and "an error the user must see" in log and "a library's deprecation" in log, log
        assert logging.getLogger().handlers == root_handlers and not any(h.filters for h in root_handlers)
    finally:
        lib.removeHandler(own)
        chatty.setLevel(logging.NOTSET)


def test_c28_c11_a_link_at_run_log_is_refused_before_anything_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The run's log is a name the run writes: a symbolic link there (to a file outside --out) is refused
    like one at model.onnx, so the log is never written through it."""
    outside = tmp_path / "notes.txt"
    outside.write_text("mine\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "run.log").symlink_to(outside)
    o = run_cli([*TINY, "--quiet", "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o, "run.log", max_seconds=120)
    assert outside.read_text() == "mine\n" and (tmp_path / "out" / "run.log").is_symlink()
