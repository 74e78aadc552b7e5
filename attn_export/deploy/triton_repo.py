"""A Triton Inference Server model repository for the exported model (and engine).

Layout::

    <repo>/<model>/config.pbtxt          platform "onnxruntime_onnx"
    <repo>/<model>/1/model.onnx
    <repo>/<model>_trt/config.pbtxt      platform "tensorrt_plan" (only when an engine was built)
    <repo>/<model>_trt/1/model.plan

Configs are built as ``tritonclient.grpc.model_config_pb2.ModelConfig`` messages and
written with ``google.protobuf.text_format``, so they are valid by construction. Names and
dtypes come from the ONNX graph; the batch dim is left to Triton (``max_batch_size``) when
it is dynamic in the export, and the sequence dim is -1. ``max_batch_size`` and dynamic
batching must agree with the export and with the engine's optimization profiles.

The TensorRT plan's config is derived from the profiles the engine was built with, read from
its sidecar (``targets.triton_config.engine_limits``): ``max_batch_size`` is the largest batch
every profile holds, each input's dims are fixed where every profile fixes them and -1 elsewhere,
and an engine with several profiles (length buckets) lists them all in its instance group. A
hand-written config (``--triton-config FILE``) is used instead only when the engine can serve it:
a larger ``max_batch_size``, an input the engine lacks or a fixed dim it does not have is refused.

A version-compatible engine embeds TensorRT's lean runtime, which Triton's TensorRT
backend only loads when the server runs with ``--backend-config=tensorrt,version-compatible=true``
(a server-wide option, not a model-config field: triton-inference-server/tensorrt_backend
README). The repository's ``README.md`` says how to start the server, with that flag when
the engine's sidecar says ``version_compatible``.

The repository holds only what attn-export wrote (``deploy.folder``): it is staged inside the
folder and swapped in file by file, replacing only an earlier repository's own files; a
folder with anything else in it (another model, a user's file) is refused, never cleared.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import onnx

from attn_export.host.lazy import require
from attn_export.deploy.folder import publish, staging
from attn_export.errors import ConfigError
from attn_export.targets.shape_profile import ShapeProfile
from attn_export.targets.triton_config import EngineLimits, check_hand_config, engine_limits, read_hand_config

__all__ = ["write_triton_repo", "server_command", "TRITON_DTYPES", "DEFAULT_MAX_BATCH", "VERSION_COMPATIBLE_FLAG"]

log = logging.getLogger(__name__)

TRITON_DTYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "TYPE_FP32",
    onnx.TensorProto.FLOAT16: "TYPE_FP16",
    onnx.TensorProto.BFLOAT16: "TYPE_BF16",
    onnx.TensorProto.DOUBLE: "TYPE_FP64",
    onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.INT32: "TYPE_INT32",
    onnx.TensorProto.INT8: "TYPE_INT8",
    onnx.TensorProto.UINT8: "TYPE_UINT8",
    onnx.TensorProto.BOOL: "TYPE_BOOL",
}
DEFAULT_MAX_BATCH = 8
VERSION_COMPATIBLE_FLAG = "--backend-config=tensorrt,version-compatible=true"


def server_command(repo: Path, version_compatible: bool) -> str:
    """The tritonserver line for ``repo``; version-compatible plans need the backend flag."""
    flag = f" {VERSION_COMPATIBLE_FLAG}" if version_compatible else ""
    return f"tritonserver --model-repository={repo}{flag}"


def _engine_is_version_compatible(engine_path: str | os.PathLike[str]) -> bool:
    """What the engine's sidecar says (False when there is none: engines without one are refused elsewhere)."""
    from attn_export.runtime.tensorrt.sidecar import read_sidecar, sidecar_path_for

    if not sidecar_path_for(engine_path).is_file():
        return False
    return read_sidecar(engine_path).version_compatible


def _write_readme(staged: Path, repo: Path, model_name: str, engine: bool, version_compatible: bool) -> None:
    models = f"`{model_name}` (ONNX Runtime)" + (f" and `{model_name}_trt` (TensorRT plan)" if engine else "")
    vc = (
        f"\nThe TensorRT plan is version-compatible: it embeds TensorRT's lean runtime, and Triton's TensorRT backend "
        f"loads it only with `{VERSION_COMPATIBLE_FLAG}` on the server command line (it is a server option, not a "
        f"config.pbtxt field).\n"
        if version_compatible
        else ""
    )
    text = f"""# Triton model repository

Models: {models}.

    {server_command(repo, version_compatible)}
{vc}"""
    (staged / "README.md").write_text(text)


def _io(values: Any, inits: set[str]) -> list[tuple[str, int, list[int | None]]]:
    out = []
    for vi in values:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        if t.elem_type not in TRITON_DTYPES:
            raise ConfigError(f"tensor {vi.name!r} has ONNX type {onnx.TensorProto.DataType.Name(t.elem_type)}, which Triton configs cannot express")
        out.append((vi.name, t.elem_type, [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]))
    return out


def _engine_limits(engine_path: str | os.PathLike[str]) -> EngineLimits | None:
    """The Triton limits of the engine's real profiles, from its sidecar (None without one: a plan attn-export did not build)."""
    from attn_export.runtime.tensorrt.sidecar import read_sidecar, sidecar_path_for

    if not sidecar_path_for(engine_path).is_file():
        return None
    profiles = read_sidecar(engine_path).all_profiles()
    return engine_limits(profiles) if profiles else None


def _resolve_batch(batch_dynamic: bool, max_batch_size: int | None, dynamic_batching: bool, profiles: ShapeProfile | None, engine: bool,
                   limits: EngineLimits | None = None) -> int:  # fmt: skip
    if not batch_dynamic:
        if dynamic_batching or max_batch_size:
            raise ConfigError("the model's batch dim is static, so Triton cannot batch it; export with a dynamic batch or pass dynamic_batching=False")
        return 0
    if engine and limits is not None:  # the built engine's real profiles decide, not the options it was asked for
        mbs = max_batch_size if max_batch_size is not None else limits.max_batch
        if mbs > limits.max_batch:
            raise ConfigError(f"max_batch_size {mbs} exceeds the engine's {limits.max_batch} (the largest batch its optimization profiles hold); "
                              f"lower it or rebuild with a larger --max-shape")  # fmt: skip
        return mbs
    mbs = max_batch_size if max_batch_size is not None else (profiles.max[0] if profiles else DEFAULT_MAX_BATCH)
    if mbs < 1:
        raise ConfigError(f"expected max_batch_size >= 1 for a dynamic batch dim, got {mbs}")
    if not engine or profiles is None:
        return mbs
    if profiles.min[0] > 1:
        raise ConfigError(f"Triton sends batches from 1 to {mbs}, but the profile's min batch is {profiles.min[0]}; rebuild with --min-shape 1xL")
    if mbs > profiles.max[0]:
        raise ConfigError(f"max_batch_size {mbs} exceeds the engine profile's max batch {profiles.max[0]}; lower it or rebuild with a larger --max-shape")
    return mbs


def _config(name: str, platform: str, inputs: list, outputs: list, mbs: int, dynamic_batching: bool, gpu: bool) -> Any:
    mc = require("tritonclient.grpc.model_config_pb2", "tritonclient[grpc]", what="tritonclient (Triton config protos)")
    cfg = mc.ModelConfig(name=name, platform=platform, max_batch_size=mbs)
    for coll, tensors in ((cfg.input, inputs), (cfg.output, outputs)):
        for tname, etype, dims in tensors:
            kept = dims[1:] if mbs > 0 else dims
            coll.add(name=tname, data_type=mc.DataType.Value(TRITON_DTYPES[etype]), dims=[-1 if d in (None, 0) else int(d) for d in kept])
    if dynamic_batching and mbs > 0:
        cfg.dynamic_batching.max_queue_delay_microseconds = 100
    if gpu:
        cfg.instance_group.add(kind=mc.ModelInstanceGroup.Kind.Value("KIND_GPU"), count=1)
    return cfg


def _apply_engine_profiles(cfg: Any, limits: EngineLimits | None) -> Any:
    """Give the plan's config the engine's input dims and, with several profiles, all of their indices."""
    if limits is None:
        return cfg
    if cfg.max_batch_size > 0:
        for entry in cfg.input:
            if entry.name in limits.dims:
                del entry.dims[:]
                entry.dims.extend(limits.dims[entry.name])
    if limits.profiles > 1:
        for group in cfg.instance_group:
            del group.profile[:]
            group.profile.extend(str(i) for i in range(limits.profiles))
    return cfg


def _hand_trt_config(path: str | os.PathLike[str], name: str, limits: EngineLimits | None, mbs: int) -> Any:
    """The user's config for the plan, checked against the engine (its sidecar's profiles, else the requested profile)."""
    cfg = read_hand_config(path)
    if limits is None:
        limits = EngineLimits(mbs, {e.name: tuple(int(d) for d in e.dims) for e in cfg.input}, 1)
    check_hand_config(cfg, limits)
    if cfg.platform and cfg.platform != "tensorrt_plan" or cfg.backend and cfg.backend != "tensorrt":
        raise ConfigError(f"--triton-config {path}: platform {cfg.platform or cfg.backend!r} is not TensorRT's; use platform \"tensorrt_plan\"")
    cfg.name, cfg.platform = name, "tensorrt_plan"
    return cfg


def _write_model(repo: Path, model: str, cfg: Any, artifact: str | os.PathLike[str], filename: str) -> Path:
    """``repo/model/config.pbtxt`` and ``repo/model/1/<filename>`` (``repo`` is the staging folder)."""
    from google.protobuf import text_format

    final = repo / model
    (final / "1").mkdir(parents=True)
    shutil.copyfile(artifact, final / "1" / filename)
    (final / "config.pbtxt").write_text(text_format.MessageToString(cfg))
    return final


def write_triton_repo(
    repo_dir: str | os.PathLike[str],
    model_name: str,
    onnx_path: str | os.PathLike[str],
    engine_path: str | os.PathLike[str] | None = None,
    max_batch_size: int | None = None,
    dynamic_batching: bool = True,
    profiles: ShapeProfile | None = None,
    version_compatible: bool | None = None,
    flag: str = "--triton",
    hand_config: str | os.PathLike[str] | None = None,
) -> Path:
    """Write ``<repo>/<model_name>`` (ONNX Runtime) and, with an engine, ``<model_name>_trt``.

    version_compatible: whether the engine was built version-compatible; None reads the
    engine's sidecar. The repository README states the server flag such an engine needs.
    ``repo_dir`` holds only what attn-export wrote: a file in it that no earlier repository of
    ours wrote is refused (``ConfigError`` naming it and ``flag``), never deleted (``deploy.folder``).
    hand_config: a ``config.pbtxt`` for the plan, used after it is checked against the engine's profiles.
    """
    if not model_name or "/" in model_name or model_name.startswith("."):
        raise ConfigError(f"expected a plain model name (no '/' or leading '.'), got {model_name!r}")
    if not os.path.isfile(onnx_path):
        raise ConfigError(f"ONNX model {onnx_path} does not exist; export it first")
    if engine_path is not None and not os.path.isfile(engine_path):
        raise ConfigError(f"engine {engine_path} does not exist; build it first or leave the engine out")
    proto = onnx.load(os.fspath(onnx_path), load_external_data=False)
    inits = {t.name for t in proto.graph.initializer}
    inputs, outputs = _io(proto.graph.input, inits), _io(proto.graph.output, set())
    batch_dynamic = all(dims and dims[0] is None for _, _, dims in inputs + outputs)
    repo = Path(repo_dir)
    onnx_mbs = _resolve_batch(batch_dynamic, max_batch_size, dynamic_batching, profiles, engine=False)
    limits = _engine_limits(engine_path) if engine_path is not None else None
    trt_mbs = _resolve_batch(batch_dynamic, max_batch_size, dynamic_batching, profiles, True, limits) if engine_path is not None else 0
    if hand_config is not None and engine_path is None:
        raise ConfigError("--triton-config describes the TensorRT plan; build an engine (--build-engine) or leave it out")
    trt_name = f"{model_name}_trt"
    trt_cfg = None
    if engine_path is not None:
        trt_cfg = (_hand_trt_config(hand_config, trt_name, limits, trt_mbs) if hand_config is not None else
                   _apply_engine_profiles(_config(trt_name, "tensorrt_plan", inputs, outputs, trt_mbs, dynamic_batching, True), limits))  # fmt: skip
    vc = engine_path is not None and (version_compatible if version_compatible is not None else _engine_is_version_compatible(engine_path))
    with staging(repo) as tmp:  # written beside, then swapped in file by file: only our own earlier files are replaced
        _write_model(tmp, model_name, _config(model_name, "onnxruntime_onnx", inputs, outputs, onnx_mbs, dynamic_batching, False), onnx_path, "model.onnx")
        if engine_path is not None:
            _write_model(tmp, trt_name, trt_cfg, engine_path, "model.plan")
        _write_readme(tmp, repo, model_name, engine_path is not None, vc)
        publish(tmp, repo, flag, "triton-repository")
    if vc:
        log.warning("the TensorRT plan is version-compatible: start Triton with %s", VERSION_COMPATIBLE_FLAG)
    log.info("wrote Triton repository %s (%s%s)", repo, model_name, f", {model_name}_trt" if engine_path else "")
    return repo
