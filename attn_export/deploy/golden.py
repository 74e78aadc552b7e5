"""Golden outputs per deployment: a verified artifact's outputs on fixed inputs, with the stack that made them.

Why: a TensorRT, CUDA or JetPack upgrade can change an engine's numbers with no error
(NVIDIA/TensorRT#4400, #4813); the gate needs known-good outputs per GPU and release. A golden
folder holds, written together and never half:

* ``golden.json``  Polygraphy ``RunResults`` (one runner, one iteration per batch), written and
  read with Polygraphy's own classes, so ``polygraphy run MODEL --load-outputs golden.json`` works;
* ``inputs.json``  the exact feeds (token ids, masks...) in Polygraphy's ``--load-inputs`` format:
  the check re-runs the artifact on identical inputs, never re-tokenizes;
* ``stack.json``   ``GoldenMeta`` (pydantic, validated when read): the stack that produced the
  outputs (GPU name and compute capability, TensorRT, CUDA, L4T/JetPack; on CPU the CPU's
  instruction-set class and onnxruntime), the artifact's sha256, each output's judge kind, the
  texts when known, and the thresholds.

Loading is safe on a file the user gave: Polygraphy decodes arrays with
``np.load(..., allow_pickle=False)`` (polygraphy/json/serde.py), and only its registered classes.
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from attn_export.errors import ConfigError, DataError

__all__ = ["GOLDEN_FILES", "GoldenMeta", "Golden", "current_stack", "load_golden", "record_golden", "run_artifact", "save_outputs"]

GOLDEN_FILES = ("golden.json", "inputs.json", "stack.json")
GOLDEN_SCHEMA = 1
GOLDEN_KIND = "golden"  # the deploy-folder manifest's kind: a bundle's folder is never taken for a golden one
ENGINE_SUFFIXES = (".engine", ".plan", ".trt")


class Thresholds(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_cosine: float = Field(0.995, gt=0, le=1)
    min_top1: float = Field(0.95, ge=0, le=1)
    min_recall_at_10: float = Field(0.95, ge=0, le=1)
    min_label_agreement: float = Field(0.99, ge=0, le=1)


class GoldenMeta(BaseModel):
    """``stack.json``: what the golden outputs are, and which stack produced them."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = Field(GOLDEN_SCHEMA, alias="schema")
    artifact: str
    artifact_sha256: str
    runner: str
    stack: dict[str, str | None]
    kinds: dict[str, str]
    texts: list[str] | None = None
    thresholds: Thresholds = Field(default_factory=Thresholds)


class Golden(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    meta: GoldenMeta
    inputs: list[dict[str, Any]]
    outputs: dict[str, list[Any]]  # output name -> one array per batch


def _polygraphy_quiet() -> Any:
    """Polygraphy logs every save and load at INFO on stdout; the command prints its own one line."""
    from polygraphy.logger import G_LOGGER

    return G_LOGGER.verbosity(G_LOGGER.WARNING)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace").strip() or None
    except OSError:
        return None


def current_stack(artifact: Path, providers: list[str] | None = None) -> dict[str, str | None]:
    """The stack that runs ``artifact`` here: GPU, TensorRT, CUDA and L4T for an engine; CPU class and onnxruntime for ONNX."""
    from attn_export.host.environment import detect_cpu, package_versions

    cpu = detect_cpu()
    stack: dict[str, str | None] = {"host": platform.node(), "cpu_class": cpu.isa_class, "cpu": cpu.model or cpu.machine}
    # JetPack is the L4T release on the device (/etc/nv_tegra_release, e.g. "R36 (release), REVISION: 4.0" = JetPack 6.1)
    stack["l4t"] = _read_text("/etc/nv_tegra_release")
    if artifact.suffix in ENGINE_SUFFIXES:
        from attn_export.host.lazy import require
        from attn_export.runtime.tensorrt.runner import _check, cudart, gpu_identity

        stack["runtime"] = "tensorrt"
        stack["tensorrt"] = str(require("tensorrt", "tensorrt", what="TensorRT", extra="gpu").__version__)
        stack["gpu"], stack["compute_capability"] = gpu_identity()
        version = int(_check(cudart().cudaRuntimeGetVersion()))
        stack["cuda"] = f"{version // 1000}.{version % 1000 // 10}"
    else:
        stack["runtime"] = "onnxruntime"
        stack["onnxruntime"] = package_versions()["onnxruntime"]
        stack["providers"] = ",".join(providers or ["CPUExecutionProvider"])
    return stack


def run_artifact(artifact: Path, feeds: list[dict[str, np.ndarray]], providers: list[str] | None = None) -> tuple[str, dict[str, list[np.ndarray]]]:
    """Run the ONNX model or TensorRT engine on every feed; (runner name, output name -> one array per feed)."""
    if not artifact.is_file():
        raise ConfigError(f"{artifact} is not a file; pass an ONNX model or a TensorRT engine (.engine/.plan)")
    if artifact.suffix in ENGINE_SUFFIXES:
        from attn_export.runtime.tensorrt.runner import EngineFromPath, TrtRunner

        runner: Any = TrtRunner(EngineFromPath(artifact), name="tensorrt")
    elif artifact.suffix == ".onnx":
        from attn_export.runtime.ort import OrtRunner, SessionFromOnnx

        chosen = providers or ["CPUExecutionProvider"]
        runner = OrtRunner(SessionFromOnnx(artifact, providers=chosen), name=f"onnxruntime[{','.join(chosen)}]")
    else:
        raise ConfigError(f"{artifact} is neither an ONNX model (.onnx) nor a TensorRT engine ({', '.join(ENGINE_SUFFIXES)})")
    outputs: dict[str, list[np.ndarray]] = {}
    with runner:
        for feed in feeds:
            for name, value in runner.infer(feed).items():
                outputs.setdefault(name, []).append(np.asarray(value))
    return runner.name, outputs


def read_feeds(path: Path) -> list[dict[str, np.ndarray]]:
    """Feeds from Polygraphy's ``--save-inputs`` JSON, or an ``.npz`` (``input/<name>`` as in a Jetson bundle, or plain names)."""
    if not path.is_file():
        raise ConfigError(f"--inputs {path} does not exist; pass the report split's inputs (.npz or Polygraphy inputs JSON)")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:  # never unpickle a user's file
            named = {k.split("/", 1)[1] if k.startswith("input/") else k: z[k] for k in z.files if not k.startswith("output/")}
        if not named:
            raise DataError(f"{path} holds no input arrays; expected input/<name> or <name> entries")
        return [named]
    from polygraphy.json import load_json

    from polygraphy.exception import PolygraphyException

    try:
        with _polygraphy_quiet():
            feeds = load_json(str(path), description="inputs")
    except (PolygraphyException, ValueError, TypeError, KeyError) as e:
        raise DataError(f"--inputs {path} is not a Polygraphy inputs JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not isinstance(feeds, list) or not all(isinstance(f, dict) for f in feeds):
        raise DataError(f"{path} is not a list of feeds (input name -> array), as polygraphy run --save-inputs writes")
    return [{str(k): np.asarray(v) for k, v in f.items()} for f in feeds]


def save_outputs(path: Path, runner_name: str, outputs: dict[str, list[np.ndarray]]) -> None:
    """``outputs`` (name -> one array per feed) as Polygraphy RunResults JSON: one runner, one iteration per feed."""
    from polygraphy.comparator import IterationResult, RunResults

    results = RunResults()
    count = len(next(iter(outputs.values())))
    results.add([IterationResult({k: v[i] for k, v in outputs.items()}, runner_name=runner_name) for i in range(count)], runner_name=runner_name)
    with _polygraphy_quiet():
        results.save(str(path))


def record_golden(golden_dir: Path, artifact: Path, feeds: list[dict[str, np.ndarray]], *, labels: tuple[str, ...] = (),
                  texts: list[str] | None = None, providers: list[str] | None = None, force: bool = False) -> GoldenMeta:  # fmt: skip
    """Run ``artifact`` on ``feeds`` and write the golden folder; a folder holding files we did not write is refused."""
    from polygraphy.json import save_json

    from attn_export.deploy.folder import MANIFEST_NAME, move_aside, publish, refuse_foreign, staging
    from attn_export.deploy.golden_judge import kind_for

    if os.path.islink(golden_dir) or (golden_dir.exists() and not golden_dir.is_dir()):
        raise ConfigError(f"--golden {golden_dir} is not a folder; pass a new or an earlier golden folder")
    manifest = golden_dir / MANIFEST_NAME
    if manifest.is_file() and f'"kind": "{GOLDEN_KIND}"' not in manifest.read_text(errors="replace"):
        raise ConfigError(f"--golden {golden_dir} is another attn-export folder (a bundle or a model repository), not a golden one; pass a new folder")
    if golden_dir.exists():
        move_aside(golden_dir, "--golden") if force else refuse_foreign(golden_dir, "--golden")
    runner_name, outputs = run_artifact(artifact, feeds, providers)
    unknown = sorted(set(labels) - set(outputs))
    if unknown:
        raise ConfigError(f"--labels {unknown} are not outputs of {artifact.name}; its outputs are {sorted(outputs)}")
    n = sum(len(next(iter(f.values()))) for f in feeds)
    if texts is not None and len(texts) != n:
        raise DataError(f"{len(texts)} texts given for {n} input rows; pass the texts the inputs were tokenized from, in order")
    meta = GoldenMeta(artifact=artifact.name, artifact_sha256=_sha256(artifact), runner=runner_name, stack=current_stack(artifact, providers),
                      kinds={k: kind_for(v[0].shape, k in labels) for k, v in outputs.items()}, texts=texts)  # fmt: skip
    with staging(golden_dir) as tmp, _polygraphy_quiet():
        save_outputs(tmp / "golden.json", runner_name, outputs)
        save_json(feeds, str(tmp / "inputs.json"), description="inputs")
        (tmp / "stack.json").write_text(meta.model_dump_json(by_alias=True, indent=2) + "\n")
        publish(tmp, golden_dir, "--golden", GOLDEN_KIND)
    return meta


def load_golden(golden_dir: Path) -> Golden:
    """Read and validate a golden folder; a missing or malformed file is one line naming it."""
    from polygraphy.comparator import RunResults
    from polygraphy.exception import PolygraphyException
    from polygraphy.json import load_json
    from pydantic import ValidationError

    fix = f"record it with attn-export golden record MODEL --inputs FILE --golden {golden_dir}"
    for name in GOLDEN_FILES:
        if not (golden_dir / name).is_file():
            raise ConfigError(f"--golden {golden_dir} has no {name}; {fix}")
    try:
        meta = GoldenMeta.model_validate_json((golden_dir / "stack.json").read_text())
        with _polygraphy_quiet():
            results = RunResults.load(str(golden_dir / "golden.json"))
            feeds = load_json(str(golden_dir / "inputs.json"), description="inputs")
    except (ValidationError, PolygraphyException, ValueError, TypeError, KeyError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"--golden {golden_dir} is not a valid golden folder ({first}); {fix}") from None
    if len(results) != 1:
        raise DataError(f"{golden_dir / 'golden.json'} holds {len(results)} runners; a golden holds exactly one")
    _, iterations = results[0]
    if len(iterations) != len(feeds):
        raise DataError(f"{golden_dir} has {len(iterations)} output batches for {len(feeds)} input batches; record it again")
    outputs = {name: [np.asarray(it[name]) for it in iterations] for name in iterations[0].keys()}
    return Golden(meta=meta, inputs=[{k: np.asarray(v) for k, v in f.items()} for f in feeds], outputs=outputs)
