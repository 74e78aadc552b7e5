"""A self-contained folder to build and validate the engine on a Jetson (the JetPack that ships the chosen TensorRT: targets/trt_releases.py).

Engines must be built on the device that runs them, so the bundle carries the ONNX and
everything needed there, and nothing that needs attn-export or torch:

* ``model.onnx``             the checked model (decomposed attention, opset <= 20);
* ``build_engine.sh``        the trtexec line for TensorRT 10.x (``--fp16``/``--int8``, shapes,
                             ``--memPoolSize``, ``--timingCacheFile``, optional DLA + GPU fallback);
* ``validate_on_device.py``  runs the engine on ``reference.npz`` and prints the report's
                             accuracy and latency figures (ONNX Runtime stand-in without TensorRT),
                             then attests the engine's layer list with ``engine_attest.py``
                             (``runtime/tensorrt/attest.py``, standard library only);
* ``reference.npz``          inputs and eager-PyTorch outputs (``input/<name>``, ``output/<name>``)
                             of every model input and output;
* ``golden.json``            the checked ONNX model's outputs on the reference inputs (Polygraphy RunResults,
                             ``deploy.golden.save_outputs``), with ``golden_stack.json`` naming the host;
                             ``golden_on_device.py`` judges the engine against them with ``output_agreement.py``
                             (``checkpoint/output_agreement.py``) and records the device's own (``--record-golden``);
* ``bundle.json``            (schema 2) the model's inputs/outputs and their dims, a tolerance per
                             output, the profile and the build command; and ``README.md``.

The static TensorRT check runs first and errors abort. The files are written into a staging
folder inside the bundle folder and renamed into place (``deploy.folder.publish``); only an
earlier bundle's own files are replaced, and a folder holding anything else is refused.
``bundle.json`` carries the ONNX's sha256, so the device check refuses a mixed bundle.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from attn_export.checkpoint import output_agreement
from attn_export.checks.trt_attention import find_attention_blocks
from attn_export.checks.trt_compat import check_trt_compat, report_dict
from attn_export.deploy.folder import publish, staging
from attn_export.errors import DataError
from attn_export.outdir.manifest import sha256_file
from attn_export.runtime.tensorrt import attest
from attn_export.runtime.tensorrt.attest import PlannedGemm
from attn_export.runtime.tensorrt.build import Preflight, engine_expectation
from attn_export.runtime.tensorrt.build_plan import plan_build
from attn_export.runtime.tensorrt.spec import EngineSpec
from attn_export.runtime.tensorrt.trtexec import onnx_io_dims, shell_line, trtexec_command
from attn_export.targets.trt_releases import release
from attn_export.vocab.precisions import PRECISIONS

__all__ = ["write_jetson_bundle", "BUNDLE_FILES"]

log = logging.getLogger(__name__)

BUNDLE_FILES = ("model.onnx", "build_engine.sh", "validate_on_device.py", "engine_attest.py", "reference.npz", "bundle.json", "README.md",
                "golden_on_device.py", "output_agreement.py", "golden.json", "golden_stack.json")  # fmt: skip
_SCRIPT = Path(__file__).with_name("on_device_validator.py")
_ATTEST = Path(attest.__file__)  # imported by the validator on the device
_GOLDEN_SCRIPT = Path(__file__).with_name("golden_on_device.py")
_AGREEMENT = Path(output_agreement.__file__)  # imported by golden_on_device.py on the device: the host's judge, one implementation


def _tolerance_dict(name: str, tolerance: Any) -> dict[str, float]:
    """One output's bound as bundle.json stores it; an empty one would pass anything, so it is refused."""
    if hasattr(tolerance, "to_dict"):
        tol = dict(tolerance.to_dict())
    elif isinstance(tolerance, Mapping):
        tol = {str(k): float(v) for k, v in tolerance.items() if v is not None}
    else:
        raise DataError(f"expected a Tolerance or a dict of max_abs/rel_l2/cosine_min for output {name!r}, got {type(tolerance).__name__}")
    if not tol or not set(tol) <= {"max_abs", "rel_l2", "cosine_min"} or not all(np.isfinite(v) for v in tol.values()):
        raise DataError(f"the tolerance of output {name!r} must bound max_abs, rel_l2 or cosine_min with finite numbers, got {tol}; "
                        "a device check without a bound passes anything")
    return tol


def _tolerances(tolerances: Any, outputs: list[str]) -> dict[str, dict[str, float]]:
    """Per output: a Tolerance for all of them, or a mapping output -> Tolerance that names every output."""
    if hasattr(tolerances, "to_dict"):
        return {o: _tolerance_dict(o, tolerances) for o in outputs}
    if not isinstance(tolerances, Mapping) or set(tolerances) != set(outputs):
        got = sorted(tolerances) if isinstance(tolerances, Mapping) else type(tolerances).__name__
        raise DataError(f"expected a tolerance for each model output {outputs}, got {got}; the device compares every output")
    return {o: _tolerance_dict(o, tolerances[o]) for o in outputs}


def _dims_of(values: Any) -> dict[str, list[int | str | None]]:
    return {vi.name: [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi.type.tensor_type.shape.dim] for vi in values}


def _check_reference(inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], dims: Mapping[str, list[Any]],
                     out_dims: Mapping[str, list[Any]]) -> None:  # fmt: skip
    """The reference covers every model input and output, with the model's shapes and finite values."""
    missing = [n for n in dims if n not in inputs]
    if missing or not outputs:
        raise DataError(f"reference inputs must cover the model's inputs {list(dims)} (missing {missing}) and outputs must not be empty")
    if set(outputs) != set(out_dims):
        raise DataError(f"reference outputs {sorted(outputs)} must be the model's outputs {list(out_dims)}: the device compares every output")
    for kind, arrays, want in (("input", inputs, dims), ("output", outputs, out_dims)):
        for n, d in want.items():
            arr = np.asarray(arrays[n])
            if arr.size == 0 or arr.ndim != len(d) or any(isinstance(x, int) and x > 0 and x != s for x, s in zip(d, arr.shape)):
                raise DataError(f"reference {kind} {n!r} has shape {arr.shape}, the model wants {d}")
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise DataError(f"reference {kind} {n!r} holds NaN/Inf values; the device check needs finite references")


def _precision_note(spec: EngineSpec, cmd: list[str], blocks: int) -> str:
    if "--stronglyTyped" in cmd:
        return f"{spec.precision}: the precision lives in the graph (strongly typed build); TensorRT runs each tensor in its ONNX type."
    flags = PRECISIONS[spec.precision].trt_weak_flags  # what trtexec is asked for: --fp16, --int8 --fp16, --fp8 --fp16
    if not flags:
        return f"{spec.precision}: no reduced precision; TensorRT's fused MHA kernels are fp16/int8, so attention runs unfused."
    return (
        f"{spec.precision}: the graph is fp32 and the precision is chosen at build time ({' '.join(f'`--{f.lower()}`' for f in flags)}). On TensorRT 10.3 "
        f"this lets TensorRT choose fp16 for the whole MatMul -> Softmax -> MatMul chain of the {blocks} attention block(s) "
        "and fuse it into its MHA kernel; fp32 islands written into a fp16 graph would pin the softmax in fp32 and stop that fusion."
    )


def _readme(trt_version: str, spec: EngineSpec, cmd: list[str], attention_blocks: int) -> str:
    dla = f"\nThe engine puts supported layers on DLA core {spec.dla_core}; attention falls back to the GPU.\n" if spec.dla_core is not None else ""
    if spec.version_compatible:
        dla += (
            "\nThe engine is version-compatible (`--versionCompatible`): it embeds TensorRT's lean runtime, so whatever "
            "loads it must allow host code (`validate_on_device.py` does, from bundle.json; TensorRT's Python API: "
            "`runtime.engine_host_code_allowed = True`; Triton: `--backend-config=tensorrt,version-compatible=true`).\n"
        )
    return f"""# Engine bundle for Jetson (TensorRT {trt_version})

Build and check the TensorRT engine on the device itself: engines only run on the GPU and
TensorRT version that built them.

## Needs
{release(trt_version).jetpack or "JetPack"} (TensorRT {trt_version}, with `trtexec` in `/usr/src/tensorrt/bin`), python3,
numpy, and cuda-python (`pip install cuda-python`). No torch, no attn-export.

## Steps
    ./build_engine.sh                # writes model.engine (+ model.engine.layers.json, timing.cache)
    python3 validate_on_device.py    # accuracy vs reference.npz, latency p50/p90/p99, what the engine runs

`TRTEXEC=/path/to/trtexec ./build_engine.sh` picks another trtexec. `validate_on_device.py`
checks bundle.json and reference.npz against the model first, compares every output with its
own tolerance from bundle.json, names the backend it used on its first line and exits 0 when
every output is within tolerance, 1 when one is not, 2 on a setup or bundle error (one line),
and 3 when TensorRT is missing and only the ONNX Runtime stand-in ran (the engine was not
checked; `--allow-stand-in` turns that into 0/1); `--json stage.json` also writes the result
in attn-export's report.json stage format.

It also reads `model.engine.layers.json` (the engine's layers, written by `build_engine.sh` with
`--profilingVerbosity=detailed`) and attests it against bundle.json's `expectation`: every GEMM
must run the precision the plan placed it in (not wider: FP32 where int8 or fp16 was planned
fails) and, where the kernel table says so, attention must be one fused kernel per layer. A
violation is a `FAIL:` line naming the layer and exit 1; `--accept-engine-mismatch` records it.

## Golden outputs
    python3 golden_on_device.py                      # the engine vs golden.json, old stack vs new stack
    python3 golden_on_device.py --record-golden g/   # once verified: this device's own outputs and stack
    python3 golden_on_device.py --golden g/          # after a JetPack/TensorRT upgrade: gated against them

`golden.json` (Polygraphy RunResults) holds the checked ONNX model's outputs on `reference.npz`'s
inputs, recorded when the bundle was written on the host that `golden_stack.json` names.
`golden_on_device.py` judges the engine's outputs against a golden with the subject's metrics
(`output_agreement.py`: every text's cosine, top-1 and recall@10 neighbour agreement for
embeddings, label agreement for logits): a text below cosine 0.995 is named on a `FAIL:` line,
exit 1. `--record-golden DIR` writes the engine's outputs, once they pass the reference check,
with this device's GPU, compute capability, TensorRT, CUDA and L4T (`/etc/nv_tegra_release`);
`--golden DIR` gates the next upgrade against them. Polygraphy is used when importable, not needed.

## Precision
{_precision_note(spec, cmd, attention_blocks)}
{dla}
## Build command
    {shell_line(cmd)}
"""


def _write_golden(tmp: Path, feed: dict[str, np.ndarray]) -> None:
    """golden.json: the checked ONNX model's outputs on the reference inputs, run here (golden_stack.json names this host).

    The device judges its engine against these with the subject's metrics (golden_on_device.py), the way
    ``attn-export golden check`` does: a text that moves shows even when the eager tolerance still passes."""
    from attn_export.deploy.golden import GoldenMeta, current_stack, run_artifact, save_outputs
    from attn_export.deploy.golden_judge import kind_for

    model = tmp / "model.onnx"
    runner_name, outputs = run_artifact(model, [feed])
    save_outputs(tmp / "golden.json", runner_name, outputs)
    meta = GoldenMeta(artifact=model.name, artifact_sha256=sha256_file(model), runner=runner_name, stack=current_stack(model),
                      kinds={k: kind_for(v[0].shape) for k, v in outputs.items()})  # fmt: skip
    (tmp / "golden_stack.json").write_text(meta.model_dump_json(by_alias=True, indent=2) + "\n")


def write_jetson_bundle(
    onnx_path: str | os.PathLike[str],
    bundle_dir: str | os.PathLike[str],
    spec: EngineSpec,
    reference_inputs: Mapping[str, np.ndarray],
    reference_outputs: Mapping[str, np.ndarray],
    tolerances: Any,
    trt_version: str = "10.3",
    flag: str = "--bundle",
    gemms: tuple[PlannedGemm, ...] = (),
) -> Path:
    """Write the bundle for ``onnx_path`` into ``bundle_dir`` (replacing an older bundle of ours).

    ``bundle_dir`` holds only what attn-export wrote: a file in it that no earlier bundle of ours
    wrote is refused (``ConfigError`` naming it and ``flag``), never deleted (``deploy.folder``).

    ``tolerances``: one ``Tolerance`` for every output, or output name -> ``Tolerance`` (or its
    dict) naming each of the model's outputs; ``validate_on_device.py`` holds each output to its own.
    ``gemms``: the plan's GEMMs (``pipeline.deploy.planned_gemms``), which the device attests the engine against.
    """
    report = check_trt_compat(onnx_path, trt_version, spec.profiles, spec.precision, gpu_arch=spec.gpu_arch)
    report.raise_if_failed()
    dims, graph_float, has_qdq = onnx_io_dims(onnx_path)
    import onnx
    import onnx_ir as ir

    proto = onnx.shape_inference.infer_shapes(onnx.load(os.fspath(onnx_path)))
    out_dims = _dims_of(proto.graph.output)
    _check_reference(reference_inputs, reference_outputs, dims, out_dims)
    tols = _tolerances(tolerances, list(out_dims))
    bundle_spec = dataclasses.replace(spec, timing_cache="timing.cache")
    cmd = trtexec_command("model.onnx", "model.engine", bundle_spec, trt_version, inputs=dims, graph_float=graph_float, has_qdq=has_qdq)
    blocks = len(find_attention_blocks(ir.serde.deserialize_model(proto)))
    pre = Preflight(report, plan_build(bundle_spec, trt_version, graph_float, has_qdq), blocks, sha256_file(onnx_path), graph_float)  # trtexec's build
    expectation = engine_expectation(pre, spec, gemms)
    final = Path(bundle_dir)
    with staging(final) as tmp:  # written beside, then swapped in file by file: only our own earlier files are replaced
        shutil.copyfile(onnx_path, tmp / "model.onnx")
        script = 'set -euo pipefail\ncd "$(dirname "$0")"\nTRTEXEC="${TRTEXEC:-/usr/src/tensorrt/bin/trtexec}"\n'
        (tmp / "build_engine.sh").write_text("#!/usr/bin/env bash\n" + script + '"$TRTEXEC" ' + shell_line(cmd[1:]) + "\n")
        shutil.copyfile(_SCRIPT, tmp / "validate_on_device.py")
        shutil.copyfile(_ATTEST, tmp / "engine_attest.py")
        shutil.copyfile(_GOLDEN_SCRIPT, tmp / "golden_on_device.py")
        shutil.copyfile(_AGREEMENT, tmp / "output_agreement.py")
        for name in ("build_engine.sh", "validate_on_device.py", "golden_on_device.py"):
            (tmp / name).chmod(0o755 | stat.S_IRUSR)
        arrays = {f"input/{k}": np.asarray(reference_inputs[k]) for k in dims}  # the model's inputs only
        arrays |= {f"output/{k}": np.asarray(reference_outputs[k]) for k in out_dims}
        np.savez(tmp / "reference.npz", **arrays)
        meta = {
            "schema": 2, "trt_version": trt_version, "precision": spec.precision, "tolerances": tols,
            "profile": spec.profiles.to_dict() if spec.profiles else None, "inputs": list(dims), "outputs": list(out_dims),
            "input_dims": dims, "output_dims": out_dims,
            "onnx_sha256": sha256_file(tmp / "model.onnx"), "attention_blocks": blocks, "trtexec": cmd, "check": report_dict(report),
            "version_compatible": spec.version_compatible, "dla_core": spec.dla_core, "expectation": expectation.to_dict(),
        }
        (tmp / "bundle.json").write_text(json.dumps(meta, indent=2) + "\n")
        _write_golden(tmp, {k: np.asarray(reference_inputs[k]) for k in dims})
        (tmp / "README.md").write_text(_readme(trt_version, spec, cmd, blocks))
        written = sorted(p.name for p in tmp.iterdir())
        if written != sorted(BUNDLE_FILES):  # what the device-side README and validator expect, nothing more
            raise DataError(f"the bundle would hold {written}, expected {sorted(BUNDLE_FILES)}; this is a bug in attn-export")
        publish(tmp, final, flag, "jetson-bundle")
    log.info("wrote Jetson bundle %s (TensorRT %s, %s): %s", final, trt_version, spec.precision, shell_line(cmd))
    return final
