"""Fixtures for the reliability suite (issue 13): bad input never becomes a traceback or a false
PASS, outputs of different runs never mix, and interrupts leave nothing behind.

Every case id starts with ``cNN-``, the class of defect it belongs to (issue 13: 1-10, issue 20:
11-14), so
``python tests/reliability/summary.py`` can tabulate the outcomes by class. Helpers live in
``rel_helpers.py``, bad-input builders in ``rel_inputs.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rel_helpers import Proc


@pytest.fixture
def proc_factory() -> Iterator[Callable[..., Proc]]:
    procs: list[Proc] = []

    def make(args: list[str], cwd: Path, tmpdir: Path | None = None) -> Proc:
        procs.append(Proc(args, cwd, tmpdir))
        return procs[-1]

    yield make
    for p in procs:
        p.kill()


# -- shared inputs ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def calib32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A calibration set for the tiny layer (d_model 32): the shipped one is for 512."""
    from attn_export.compress.calib.generate import generate_calibration

    return generate_calibration(tmp_path_factory.mktemp("calib") / "calib_d32.npz", 32, n_calib=16, n_val=4, seq_len=8, seed=0)


@pytest.fixture(scope="session")
def calib32_slow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Enough calibration data that static int8 (histograms, sensitivity, fallback) takes seconds (a window to interrupt it in)."""
    from attn_export.compress.calib.generate import generate_calibration

    return generate_calibration(tmp_path_factory.mktemp("calib") / "calib_d32_large.npz", 32, n_calib=1024, n_val=16, seq_len=128, seed=0)
