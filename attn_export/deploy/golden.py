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
``np.load(..., allow_pickle=False)`` (polygraphy/json/serde.py), and only its registered classes;
what it decodes is then held to a pydantic schema (``BATCHES``: one batch or more, each a named
numeric array of one row or more, the same outputs in every batch), so a malformed golden is one
line, never a traceback half-way through the check. FIFOs and devices are named, never opened.
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from attn_export.errors import ConfigError, DataError

__all__ = ["BATCHES", "GOLDEN_FILES", "GoldenMeta", "Golden", "current_stack", "load_golden", "read_feeds",
           "record_golden", "run_artifact", "save_outputs"]

GOLDEN_FILES = ("golden.json", "inputs.json", "stack.json")
GOLDEN_SCHEMA = 1
GOLDEN_KIND = "golden"  # the deploy-folder manifest's kind: a bundle's folder is never taken for a golden one
ENGINE_SUFFIXES = (".engine", ".plan", ".trt")


class Thresholds(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    min_cosine: float = Field(0.995, gt=0, le=1)
    min_top1: float = Field(0.95, ge=0, le=1)
    min_recall_at_10: float = Field(0.95, ge=0, le=1)
    min_label_agreement: float = Field(0.99, ge=0, le=1)
    max_rel_error: float = Field(0.1, gt=0)  # |new - old| / |old| per text: outputs scaled x1000 fail


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


def _numeric(value: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"expected a numeric array, got dtype {arr.dtype}")
    if arr.ndim == 0 or not len(arr):
        raise ValueError(f"expected an array of one row or more, got shape {arr.shape}")
    return arr


def _same_names(batches: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    for i, batch in enumerate(batches[1:], 1):
        if batch.keys() != batches[0].keys():
            raise ValueError(f"batch {i} has {sorted(batch)}, batch 0 {sorted(batches[0])}: "
                             "every batch names the same arrays")
    return batches


# The decoded feeds of inputs.json / --inputs and the iterations of golden.json: name -> numeric array, per batch.
BATCHES: TypeAdapter[list[dict[str, np.ndarray]]] = TypeAdapter(
    Annotated[list[Annotated[dict[str, Annotated[Any, AfterValidator(_numeric)]], Field(min_length=1)]],
              Field(min_length=1), AfterValidator(_same_names)])  # fmt: skip


def _first_problem(err: Exception) -> str:
    """One line for what a reader refused: pydantic's first error with where it is, else the exception's first line."""
    if isinstance(err, ValidationError):
        first = err.errors()[0]
        at = "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in first["loc"])
        return ("at " + at + ": " if at else "") + first["msg"].removeprefix("Value error, ")
    return str(err).splitlines()[0] if str(err).strip() else type(err).__name__


def _batches(value: Any, where: str, fix: str) -> list[dict[str, np.ndarray]]:
    """``value`` held to ``BATCHES``, or one DataError naming the first problem and where it is."""
    try:
        return BATCHES.validate_python(value)
    except ValidationError as err:
        raise DataError(f"{where} is malformed ({_first_problem(err)}); {fix}") from None


def _regular(path: Path, what: str, fix: str) -> None:
    """Refuse ``path`` by what it is (missing, a FIFO, a device, a folder) without opening it: a FIFO would block."""
    from attn_export.host.paths import check_regular_file

    if check_regular_file(path, what) is None:
        raise ConfigError(f"{what} {path} does not exist; {fix}")


def _require_polygraphy() -> None:
    """Polygraphy, or one line naming the package, before any work."""
    from attn_export.host.lazy import require

    require("polygraphy", "polygraphy", what="Polygraphy (golden files are its RunResults JSON)")


def _polygraphy_quiet() -> Any:
    """Polygraphy logs every save and load at INFO on stdout; the command prints its own one line."""
    _require_polygraphy()
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


def _check_shapes(session: Any, feed: dict[str, np.ndarray], artifact: Path) -> None:
    """Each input's rank and fixed dimensions against the ONNX model's, before ONNX Runtime says it its own way.

    (A TensorRT engine checks its profiles itself: ``runtime.tensorrt.runner.check_shape_in_profile``.)"""
    for spec in session.get_inputs():
        if spec.name not in feed:
            continue  # the runner names missing and unexpected inputs
        got, want = tuple(np.shape(feed[spec.name])), tuple(d if isinstance(d, int) else (d or "?") for d in spec.shape)
        if len(got) != len(want) or any(isinstance(w, int) and w != g for g, w in zip(got, want)):
            shown = "(" + ", ".join(map(str, want)) + ("," if len(want) == 1 else "") + ")"
            raise DataError(f"input {spec.name!r} has shape {got}, {artifact.name} takes {shown}; "
                            "pass the inputs this model was exported for")


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
            if getattr(runner, "session", None) is not None:
                _check_shapes(runner.session, feed, artifact)
            for name, value in runner.infer(feed).items():
                outputs.setdefault(name, []).append(np.asarray(value))
    return runner.name, outputs


def read_feeds(path: Path) -> list[dict[str, np.ndarray]]:
    """Feeds from Polygraphy's ``--save-inputs`` JSON, or an ``.npz`` (``input/<name>`` as in a Jetson bundle, or plain names)."""
    import zipfile

    fix = "pass the report split's inputs (.npz or Polygraphy inputs JSON)"
    _regular(path, "--inputs", fix)
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:  # never unpickle a user's file
                named = {k.split("/", 1)[1] if k.startswith("input/") else k: z[k]
                         for k in z.files if not k.startswith("output/")}
        except (ValueError, OSError, EOFError, TypeError, zipfile.BadZipFile) as e:  # an object array, random bytes...
            text = str(e).splitlines()[0] if str(e) else ""
            why = ("it holds an object array: a pickle, never loaded" if "Object arrays" in text
                   else "neither a zip of arrays nor an array" if "pickled" in text  # np.load: other bytes, a pickle
                   else f"{type(e).__name__}: {text[:120]}")  # fmt: skip
            raise DataError(f"--inputs {path} is not an .npz of numeric arrays ({why}); {fix}") from None
        if not named:
            raise DataError(f"{path} holds no input arrays; expected input/<name> or <name> entries")
        return _batches([named], f"--inputs {path}", fix)
    _require_polygraphy()
    from polygraphy.exception import PolygraphyException
    from polygraphy.json import load_json

    try:
        with _polygraphy_quiet():
            feeds = load_json(str(path), description="inputs")
    except (PolygraphyException, ValueError, TypeError, KeyError) as e:
        raise DataError(f"--inputs {path} is not a Polygraphy inputs JSON ({_first_problem(e)})") from None
    fix = "pass a list of feeds (input name -> array), as polygraphy run --save-inputs writes"
    return _batches(feeds, f"--inputs {path}", fix)


def save_outputs(path: Path, runner_name: str, outputs: dict[str, list[np.ndarray]]) -> None:
    """``outputs`` (name -> one array per feed) as Polygraphy RunResults JSON: one runner, one iteration per feed."""
    _require_polygraphy()
    from polygraphy.comparator import IterationResult, RunResults

    results = RunResults()
    count = len(next(iter(outputs.values())))
    results.add([IterationResult({k: v[i] for k, v in outputs.items()}, runner_name=runner_name) for i in range(count)], runner_name=runner_name)
    with _polygraphy_quiet():
        results.save(str(path))


def record_golden(golden_dir: Path, artifact: Path, feeds: list[dict[str, np.ndarray]], *, labels: tuple[str, ...] = (),
                  texts: list[str] | None = None, providers: list[str] | None = None, force: bool = False) -> GoldenMeta:  # fmt: skip
    """Run ``artifact`` on ``feeds`` and write the golden folder; a folder holding files we did not write is refused.

    Outputs holding NaN or inf are refused, never recorded: a golden that compares equal to nothing gates nothing."""
    _require_polygraphy()
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
    for name, batches in outputs.items():
        bad = sum(int(np.size(b) - np.isfinite(b).sum()) for b in batches if np.asarray(b).dtype.kind == "f")
        if bad:
            raise DataError(f"output {name!r} of {artifact.name} holds {bad} non-finite values (NaN or inf) on "
                            "--inputs; a golden must be finite: check the inputs (masks, token ids) and the model")
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
    from attn_export.host.paths import check_regular_file

    fix = f"record it with attn-export golden record MODEL --inputs FILE --golden {golden_dir}"
    for name in GOLDEN_FILES:
        if check_regular_file(golden_dir / name, "--golden") is None:  # a FIFO or a device: named, never opened
            raise ConfigError(f"--golden {golden_dir} has no {name}; {fix}")
    _require_polygraphy()
    from polygraphy.comparator import RunResults
    from polygraphy.exception import PolygraphyException
    from polygraphy.json import load_json

    name = "stack.json"
    try:
        meta = GoldenMeta.model_validate_json((golden_dir / name).read_text())
        with _polygraphy_quiet():
            name = "golden.json"
            runs = list(RunResults.load(str(golden_dir / name)).items())
            # Polygraphy decodes whatever classes the JSON names: a runner's pair or an iteration may be anything
            iterations = [{k: it[k] for k in it.keys()} for it in runs[0][1]] if len(runs) == 1 else None
            name = "inputs.json"
            feeds = load_json(str(golden_dir / name), description="inputs")
    except (ValidationError, PolygraphyException, ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
        problem = _first_problem(e)
        raise DataError(f"--golden {golden_dir} is not a valid golden folder ({name}: {problem}); {fix}") from None
    if iterations is None:
        raise DataError(f"{golden_dir / 'golden.json'} holds {len(runs)} runners; a golden holds exactly one; {fix}")
    if not iterations:
        raise DataError(f"{golden_dir / 'golden.json'} holds no output batches; {fix}")
    batches = _batches(iterations, str(golden_dir / "golden.json"), fix)
    inputs = _batches(feeds, str(golden_dir / "inputs.json"), fix)
    if len(batches) != len(inputs):
        raise DataError(f"{golden_dir} has {len(batches)} output batches for {len(inputs)} input batches; {fix}")
    outputs = {name: [b[name] for b in batches] for name in batches[0]}
    return Golden(meta=meta, inputs=inputs, outputs=outputs)
