"""A Triton model whose TensorRT engine is picked per GPU compute capability (``cc_model_filenames``).

An engine runs only on the compute capability it was built for (TensorRT docs, "Hardware
Compatibility"), so one model folder holds one engine per capability and config.pbtxt maps each
capability to its file; Triton loads the one matching the GPU it runs on (Triton model
configuration docs, "cc_model_filenames"). Written with tritonclient's protos, like triton_repo.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["cc_config", "write_cc_repository"]


def _cc(sm: str) -> str:
    """``87`` or ``sm87`` -> ``8.7`` (Triton's capability spelling)."""
    digits = sm.lower().removeprefix("sm").replace(".", "")
    return f"{digits[:-1]}.{digits[-1]}"


def cc_config(name: str, by_cc: dict[str, str]) -> str:
    """config.pbtxt text for ``name``: platform tensorrt_plan, one engine file per capability."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    cfg = model_config_pb2.ModelConfig(name=name, platform="tensorrt_plan")
    for sm, filename in sorted(by_cc.items()):
        cfg.cc_model_filenames[_cc(sm)] = filename
    return text_format.MessageToString(cfg)


def write_cc_repository(repo: Path, name: str, engines: dict[str, Path]) -> Path:
    """``repo/name/1/model.sm<cc>.plan`` for each engine, and ``repo/name/config.pbtxt`` mapping capabilities to them."""
    from attn_export.validate.report import atomic_write_text

    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    files = {}
    for sm, engine in engines.items():
        filename = f"model.sm{sm.lower().removeprefix('sm')}.plan"
        shutil.copyfile(engine, version / filename)
        files[sm] = filename
    return atomic_write_text(repo / name / "config.pbtxt", cc_config(name, files))
