"""A Triton model whose TensorRT engine is picked per GPU compute capability (``cc_model_filenames``).

An engine runs only on the compute capability it was built for (TensorRT docs, "Hardware
Compatibility"), so one model folder holds one engine per capability and config.pbtxt maps each
capability to its file; Triton loads the one matching the GPU it runs on (Triton model
configuration docs, "cc_model_filenames"). Written with tritonclient's protos, like triton_repo.py.

The config must hold for every engine it may load, so its limits come from all of their real
optimization profiles (each engine's sidecar, ``targets/triton_config.py``): the largest batch
every profile of every engine holds, and the profile indices every engine has. Inputs and
outputs are left to Triton's TensorRT backend, which completes them from the plan it loads
(the sidecar records shapes, not data types, and an input without its type is refused).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from attn_export.targets.triton_config import EngineLimits, engine_limits

__all__ = ["cc_config", "engines_limits", "write_cc_repository"]


def _cc(sm: str) -> str:
    """``87`` or ``sm87`` -> ``8.7`` (Triton's capability spelling)."""
    digits = sm.lower().removeprefix("sm").replace(".", "")
    return f"{digits[:-1]}.{digits[-1]}"


def engines_limits(engines: list[Path]) -> tuple[EngineLimits, int] | None:
    """What one config may promise for all ``engines`` (from their sidecars), and the profile count they share.

    None when an engine has no sidecar (a plan attn-export did not build): the config then says only
    which file each capability loads, and Triton completes the rest from the plan.
    """
    from attn_export.runtime.tensorrt.sidecar import read_sidecar, sidecar_path_for

    if not engines or not all(sidecar_path_for(e).is_file() for e in engines):
        return None
    per_engine = [read_sidecar(e).all_profiles() for e in engines]
    if not all(per_engine):
        return None
    return engine_limits([p for profiles in per_engine for p in profiles]), min(len(p) for p in per_engine)


def cc_config(name: str, by_cc: dict[str, str], limits: tuple[EngineLimits, int] | None = None) -> str:
    """config.pbtxt text for ``name``: platform tensorrt_plan, one engine file per capability, the engines' limits."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    cfg = model_config_pb2.ModelConfig(name=name, platform="tensorrt_plan")
    for sm, filename in sorted(by_cc.items()):
        cfg.cc_model_filenames[_cc(sm)] = filename
    if limits is not None:
        bounds, shared_profiles = limits
        cfg.max_batch_size = bounds.max_batch
        group = cfg.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.Kind.Value("KIND_GPU"), count=1)
        if shared_profiles > 1:
            group.profile.extend(str(i) for i in range(shared_profiles))
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
    return atomic_write_text(repo / name / "config.pbtxt", cc_config(name, files, engines_limits(list(engines.values()))))
