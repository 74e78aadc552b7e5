"""The README's timings are what ``bench/readme_timings.py`` prints: its reading of a ``.ci/run`` log, and the README quoting it."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def timings():
    spec = importlib.util.spec_from_file_location("readme_timings", REPO / "bench" / "readme_timings.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while the class is made
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_the_ci_log_gives_the_suites_row(timings, tmp_path):
    log = tmp_path / "ci.log"
    log.write_text("cpu: avx2\nload before the suite: 2.10\n...\n"
                   "============ 1869 passed, 3 skipped, 1 warning in 850.21s (0:14:10) ============\n"
                   "load after the suite: 3.40\n== 9 passed in 184.00s ==\n", encoding="utf-8")  # fmt: skip
    row = timings.from_ci_log(log)
    assert row.wall_s == [850.21] and row.load == (2.1, 3.4), row
    assert row.cells()[:2] == ["`python -m pytest` (1869 passed, 3 skipped, 1 warning, clean clone, `.ci/run`)", "14 min 10 s"]


def test_a_log_without_the_load_lines_is_refused(timings, tmp_path):
    log = tmp_path / "old.log"
    log.write_text("============ 10 passed in 5.00s ============\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="load before/after the suite"):
        timings.from_ci_log(log)


def test_ci_prints_the_load_around_the_suite():
    text = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    before, suite, after = (text.index(s) for s in ('echo "load before the suite', "python -m pytest --durations", 'echo "load after the suite'))
    assert before < suite < after


def test_the_readme_quotes_the_script():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "bench/readme_timings.py" in readme
    assert re.search(r"^measured \d{4}-\d\d-\d\d on .+, \d+ cores, class [\w-]+; pip installs left out", readme, re.M), \
        "the README's timing block is not the script's output"
