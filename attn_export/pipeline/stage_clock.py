"""Time to ship as a product figure: the wall and CPU time of every phase of a run, in the order they ran.

A user who tries a recipe must see where the minutes go (issue 40: all-mpnet-base-v2's int8 took
70 minutes with nothing saying why). Each phase is timed where it runs: the subject (checkpoint,
reference, data), every build step (an export, a route with its calibration and fallback search),
the side-by-side timing pass, judging, selection and deployment. CPU time is the process's
(``time.process_time``: every thread of ONNX Runtime's and torch's pools), so CPU / wall says how
much of a phase ran in parallel. Rendering runs after report.json is written: its time is in the
progress line and run.log only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["PhaseTime", "StageClock"]


@dataclass(frozen=True)
class PhaseTime:
    name: str  # "subject", a stage name ("onnx-fp32", "int8-static-packed"), "timing", "judging", "selection and deploy"
    kind: str  # subject | build | timing | judging | deploy
    wall_s: float
    cpu_s: float


@dataclass
class StageClock:
    """Collects ``PhaseTime`` rows; ``phase`` times a block (also when it raises: the row says how far it got)."""

    phases: list[PhaseTime] = field(default_factory=list)

    @contextmanager
    def phase(self, name: str, kind: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.phases.append(PhaseTime(name, kind, time.perf_counter() - wall, time.process_time() - cpu))

    def last(self) -> str:
        """The last phase's figures, for the progress line: ``12.3 s wall, 20.1 s CPU``."""
        p = self.phases[-1]
        return f"{p.wall_s:.1f} s wall, {p.cpu_s:.1f} s CPU"

    def to_dict(self) -> dict[str, Any]:
        return {"phases": [asdict(p) for p in self.phases], "wall_s": sum(p.wall_s for p in self.phases),
                "cpu_s": sum(p.cpu_s for p in self.phases)}  # fmt: skip
