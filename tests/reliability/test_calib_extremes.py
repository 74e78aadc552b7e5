"""Extreme but finite calibration data: refused with the reason, or handled, never an internal error (issue 20, class 16).

1e30-scale activations are finite, so ``calib check`` accepted them, and static calibration
then failed inside the histograms (a NaN bin index; an endless bin-width doubling on Inf).
Now the loader refuses data whose per-token sum of squares overflows float32 (at ``calib
check`` and before a run builds anything), every probed activation must stay finite, and
an int8 range must fit its float32 scale and, on TensorRT's INT8+FP16 build, fp16.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import rel_inputs as mk
from rel_helpers import REPO, TINY, assert_refused, run_cli


def _scaled(path: Path, scale: float, dtype: type = np.float32) -> Path:
    arrays = mk.calib_arrays()
    for k in ("calib_x", "val_x"):
        arrays[k] = (arrays[k].astype(np.float64) * scale).astype(dtype)
    return mk.npz(path, **arrays)


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "per-tensor"], ids=[f"c16-static-{m}-on-1e30-data" for m in ["minmax", "percentile", "entropy", "per-tensor"]])
def test_static_calibration_on_1e30_data_is_refused_with_the_reason(method: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calib = _scaled(tmp_path / "big.npz", 1e30)
    o = run_cli([*TINY, "--quantize", "int8", "--calib", calib, "--int8-mode", "static", "--calib-method", method, "--out", tmp_path / "out"],
                capsys, tmp_path)  # fmt: skip
    assert_refused(o, "beyond float32's 3.4e+38, so the layer's LayerNorm and attention overflow")


@pytest.mark.parametrize(("scale", "dtype"), [(1e30, np.float32), (1e200, np.float64), (3e18, np.float32)],
                         ids=["c16-calib-check-1e30", "c16-calib-check-1e200-float64", "c16-calib-check-3e18"])  # fmt: skip
def test_calib_check_refuses_what_calibration_cannot_use(scale: float, dtype: type, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    o = run_cli(["calib", "check", _scaled(tmp_path / "c.npz", scale, dtype)], capsys, tmp_path)
    assert_refused(o, "sum of squares of a token's 32 features")


def test_c16_calib_check_in_a_subprocess_is_one_line(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "attn_export.cli", "calib", "check", str(_scaled(tmp_path / "c.npz", 1e30))],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})  # fmt: skip
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert run.returncode == 2 and len(lines) == 1 and lines[0].startswith("attn-export: error:") and "float32" in lines[0], run.stderr


def test_c16_1e17_data_is_handled_the_run_judges_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Large but computable: calibration runs and the report judges it (a tolerance verdict, not an error).

    int8 on this data lands near the table's int8 bar (rel_l2 0.055 against 0.05), so the bar is set
    well clear of it (rel_l2 0.2, cosine 0.99): the run must then pass, on numbers the report states."""
    calib = _scaled(tmp_path / "e17.npz", 1e17)
    o = run_cli([*TINY, "--quantize", "int8", "--calib", calib, "--int8-mode", "static", "--calib-method", "entropy", "--int8-fallback", "none",
                 "--rtol", "0.2", "--cosine-min", "0.99", "--out", tmp_path / "out"],
                capsys, tmp_path)  # fmt: skip
    assert o.code == 0 and "error" not in o.err and "Traceback" not in o.err, (o.code, o.out, o.err)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    stage = next(s for s in report["stages"] if s["name"] == "int8-static")
    assert stage["passed"] is True and report["verdict"] == {"passed": True, "state": "PASS"}, report["verdict"]
    assert 0 < stage["accuracy"]["rel_l2"] < 0.2 and 0.99 < stage["accuracy"]["cosine"] < 1, stage["accuracy"]  # judged, and not trivially


def test_c16_a_range_beyond_fp16_is_refused_on_tensorrts_int8_fp16_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calib = _scaled(tmp_path / "e5.npz", 1e5)  # fine in float32, beyond fp16's 65504
    o = run_cli([*TINY, "--target", "tensorrt", "--quantize", "int8", "--calib", calib, "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o, "beyond fp16's largest value 65504", after=("subject", "export"))  # found while calibrating, after the export
    assert o.reached == ["subject", "export"], o.reached
    with pytest.raises(AssertionError, match="validation should come before work"):  # the helper tells a late refusal from an early one
        assert_refused(o, "beyond fp16's largest value 65504")
