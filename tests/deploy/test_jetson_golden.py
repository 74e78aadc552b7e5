"""The Jetson bundle carries golden outputs and judges the engine against them on the device.

Run here as the device runs them: the bundle's own golden_on_device.py with the ONNX Runtime
stand-in, from /, with attn_export blocked (and polygraphy too, where JetPack lacks it), and the
TensorRT path against the strict doubles.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_golden import _model, _rotate_to_cosine

from attn_export.deploy.golden import GoldenMeta
from attn_export.deploy.jetson_bundle import write_jetson_bundle
from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile
from attn_export.validate.tolerances import Tolerance

N_ROWS = 40
SPEC = EngineSpec(precision="fp16", profiles=ShapeProfile((1, 8), (N_ROWS, 8), (64, 8)))
SHIPPED = ("golden_on_device.py", "output_agreement.py")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle of a tiny embedding model (40 texts x 16): golden.json is recorded while it is written."""
    import onnxruntime as ort

    root = tmp_path_factory.mktemp("jg")
    model = _model(root / "m.onnx")
    x = np.random.default_rng(1).standard_normal((N_ROWS, 8)).astype(np.float32)
    y = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return write_jetson_bundle(model, root / "bundle", SPEC, {"x": x}, {"emb": y}, Tolerance(cosine_min=0.999))


def _blocked(tmp_path: Path, *names: str) -> str:
    """A folder whose packages shadow ``names`` with an ImportError: what the device has not got."""
    blocker = tmp_path / "blocked"
    for name in names:
        (blocker / name).mkdir(parents=True, exist_ok=True)
        (blocker / name / "__init__.py").write_text(f"raise ImportError('{name} is not on the device')\n")
    return str(blocker)


def _golden(bundle: Path, tmp_path: Path, *args: str, block: tuple[str, ...] = ("attn_export",)) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(bundle / "golden_on_device.py"), "--backend", "onnxruntime", *args]
    env = {**os.environ, "PYTHONPATH": _blocked(tmp_path, *block)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/", env=env)


def test_the_bundle_carries_the_golden_of_the_checked_model(bundle) -> None:  # type: ignore[no-untyped-def]
    from polygraphy.comparator import RunResults

    results = RunResults.load(str(bundle / "golden.json"))
    (runner, iterations), = list(results.items())
    want = np.load(bundle / "reference.npz", allow_pickle=False)["output/emb"]
    assert runner == "onnxruntime[CPUExecutionProvider]" and len(iterations) == 1
    np.testing.assert_allclose(np.asarray(iterations[0]["emb"]), want, rtol=1e-5, atol=1e-5)
    meta = GoldenMeta.model_validate_json((bundle / "golden_stack.json").read_text())
    assert meta.kinds == {"emb": "embedding"} and meta.stack["runtime"] == "onnxruntime" and meta.artifact == "model.onnx"
    for name in SHIPPED:
        assert os.access(bundle / name, os.R_OK)
    assert "golden_on_device.py" in (bundle / "README.md").read_text()


def test_the_shipped_modules_import_nothing_from_attn_export(bundle) -> None:  # type: ignore[no-untyped-def]
    allowed = {"__future__", "argparse", "base64", "hashlib", "io", "json", "os", "platform", "shutil", "stat", "sys", "numpy",
               "output_agreement", "validate_on_device", "polygraphy", "onnxruntime"}  # fmt: skip
    for name in SHIPPED:
        tree = ast.parse((bundle / name).read_text())
        roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert roots <= allowed, (name, roots - allowed)


def test_the_stand_in_passes_against_the_bundles_golden_without_attn_export_or_polygraphy(bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = _golden(bundle, tmp_path, "--allow-stand-in", block=("attn_export", "polygraphy"))
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("backend: onnxruntime (stand-in)")
    assert lines[2].startswith("old stack: onnxruntime=") and lines[3].startswith("new stack: onnxruntime=")
    assert "golden emb (embedding): PASS mean_cosine=1 " in run.stdout and "recall_at_10=1" in run.stdout and lines[-1] == "PASS"
    assert _golden(bundle, tmp_path).returncode == 3  # only the stand-in ran: never a plain pass


@pytest.mark.parametrize("block", [("attn_export",), ("attn_export", "polygraphy")], ids=["polygraphy", "hand-decoder"])
def test_five_percent_of_rows_at_cosine_098_fail_with_exit_1_and_are_named(bundle, tmp_path, block) -> None:  # type: ignore[no-untyped-def]
    from polygraphy.comparator import IterationResult, RunResults

    device = tmp_path / "golden"
    device.mkdir()
    rows = np.asarray(RunResults.load(str(bundle / "golden.json"))[0][1][0]["emb"])
    picked = np.array([3, 17])  # 5% of 40
    results = RunResults()
    results.add([IterationResult({"emb": _rotate_to_cosine(rows, picked, 0.98)}, runner_name="old")], runner_name="old")
    results.save(str(device / "golden.json"))
    (device / "stack.json").write_text((bundle / "golden_stack.json").read_text())
    run = _golden(bundle, tmp_path, "--allow-stand-in", "--golden", str(device), block=block)
    assert run.returncode == 1, run.stdout + run.stderr
    fail = [line for line in run.stdout.splitlines() if line.startswith("FAIL: output 'emb' moved: 2 of 40 texts below cosine 0.995")]
    assert len(fail) == 1 and "row 3 cosine 0.9800" in fail[0] and "row 17 cosine 0.9800" in fail[0], run.stdout
    assert fail[0].count("row ") == 2 and run.stdout.splitlines()[-1] == "FAIL"


def test_record_golden_then_gate_against_the_devices_own(bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from polygraphy.comparator import RunResults

    device = tmp_path / "device-golden"
    run = _golden(bundle, tmp_path, "--allow-stand-in", "--record-golden", str(device), block=("attn_export", "polygraphy"))
    assert run.returncode == 0 and "emb: PASS" in run.stdout and f"recorded golden {device} on: onnxruntime=" in run.stdout, run.stdout + run.stderr
    assert sorted(p.name for p in device.iterdir()) == ["golden.json", "stack.json"]
    assert list(RunResults.load(str(device / "golden.json")).keys()) == ["onnxruntime (stand-in)"]  # the hand encoder writes Polygraphy's JSON
    stack = json.loads((device / "stack.json").read_text())
    assert stack["kinds"] == {"emb": "embedding"} and stack["stack"]["runtime"] == "onnxruntime" and stack["artifact"] == "model.onnx"
    run = _golden(bundle, tmp_path, "--allow-stand-in", "--golden", str(device))
    assert run.returncode == 0 and f"golden: {device / 'golden.json'} (recorded by onnxruntime (stand-in))" in run.stdout, run.stdout + run.stderr
    (device / "notes.txt").write_text("mine")
    run = _golden(bundle, tmp_path, "--allow-stand-in", "--record-golden", str(device))
    assert run.returncode == 2 and "holds other files" in run.stderr and (device / "notes.txt").exists()
    run = _golden(bundle, tmp_path, "--allow-stand-in", "--golden", str(tmp_path / "nowhere"))
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1 and "--record-golden DIR" in run.stderr


def test_the_stand_in_is_not_recorded_as_the_devices_golden(bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = _golden(bundle, tmp_path, "--record-golden", str(tmp_path / "g"))
    assert run.returncode == 3 and "not recorded: only the stand-in ran" in run.stdout and not (tmp_path / "g").exists()


def test_the_device_stack_names_gpu_tensorrt_cuda_and_jetpack(bundle, tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """Up to the hardware boundary: the engine run by the strict doubles, recorded, then gated after a CUDA upgrade."""
    from test_jetson_bundle import _double_onnx
    from trt_fakes import World, install, manifest_versions

    from attn_export.runtime.tensorrt.build import build_engine

    version = manifest_versions()[0]
    world = World(devices=[("Orin", 8, 7)])
    install(monkeypatch, version, world)
    onnx_path = _double_onnx(tmp_path / "model.onnx")
    engine = tmp_path / "model.engine"
    build_engine(onnx_path, engine, EngineSpec(precision="fp16", profiles=ShapeProfile((1, 8), (2, 8), (4, 16))))
    x = np.random.default_rng(0).standard_normal((2, 8, 4)).astype(np.float32)
    np.savez(tmp_path / "reference.npz", **{"input/x": x, "output/y": 2 * x})
    meta = {"schema": 2, "inputs": ["x"], "outputs": ["y"], "input_dims": {"x": ["B", "S", 4]}, "output_dims": {"y": ["B", "S", 4]},
            "tolerances": {"y": {"max_abs": 1e-6}}, "precision": "fp16"}  # fmt: skip
    (tmp_path / "bundle.json").write_text(json.dumps(meta))
    monkeypatch.syspath_prepend(str(bundle))  # validate_on_device.py and output_agreement.py, as shipped
    for name in ("validate_on_device", "output_agreement"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    spec = importlib.util.spec_from_file_location("golden_on_device", bundle / "golden_on_device.py")
    god = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(god)  # type: ignore[union-attr]
    monkeypatch.setattr(god, "_read_text", lambda path: "R36 (release), REVISION: 4.0" if path == "/etc/nv_tegra_release" else None)
    common = ["--engine", str(engine), "--onnx", onnx_path, "--reference", str(tmp_path / "reference.npz"), "--bundle-json", str(tmp_path / "bundle.json"),
              "--backend", "tensorrt"]  # fmt: skip
    assert god.main([*common, "--record-golden", str(tmp_path / "g")]) == 0, capsys.readouterr()
    stack = json.loads((tmp_path / "g" / "stack.json").read_text())["stack"]
    assert {k: stack[k] for k in ("runtime", "gpu", "compute_capability", "tensorrt", "cuda", "l4t")} == {
        "runtime": "tensorrt", "gpu": "Orin", "compute_capability": "8.7", "tensorrt": version, "cuda": "12.6", "l4t": "R36 (release), REVISION: 4.0"}
    capsys.readouterr()
    world.cuda_runtime = 13000  # the upgrade: same engine, new CUDA
    assert god.main([*common, "--golden", str(tmp_path / "g")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("old stack: gpu=Orin compute_capability=8.7") and " cuda=12.6 " in out[2] and " cuda=13.0 " in out[3]
    assert "l4t=R36 (release), REVISION: 4.0" in out[3] and out[-1] == "PASS"
