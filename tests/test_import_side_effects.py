"""Importing attn_export changes no process state (issue 29, test hygiene).

A fresh interpreter imports the third-party libraries the package uses (so their own import-time
effects are not ours), sets a non-default matplotlib backend as a user's script would, records the
process state, then imports every attn_export module and records it again. Nothing may differ:
matplotlib's backend and rcParams, the root logger and every existing logger (transformers,
onnxruntime, torch ...), the warnings filters, the signal handlers, os.environ, torch's default
dtype, threads and grad mode, numpy's error handling.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_PROBE = r"""
import importlib, json, logging, os, pkgutil, signal, sys, warnings

import matplotlib
matplotlib.use("svg")  # what a user's script may have chosen; not the Agg the plots draw on
import numpy, onnx, onnxruntime, sympy, torch, torch.onnx, transformers  # their import-time effects are theirs

def state():
    loggers = {name: (lg.level, [repr(h) for h in lg.handlers], lg.propagate, lg.disabled)
               for name, lg in logging.root.manager.loggerDict.items()
               if isinstance(lg, logging.Logger) and not name.startswith("attn_export")}
    signals = {s.name: repr(signal.getsignal(s)) for s in signal.Signals
               if s not in (signal.SIGKILL, signal.SIGSTOP)}
    return {
        "matplotlib.backend": matplotlib.get_backend(),
        "matplotlib.rcParams": {k: repr(v) for k, v in matplotlib.rcParams.items() if k != "backend"},
        "root logger": (logging.root.level, [repr(h) for h in logging.root.handlers]),
        "loggers": loggers,
        "logging.disable": logging.root.manager.disable,
        "warnings.filters": [repr(f) for f in warnings.filters],
        "signal handlers": signals,
        "os.environ": dict(os.environ),
        "torch": (str(torch.get_default_dtype()), torch.get_num_threads(), torch.get_num_interop_threads(),
                  torch.is_grad_enabled(), torch.are_deterministic_algorithms_enabled()),
        "numpy.geterr": numpy.geterr(),
    }

before = state()
import attn_export
names = sorted(m.name for m in pkgutil.walk_packages(attn_export.__path__, "attn_export."))
for name in names:
    if name.rsplit(".", 1)[-1] == "__main__":
        continue  # running the CLI is that module's job
    importlib.import_module(name)
after = state()
loggers_before = before.pop("loggers")
loggers_after = after.pop("loggers")
diff = {k: [before[k], after[k]] for k in before if before[k] != after[k]}
diff.update({f"logger {n}": [v, loggers_after[n]] for n, v in loggers_before.items() if loggers_after.get(n) != v})
print(json.dumps({"modules": len(names), "diff": diff}, default=str))
"""


def test_importing_every_module_changes_no_process_state() -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(Path.home())}
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["modules"] > 100, result["modules"]  # every module, not a few
    assert result["diff"] == {}, json.dumps(result["diff"], indent=1)[:4000]
