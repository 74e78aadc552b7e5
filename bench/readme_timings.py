"""How long the README's two commands take here: the table the README quotes, with its date, CPU and load.

The README promises two commands on a fresh machine and states their times; times drift as the
project grows and machines change, so the README quotes only what this script prints. It runs
the main job (``attn-export --quantize int8``) ``--runs`` times from an empty folder and, with
``--with-tests``, the test command (``python -m pytest`` in the repository), timing each as a
child process: wall time, and CPU time (user + system) from ``resource.getrusage`` of the
children. ``--ci-log FILE`` reads the test command's figures from a ``.ci/run`` log instead (it
prints the load around the suite), so the clean-clone run is the measurement. Every row names
the CPU (model and instruction-set class) and the 1-minute load average before and after it:
on a shared 2-core machine the load is most of the spread.

    python bench/readme_timings.py [--runs 3] [--with-tests] [--ci-log .ci-run.log]

The pip installs are left out (they depend on the network and the local wheel cache).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAIN_JOB = ["attn-export", "--quantize", "int8"]
TEST_COMMAND = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
_SUMMARY = re.compile(r"=+ (?P<counts>.*?) in (?P<seconds>[\d.]+)s")
_LOAD = re.compile(r"^load (?P<when>before|after) the suite: (?P<load>[\d.]+)", re.M)


@dataclass
class Row:
    command: str
    wall_s: list[float]
    cpu_s: list[float]
    load: tuple[float, float]
    note: str = ""

    def cells(self) -> list[str]:
        spread = f" ({_clock(min(self.wall_s))}-{_clock(max(self.wall_s))} over {len(self.wall_s)} runs)" if len(self.wall_s) > 1 else ""
        cpu = _clock(_median(self.cpu_s)) if self.cpu_s else "not recorded"
        return [f"`{self.command}`{self.note}", _clock(_median(self.wall_s)) + spread, cpu, f"{self.load[0]:.1f} / {self.load[1]:.1f}"]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if len(ordered) % 2 else (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2


def _clock(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 100 else f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], cwd: Path) -> tuple[float, float, str]:
    """(wall s, CPU s, last output line) of one run of ``command``; a failing command stops the script."""
    cpu, start = _children_cpu(), time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-500:]}")
    lines = (proc.stdout or "").strip().splitlines()
    return wall, _children_cpu() - cpu, lines[-1] if lines else ""


def main_job(runs: int) -> Row:
    walls, cpus, before = [], [], os.getloadavg()[0]
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="attn_export_readme_") as tmp:
            wall, cpu, _ = timed([*MAIN_JOB, "--quiet"], Path(tmp))  # its default --out, under the empty folder
        walls.append(wall)
        cpus.append(cpu)
    return Row("attn-export --quantize int8", walls, cpus, (before, os.getloadavg()[0]))


def test_command() -> Row:
    before = os.getloadavg()[0]
    wall, cpu, last = timed(TEST_COMMAND, REPO)
    found = _SUMMARY.search(last)
    return Row("python -m pytest", [wall], [cpu], (before, os.getloadavg()[0]), f" ({found['counts']})" if found else "")


def from_ci_log(path: Path) -> Row:
    """The test command's row from a ``.ci/run`` log: pytest's summary line and the load .ci/run printed around it."""
    text = path.read_text(encoding="utf-8", errors="replace")
    summaries = [m for m in _SUMMARY.finditer(text) if "passed" in m["counts"]]
    loads = {m["when"]: float(m["load"]) for m in _LOAD.finditer(text)}
    if not summaries or set(loads) != {"before", "after"}:
        sys.exit(f"{path}: no pytest summary line or no 'load before/after the suite' lines; is it a .ci/run log of this version?")
    first = summaries[0]  # the README's test command runs before the documentation run
    return Row("python -m pytest", [float(first["seconds"])], [], (loads["before"], loads["after"]), f" ({first['counts']}, clean clone, `.ci/run`)")


def machine() -> str:
    sys.path.insert(0, str(REPO))
    from attn_export.host.environment import detect_cpu

    cpu = detect_cpu()
    return f"{cpu.model or 'unknown CPU'}, {os.cpu_count()} cores, class {cpu.isa_class}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of the main job (default 3)")
    parser.add_argument("--with-tests", action="store_true", help="also run the test command (minutes)")
    parser.add_argument("--ci-log", type=Path, help="read the test command's row from a .ci/run log instead")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    if args.ci_log is not None and not args.ci_log.is_file():
        parser.error(f"--ci-log {args.ci_log}: no such file")
    rows = [main_job(args.runs)]
    if args.ci_log is not None:
        rows.append(from_ci_log(args.ci_log))
    elif args.with_tests:
        rows.append(test_command())
    print(f"measured {dt.date.today().isoformat()} on {machine()}; pip installs left out; load = 1-min load average before / after")
    print("| command | wall time | CPU time | load |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row.cells()) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
