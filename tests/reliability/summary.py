"""Tabulate the reliability suite by class of defect: issue 13's ten, issue 20's (11-20), round four's (21-29)
and round five's (30-34).

    python tests/reliability/summary.py            # runs tests/reliability, prints a Markdown table

Every case's id (test function name or parameter id) carries its class as ``cNN``. A case is
*clean* when its test passes; an ``xfail`` case (a known defect owned by other work, strict so
it turns red once fixed) is listed separately. A signal test covers SIGINT and SIGTERM, so it
counts as two inputs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

CLASSES = {
    1: "documented layers fail (linear, block-sparse)",
    2: "outputs of different runs mix",
    3: "the CI gate can be fooled",
    4: "check-trt passes invalid graphs",
    5: "checkpoint files outside the checkpoint folder",
    6: "nothing sized before it is allocated",
    7: "bad input ends in a traceback",
    8: "wrong results accepted silently",
    9: "interrupts and write failures",
    10: "late validation, inconsistent messages",
    11: "--out follows symbolic links",
    12: "a crash loses the last complete run",
    13: "checks that pass on nothing",
    14: "FIFOs and devices as input files",
    15: "the device validator passes on nothing or shows a traceback",
    16: "extreme but finite calibration data",
    17: "a valid mask x attention form fails to render its report",
    18: "numbers beyond int64 or a stated bound",
    19: "a signal where an exception cannot propagate (finalizers, clean-up)",
    20: "stale flag names, wrong help, unbounded or empty work",
    21: "a user's files in --out, --bundle, --triton or --junit overwritten or deleted",
    22: "a tokenizer, config or weights that disagree with each other end in a traceback or a wrong message",
    23: "sentence-transformers settings ignored (prompts, max_seq_length, modules.json)",
    24: "tolerance flags dropped or malformed without a word",
    25: "texts judged as held out or meaningful when they are not",
    26: "TensorRT releases and target combinations that do not exist",
    27: "the headline path crashes on a supported input",
    28: "memory limits, closed or full standard streams, library output under --quiet",
    29: "misleading messages and unbounded value lists",
    30: "a cache entry served without verifying it (tampered, partial, linked or stale)",
    31: "golden checks that pass on non-finite, rescaled or malformed outputs",
    32: "a user's folder taken for our bookkeeping (staging, previous run) and deleted or moved",
    33: "fleet inputs and Ray addresses not validated before work (files, paths, sizes, hangs)",
    34: "the environment breaks the run (encodings, a deleted folder, file limits, a closed pipe)",
}


def main() -> int:
    here = Path(__file__).resolve().parent
    repo = here.parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        env = dict(os.environ, PYTHONPATH=str(repo))
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here), f"--junitxml={xml}"], cwd=repo, env=env, check=False)  # noqa: S603
        tree = ET.parse(xml)
    tried, clean, xfailed, failed = Counter(), Counter(), Counter(), []
    for case in tree.iter("testcase"):
        name = case.get("name", "")
        m = re.search(r"c(\d\d)", name)
        if not m:
            continue
        cls = int(m.group(1))
        weight = 2 if "sigint-and-sigterm" in name else 1
        skipped = case.find("skipped")
        if skipped is not None and "xfail" in (skipped.get("type", "") + skipped.get("message", "")).lower():
            xfailed[cls] += weight
            continue
        if skipped is not None:
            continue
        tried[cls] += weight
        if case.find("failure") is None and case.find("error") is None:
            clean[cls] += weight
        else:
            failed.append(name)
    print("| # | class | bad inputs tried | clean | known, owned elsewhere (xfail) |")
    print("|---|---|---|---|---|")
    for n, title in CLASSES.items():
        print(f"| {n} | {title} | {tried[n]} | {clean[n]} | {xfailed[n] or ''} |")
    total, ok = sum(tried.values()), sum(clean.values())
    print(f"| | **total** | **{total}** | **{ok} ({100 * ok / max(total, 1):.0f}%)** | {sum(xfailed.values())} |")
    if failed:
        print("\nnot clean: " + ", ".join(failed))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
