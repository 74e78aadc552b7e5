"""Shared pytest setup: tests/ on sys.path (for ``fixtures``), deterministic torch, few threads."""

from __future__ import annotations

import os
import sys

# Before torch loads libgomp: spinning OpenMP threads make CPU-heavy tests 10-50x slower on a busy box.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
