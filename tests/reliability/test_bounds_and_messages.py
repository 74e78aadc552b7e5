"""Numbers beyond their bounds (issue 20, class 18) and stale or wrong words, unbounded or empty work (class 20).

Class 18: a TensorRT profile whose batch exceeds int64 (TensorRT's dimension type) or a stated
bound (``shape_profile.MAX_PROFILE_BATCH`` / ``MAX_PROFILE_SEQ``), a number too long for ``int()``, a
huge ``--workspace`` or ``--max-memory``: each one line, exit 2, before any work. Class 20:
every flag a sweep refusal names is one of ``sweep``'s own options, every boolean flag's help
states its real default, ``bench --variants ''`` names no variant and is refused, and a sweep
grid larger than ``--max-points`` needs ``--yes``.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
import rel_inputs as mk
import typer
from rel_helpers import TINY, assert_refused, run_cli

from attn_export.targets.shape_profile import MAX_PROFILE_BATCH, MAX_PROFILE_SEQ

INT64_PLUS_ONE = str(2**63)
SHAPES = {
    "c18-check-trt-batch-beyond-int64": (["--max-shape", f"{INT64_PLUS_ONE}x128"], "beyond int64"),
    "c18-check-trt-seq-beyond-int64": (["--opt-shape", f"8x{INT64_PLUS_ONE}"], "beyond int64"),
    "c18-check-trt-30-digit-batch": (["--min-shape", "9" * 30 + "x8"], "beyond int64"),
    "c18-check-trt-5000-digit-batch": (["--max-shape", "1" + "0" * 5000 + "x8"], "BATCHxSEQ"),
    "c18-check-trt-batch-beyond-the-bound": (["--max-shape", f"{MAX_PROFILE_BATCH + 1}x8"], f"batch <= {MAX_PROFILE_BATCH}"),
    "c18-check-trt-seq-beyond-the-bound": (["--max-shape", f"8x{MAX_PROFILE_SEQ + 1}"], f"sequence length <= {MAX_PROFILE_SEQ}"),
}


@pytest.mark.parametrize("case", list(SHAPES), ids=list(SHAPES))
def test_check_trt_refuses_a_profile_beyond_int64_or_its_bound(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    extra, expect = SHAPES[case]
    assert_refused(run_cli(["check-trt", mk.onnx_valid(tmp_path / "m.onnx"), *extra], capsys, tmp_path), expect)


MAIN = {
    "c18-main-max-shape-beyond-int64": (["--target", "tensorrt", "--max-shape", f"{INT64_PLUS_ONE}x8"], "beyond int64"),
    "c18-main-workspace-huge": (["--target", "tensorrt", "--workspace", "99999999999999999999T"], "between 1 byte and 1 EiB"),
    "c18-main-workspace-exponent": (["--target", "tensorrt", "--workspace", "1e400"], "--workspace as a size"),
    "c18-main-max-memory-huge": (["--max-memory", "99999999999999999999T"], "between 1 byte and 1 EiB"),
}


@pytest.mark.parametrize("case", list(MAIN), ids=list(MAIN))
def test_the_main_command_refuses_numbers_beyond_their_bounds(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    extra, expect = MAIN[case]
    assert_refused(run_cli([*TINY, *extra, "--out", tmp_path / "out"], capsys, tmp_path), expect)


def _app() -> click.Command:
    from attn_export.cli.app import _register, app

    _register()
    return typer.main.get_command(app)


def _sweep_options() -> set[str]:
    cmd = _app().commands["sweep"]  # type: ignore[attr-defined]
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}


SWEEP = {
    "c20-sweep-bad-axis-value": ["--low-rank", "half"],
    "c20-sweep-empty-grid": ["--low-rank", "none", "--distill", "40", "--quantize", "none", "--precision", "fp32"],
    "c20-sweep-bad-calibration": ["--calib-method", "bogus"],
    "c20-sweep-bad-route": ["--int8-mode", "bogus"],
    "c20-sweep-bad-precision": ["--precision", "fp64"],
    "c20-sweep-empty-axis": ["--quantize", ","],
}


@pytest.mark.parametrize("case", list(SWEEP), ids=list(SWEEP))
def test_a_sweep_refusal_names_only_sweeps_own_flags(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    o = run_cli(["sweep", "--d-model", "32", "--heads", "4", *SWEEP[case], "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o)
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", o.err))
    assert named and named <= _sweep_options(), f"names flags sweep does not have: {sorted(named - _sweep_options())} in {o.err!r}"


def test_c20_a_sweep_grid_larger_than_max_points_needs_yes(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from attn_export.campaigns.sweep import SweepConfig

    monkeypatch.chdir(tmp_path)
    grid = {"--low-rank": "none," + ",".join(f"0.{i}" for i in range(1, 10)), "--distill": ",".join(str(n) for n in range(1, 26)),
            "--quantize": "none,int8", "--precision": "fp32"}  # fmt: skip
    argv = ["sweep", "--d-model", "32", "--heads", "4", *[x for kv in grid.items() for x in kv], "--out", tmp_path / "out"]
    o = run_cli(argv, capsys, tmp_path)
    assert_refused(o, "> --max-points 64; narrow an axis, or pass --yes to run it anyway")
    points = int(re.search(r"grid has (\d+) points", o.err).group(1))  # type: ignore[union-attr]
    assert points >= 1000, o.err
    # --yes lifts the bound (what the CLI passes); built, not run
    cfg = SweepConfig(low_rank=(None, *(i / 10 for i in range(1, 10))), distill=tuple(range(1, 26)), quantize=(None, "int8"), precision=("fp32",),
                      base={"d_model": 32, "heads": 4}, max_points=2**31)  # fmt: skip
    assert len(cfg.points()) == points


def test_c20_bench_with_no_variants_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for empty in ("", " , "):
        assert_refused(run_cli(["bench", "--variants", empty, "--out", tmp_path / "out"], capsys, tmp_path), "--variants to name at least one variant")


def test_c20_every_boolean_flags_help_states_its_real_default() -> None:
    """``report --attention-maps`` said off while it was on; every flag of every command is checked."""
    wrong = []

    def walk(cmd: click.Command, name: str) -> None:
        for sub_name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{name} {sub_name}")
        for p in cmd.params:
            shown = getattr(p, "show_default", None)
            if isinstance(p, click.Option) and p.is_flag and shown in ("on", "off") and bool(p.default) != (shown == "on"):
                wrong.append(f"{name} {p.opts[0]}: default {p.default}, help says {shown}")

    walk(_app(), "attn-export")
    assert not wrong, wrong


@pytest.mark.parametrize("shape", [(2**63, 8), (8, 2**64), (MAX_PROFILE_BATCH + 1, 1), (True, 8), (0, 8), (1.5, 8)],
                         ids=["c18-profile-batch-int64-plus-one", "c18-profile-seq-2-64", "c18-profile-batch-bound", "c18-profile-bool",
                              "c18-profile-zero", "c18-profile-float"])  # fmt: skip
def test_a_shape_profile_built_in_code_is_bounded_too(shape: tuple) -> None:
    from attn_export.errors import ConfigError
    from attn_export.runtime.tensorrt.spec import ShapeProfile

    with pytest.raises(ConfigError, match="max shape") as err:
        ShapeProfile((1, 1), (1, 1), shape)
    assert "\n" not in str(err.value)
