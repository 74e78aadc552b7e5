"""The fleet cache, measured: examples/fleet-local.toml run cold, then again unchanged (all cache hits),
then cold on a local Ray cluster (``--ray auto``) into its own cache; prints the wall times, the warm/cold
ratio and whether the Ray run's accuracies equal the local run's.

    PYTHONPATH=$PWD python bench/fleet_cache.py [--no-ray]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _fleet(folder: Path, *extra: str) -> tuple[float, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "attn_export.cli", "fleet", str(folder / "fleet.toml"), "--json", *extra],
                          capture_output=True, text=True, env=env, cwd=folder)  # fmt: skip
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        sys.exit(f"fleet exited {proc.returncode}: {proc.stderr[-2000:]}")
    return wall, json.loads(proc.stdout)


def _accuracy(result: dict) -> dict[str, float]:
    return {r["key"]: r["accuracy"]["sqnr_db"] for r in result["points"] if "accuracy" in r}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-ray", action="store_true", help="skip the --ray auto run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        folder = Path(tmp)
        shutil.copyfile(ROOT / "examples" / "fleet-local.toml", folder / "fleet.toml")
        cold, first = _fleet(folder)
        warm, second = _fleet(folder)
        print(f"cold {cold:.1f} s ({first['counts']}), warm {warm:.1f} s ({second['counts']}), warm/cold {warm / cold:.3f}")
        assert set(second["counts"]) == {"cached"}, second["counts"]
        if not args.no_ray:
            shutil.rmtree(folder / ".attn-export-cache")
            ray_wall, on_ray = _fleet(folder, "--ray", "auto")
            same = _accuracy(on_ray) == _accuracy(first)
            print(f"--ray auto cold {ray_wall:.1f} s ({on_ray['counts']}), same accuracies as the local run: {same}")


if __name__ == "__main__":
    main()
