"""Jetson bundle: files, build script, and validate_on_device.py run here with the ONNX Runtime
stand-in: same reference .npz, same report figures, exit 0 in tolerance, 1 for a perturbed model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from fixtures import eager, feed_for, small_layer
from onnx import numpy_helper

from attn_export.deploy.jetson_bundle import BUNDLE_FILES, write_jetson_bundle
from attn_export.errors import CompatibilityError, DataError
from attn_export.export import export_onnx
from attn_export.runtime.tensorrt import attest
from attn_export.targets.targets import export_spec_for
from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile
from attn_export.validate import accuracy, tolerance_for
from attn_export.validate.tolerances import Tolerance

SPEC = EngineSpec(precision="fp16", profiles=ShapeProfile((1, 8), (2, 16), (4, 32)), workspace_bytes=1 << 30)
HAS_TRT = importlib.util.find_spec("tensorrt") is not None


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    layer = small_layer("transformer", "padding", d_model=32, heads=2)
    path = tmp_path_factory.mktemp("jetson") / "model.onnx"
    export_onnx(layer, path, export_spec_for("jetson", "fp16"))
    feed = feed_for(layer, 2, 16, seed=3, d_model=32)
    return path, feed, {"y": eager(layer, feed)}


@pytest.fixture(scope="module")
def bundle(model, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path, feed, ref = model
    return write_jetson_bundle(path, tmp_path_factory.mktemp("out") / "bundle", SPEC, feed, ref, tolerance_for("fp32"))


def _validate(bundle_dir, *args: str) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    cmd = [sys.executable, str(bundle_dir / "validate_on_device.py"), "--backend", "onnxruntime", "--warmup", "1", "--repeats", "5", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/", env={**os.environ, "PYTHONPATH": ""})


def test_bundle_files(bundle) -> None:  # type: ignore[no-untyped-def]
    assert sorted(p.name for p in bundle.iterdir() if not p.name.startswith(".attn-export")) == sorted(BUNDLE_FILES)  # and its manifest
    script = (bundle / "build_engine.sh").read_text()
    assert os.access(bundle / "build_engine.sh", os.X_OK) and os.access(bundle / "validate_on_device.py", os.X_OK)
    for flag in ("--onnx=model.onnx", "--saveEngine=model.engine", "--fp16", "--memPoolSize=workspace:1024M",
                 "--timingCacheFile=timing.cache", "--minShapes=x:1x8x32,key_padding_mask:1x8", "--maxShapes=x:4x32x32,key_padding_mask:4x32"):
        assert flag in script
    assert subprocess.run(["bash", "-n", str(bundle / "build_engine.sh")]).returncode == 0
    meta = json.loads((bundle / "bundle.json").read_text())
    assert meta["trt_version"] == "10.3" and meta["check"]["passed"] and meta["attention_blocks"] == 1
    assert meta["schema"] == 2 and meta["outputs"] == ["y"] and meta["tolerances"] == {"y": tolerance_for("fp32").to_dict()}
    assert meta["input_dims"]["x"][2] == 32 and len(meta["output_dims"]["y"]) == 3
    ref = np.load(bundle / "reference.npz", allow_pickle=False)
    assert sorted(ref.files) == ["input/key_padding_mask", "input/x", "output/y"]


def test_validate_on_device_stand_in_passes(bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    stage_path = tmp_path / "stage.json"
    run = _validate(bundle, "--json", str(stage_path), "--allow-stand-in")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[0].startswith("backend: onnxruntime (stand-in)")
    assert "y: PASS max_abs=" in run.stdout and "sqnr=" in run.stdout
    assert "latency_ms (onnxruntime (stand-in)): p50=" in run.stdout and " p99=" in run.stdout
    stage = json.loads(stage_path.read_text())
    assert set(stage["accuracy"]) == {"max_abs", "mean_abs", "rel_l2", "cosine", "sqnr_db"} and stage["passed"] is True
    assert set(stage["latency_ms"]["artifact"]) >= {"p50", "p90", "p99"}


INSPECTOR = Path(__file__).resolve().parents[1] / "fixtures" / "trt" / "inspector"


def test_bundle_json_carries_what_the_device_attests(model, bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from attn_export.pipeline.deploy import planned_gemms

    expectation = json.loads((bundle / "bundle.json").read_text())["expectation"]
    # a fp16 build of the fp32 graph (10.3, --fp16) without a plan table: every GEMM is held to fp16; the static check expects fusion
    assert expectation == {"precision": "fp16", "gemms": [], "attention_blocks": 1, "fused_attention": True}
    assert (bundle / "engine_attest.py").read_bytes() == Path(attest.__file__).read_bytes()
    path, feed, ref = model
    gemms = planned_gemms(path, "fp16")  # the run's engine step passes the plan's GEMMs: "float" becomes this build's fp16
    assert len(gemms) == 4 and {g.precision for g in gemms} == {"float"}
    planned = write_jetson_bundle(path, tmp_path / "b", SPEC, feed, ref, tolerance_for("fp32"), gemms=gemms)
    rows = json.loads((planned / "bundle.json").read_text())["expectation"]["gemms"]
    assert [(r["group"], r["precision"]) for r in rows] == [(g.group, "fp16") for g in gemms]


@pytest.mark.parametrize(("fixture", "args", "code", "says"), [
    ("all_int8.json", (), 0, "attestation: engine int8: attested; 8/8 GEMM groups as planned"),
    ("one_gemm_fp32.json", (), 1, "FAIL: GEMM group layers.1.ffn2: int8 requested, engine layer '/layers_1/ffn_out/MatMul_myl0_15' runs fp32"),
    ("attention_unfused.json", (), 1, "FAIL: attention not fused: 0 fused attention kernel(s) for 2 attention block(s)"),
    ("one_gemm_fp32.json", ("--accept-engine-mismatch",), 0, "accepted (--accept-engine-mismatch): GEMM group layers.1.ffn2"),
])  # fmt: skip
def test_the_device_attests_the_engine_layer_list(bundle, tmp_path, fixture, args, code, says) -> None:  # type: ignore[no-untyped-def]
    """The bundle's own validator and engine_attest.py, standalone (no attn-export on the path), on a recorded layer list."""
    device = tmp_path / "bundle"
    shutil.copytree(bundle, device)
    meta = json.loads((device / "bundle.json").read_text())
    meta["expectation"] = json.loads((INSPECTOR / "expectation.json").read_text())  # the plan of the recorded engine
    (device / "bundle.json").write_text(json.dumps(meta))
    shutil.copyfile(INSPECTOR / fixture, device / "model.engine.layers.json")
    run = _validate(device, "--allow-stand-in", "--json", str(tmp_path / "stage.json"), *args)
    assert run.returncode == code, run.stdout + run.stderr
    assert says in run.stdout
    assert json.loads((tmp_path / "stage.json").read_text())["details"]["attestation"]["allowed_by"] == ("--accept-engine-mismatch" if args else None)


def test_validate_on_device_auto_without_tensorrt(bundle) -> None:  # type: ignore[no-untyped-def]
    if HAS_TRT:
        pytest.skip("TensorRT is installed: auto picks the engine")
    run = subprocess.run([sys.executable, str(bundle / "validate_on_device.py"), "--repeats", "2", "--warmup", "0"], capture_output=True, text=True, timeout=120)
    # only the stand-in ran: never a plain PASS with exit 0
    assert run.returncode == 3, run.stdout + run.stderr
    assert run.stdout.splitlines()[0] == f"backend: onnxruntime (stand-in): tensorrt is not installed; running ONNX Runtime on {bundle / 'model.onnx'}: these figures check the bundle, not the engine"
    assert "on the stand-in only: the engine was not checked (exit 3" in run.stdout.splitlines()[-1]


def test_validate_on_device_without_any_backend_is_one_line_exit_2(bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    if HAS_TRT:
        pytest.skip("TensorRT is installed")
    blocker = tmp_path / "no_ort"
    blocker.mkdir()
    (blocker / "onnxruntime.py").write_text("raise ImportError('onnxruntime is not installed')\n")  # shadows the real package
    run = subprocess.run([sys.executable, str(bundle / "validate_on_device.py")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(blocker)})  # fmt: skip
    err = run.stderr.strip()
    assert run.returncode == 2 and len(err.splitlines()) == 1 and "onnxruntime (the stand-in) is not installed either" in err, run.stderr


def test_perturbed_model_fails(bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    copy = tmp_path / "perturbed"
    shutil.copytree(bundle, copy)
    proto = onnx.load(copy / "model.onnx")
    biggest = max(proto.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    biggest.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(biggest) * 1.05, biggest.name))
    onnx.save(proto, copy / "model.onnx")
    run = _validate(copy, "--allow-stand-in")
    assert run.returncode == 1 and "y: FAIL (" in run.stdout and run.stdout.strip().endswith("FAIL")


def test_device_metrics_match_the_report() -> None:
    from attn_export.deploy import jetson_bundle

    spec = importlib.util.spec_from_file_location("validate_on_device", jetson_bundle._SCRIPT)
    vod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vod)  # type: ignore[union-attr]
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 8, 16)).astype(np.float32)
    for out in (ref + 1e-3 * rng.standard_normal(ref.shape).astype(np.float32), ref, np.zeros_like(ref)):
        ours, theirs = vod.accuracy(ref, out), accuracy(ref, out)
        assert ours == {k: getattr(theirs, k) for k in ours}


def test_static_check_runs_first(tmp_path) -> None:  # type: ignore[no-untyped-def]
    layer = small_layer("transformer", "none", d_model=32, heads=2)
    path = tmp_path / "trt.onnx"
    export_onnx(layer, path, export_spec_for("tensorrt", "fp16"))
    feed = feed_for(layer, 2, 16, d_model=32)
    with pytest.raises(CompatibilityError, match="TensorRT 10.3"):
        write_jetson_bundle(path, tmp_path / "b", SPEC, feed, {"y": eager(layer, feed)}, tolerance_for("fp16"))
    assert not (tmp_path / "b").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".b.")]


def test_bad_reference_and_rewrite(model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path, feed, ref = model
    with pytest.raises(DataError, match="must cover the model's inputs"):
        write_jetson_bundle(path, tmp_path / "b", SPEC, {"x": feed["x"]}, ref, tolerance_for("fp32"))
    first = write_jetson_bundle(path, tmp_path / "b", SPEC, feed, ref, {"y": {"max_abs": 1e-4}})
    again = write_jetson_bundle(path, tmp_path / "b", SPEC, feed, ref, {"y": Tolerance(max_abs=1e-3)})
    assert first == again and json.loads((again / "bundle.json").read_text())["tolerances"] == {"y": {"max_abs": 1e-3}}


def test_build_script_uses_only_flags_of_jetpack_trtexec(model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """build_engine.sh against the option list of trtexec 10.3 (release/10.3 sampleOptions.cpp)."""
    import shlex

    from trt_fakes import unknown_flags

    path, feed, ref = model
    static = ShapeProfile((2, 16), (2, 16), (2, 16))
    for spec in (SPEC, EngineSpec(precision="fp16", profiles=static, dla_core=0, version_compatible=True, timing_cache="t.cache")):
        bundle = write_jetson_bundle(path, tmp_path / "b", spec, feed, ref, tolerance_for("fp32"))
        line = (bundle / "build_engine.sh").read_text().strip().splitlines()[-1]
        argv = shlex.split(line.replace('"$TRTEXEC"', "trtexec"))
        assert argv[0] == "trtexec" and unknown_flags(argv, "10.3") == [], line
    meta = json.loads((bundle / "bundle.json").read_text())
    assert meta["version_compatible"] is True and meta["dla_core"] == 0
    assert "engine_host_code_allowed" in (bundle / "README.md").read_text()


def _device_script():  # type: ignore[no-untyped-def]
    from attn_export.deploy import jetson_bundle

    spec = importlib.util.spec_from_file_location("validate_on_device_fake", jetson_bundle._SCRIPT)
    vod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vod)  # type: ignore[union-attr]
    return vod


def _double_onnx(path) -> str:  # type: ignore[no-untyped-def]
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 4])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "double", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", 4])], initializer=[two])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    return str(path)


from trt_fakes import World, install, major_minor, manifest_versions  # noqa: E402


@pytest.mark.parametrize("version", manifest_versions())
def test_validate_on_device_tensorrt_path_against_strict_fakes(tmp_path, monkeypatch, capsys, version: str) -> None:  # type: ignore[no-untyped-def]
    """The device script's TensorRT backend: version-compatible engines, the selected GPU, and its report."""
    from attn_export.runtime.tensorrt.build import build_engine

    world = World()
    install(monkeypatch, version, world)
    precision = "fp32" if major_minor(version) >= (11, 0) else "fp16"
    onnx_path = _double_onnx(tmp_path / "model.onnx")
    build_engine(onnx_path, tmp_path / "model.engine", EngineSpec(precision=precision, profiles=ShapeProfile((1, 8), (2, 8), (4, 16)), version_compatible=True))
    vod = _device_script()
    with pytest.raises(RuntimeError, match="could not deserialise"):
        vod.TensorRTBackend(str(tmp_path / "model.engine"))  # without the opt-in TensorRT refuses the lean runtime
    x = np.arange(2 * 8 * 4, dtype=np.float32).reshape(2, 8, 4)
    np.savez(tmp_path / "reference.npz", **{"input/x": x, "output/y": 2 * x})
    meta = {"schema": 2, "inputs": ["x"], "outputs": ["y"], "input_dims": {"x": ["B", "S", 4]}, "output_dims": {"y": ["B", "S", 4]},
            "tolerances": {"y": {"max_abs": 1e-6}}, "version_compatible": True, "precision": precision}  # fmt: skip
    (tmp_path / "bundle.json").write_text(json.dumps(meta))
    code = vod.main(["--engine", str(tmp_path / "model.engine"), "--onnx", onnx_path, "--reference", str(tmp_path / "reference.npz"),
                     "--bundle-json", str(tmp_path / "bundle.json"), "--backend", "tensorrt", "--device", "1", "--warmup", "0", "--repeats", "2"])
    out = capsys.readouterr().out
    assert code == 0 and "y: PASS max_abs=0" in out and "latency_ms (tensorrt)" in out, out
    assert world.called("cudaSetDevice")[-1] == 1 and world.called("deserialize")[-1] == {"device": 1, "host_code_allowed": True}


def test_validate_on_device_refuses_bf16_io(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from attn_export.runtime.tensorrt.build import build_engine

    version = manifest_versions()[0]
    install(monkeypatch, version, World(io_dtype="BF16"))
    build_engine(_double_onnx(tmp_path / "m.onnx"), tmp_path / "m.engine", EngineSpec(precision="fp16", profiles=ShapeProfile((1, 8), (2, 8), (4, 16))))
    with pytest.raises(RuntimeError, match="engine I/O tensor 'x' is BF16, which numpy cannot hold"):
        _device_script().TensorRTBackend(str(tmp_path / "m.engine"))


def _two_output_onnx(path) -> str:  # type: ignore[no-untyped-def]
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 4])
    two, three = (helper.make_tensor(n, TensorProto.FLOAT, [], [v]) for n, v in (("two", 2.0), ("three", 3.0)))
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", "S", 4]) for n in ("y", "z")]
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"]), helper.make_node("Mul", ["x", "three"], ["z"])], "two", [x], outs,
                              initializer=[two, three])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    return str(path)


def test_every_output_is_held_to_its_own_tolerance(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = _two_output_onnx(tmp_path / "two.onnx")
    x = np.random.default_rng(0).standard_normal((2, 16, 4)).astype(np.float32)
    ref = {"y": 2 * x, "z": 3 * x * (1 + 1e-3)}  # z is off by 0.1 %, y is exact
    loose = write_jetson_bundle(path, tmp_path / "loose", SPEC, {"x": x}, ref, {"y": Tolerance(max_abs=1e-5), "z": Tolerance(rel_l2=1e-2)})
    assert json.loads((loose / "bundle.json").read_text())["tolerances"] == {"y": {"max_abs": 1e-5}, "z": {"rel_l2": 1e-2}}
    run = _validate(loose, "--allow-stand-in")
    assert run.returncode == 0 and "y: PASS" in run.stdout and "z: PASS" in run.stdout, run.stdout + run.stderr
    strict = write_jetson_bundle(path, tmp_path / "strict", SPEC, {"x": x}, ref, {"y": Tolerance(rel_l2=1e-2), "z": Tolerance(rel_l2=1e-4)})
    run = _validate(strict, "--allow-stand-in")
    assert run.returncode == 1 and "y: PASS" in run.stdout and "z: FAIL (rel_l2" in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize(
    ("reference", "tolerances", "match"),
    [
        ({"y"}, {"y": Tolerance(max_abs=1.0), "z": Tolerance(max_abs=1.0)}, "must be the model's outputs"),
        ({"y", "z"}, {"y": Tolerance(max_abs=1.0)}, "a tolerance for each model output"),
        ({"y", "z"}, {"y": Tolerance(max_abs=1.0), "z": Tolerance()}, "without a bound passes anything"),
        ({"y", "z"}, Tolerance(), "without a bound passes anything"),
        ({"y", "z"}, {"y": {"max_abs": float("nan")}, "z": {"max_abs": 1.0}}, "finite numbers"),
    ],
    ids=["an-output-without-reference", "an-output-without-tolerance", "an-empty-tolerance", "one-empty-tolerance-for-all", "a-nan-bound"],
)
def test_the_writer_refuses_a_bundle_that_would_check_nothing(tmp_path, reference, tolerances, match) -> None:  # type: ignore[no-untyped-def]
    path = _two_output_onnx(tmp_path / "two.onnx")
    x = np.ones((2, 16, 4), np.float32)
    with pytest.raises(DataError, match=match):
        write_jetson_bundle(path, tmp_path / "b", SPEC, {"x": x}, {n: x for n in reference}, tolerances)
    assert not (tmp_path / "b").exists()


def test_write_bundle_step_passes_each_outputs_tolerance(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from attn_export.deploy.steps import write_bundle

    path = _two_output_onnx(tmp_path / "two.onnx")
    x = np.ones((2, 16, 4), np.float32)

    class Subject:
        def bundle_reference(self, key: str):  # type: ignore[no-untyped-def]
            assert key == "fp16"
            return {"x": x}, {"y": 2 * x, "z": 3 * x}, {"y": Tolerance(max_abs=1e-4), "z": Tolerance(cosine_min=0.999)}

    bundle = write_bundle(Subject(), path, tmp_path / "b", SPEC, "fp16", "10.3", lambda _msg: None)
    assert json.loads((bundle / "bundle.json").read_text())["tolerances"] == {"y": {"max_abs": 1e-4}, "z": {"cosine_min": 0.999}}
