"""Round five, golden outputs (issue 39, class 31; 7, 14 and 29 reused): a golden check never passes on
nothing, and a malformed golden folder or ``--inputs`` file is one line, never a traceback.

Each case records a real golden of a tiny ONNX model (one MatMul, made with onnx.helper: no torch),
then breaks one thing the way a disk, an upgrade or a hand edit would: NaN or inf in the golden or in
the model's outputs, outputs scaled x1000 (cosine 1, the neighbours kept), a golden with no batches,
a dict ``inputs.json``, a batch missing an output, a FIFO or a device named ``golden.json``, an object
array, random bytes or the wrong dimensions as ``golden record --inputs``. The check must fail by name
(exit 1) or refuse in one line (exit 2); the Jetson bundle's ``golden_on_device.py`` judges the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rel_helpers import assert_refused, run_cli
from rel_inputs import npz, random_bytes

N, D = 24, 8  # texts, input features
Cap = pytest.CaptureFixture[str]


def _onnx(path: Path, scale: float = 1.0, tensor: bool = False) -> Path:
    """x (n, 8) -> emb (n, 16), an embedding; or x (n, 3, 8) -> out (n, 3, 16), a plain tensor; W times ``scale``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = (np.random.default_rng(0).standard_normal((D, 16)) * scale).astype(np.float32)
    dims, name = (["n", 3], "out") if tensor else (["n"], "emb")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [*dims, D])
    y = helper.make_tensor_value_info(name, TensorProto.FLOAT, [*dims, 16])
    matmul = helper.make_node("MatMul", ["x", "W"], [name])
    graph = helper.make_graph([matmul], "g", [x], [y], [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _x(tensor: bool = False) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((N, 3, D) if tensor else (N, D)).astype(np.float32)


def _record_cmd(model: Path, inputs: Path, golden: Path, capsys: Cap, root: Path):  # type: ignore[no-untyped-def]
    return run_cli(["golden", "record", model, "--inputs", inputs, "--golden", golden], capsys, root)


def _record(tmp_path: Path, capsys: Cap, tensor: bool = False) -> tuple[Path, Path]:
    model, golden = _onnx(tmp_path / "m.onnx", tensor=tensor), tmp_path / "golden"
    o = _record_cmd(model, npz(tmp_path / "in.npz", **{"input/x": _x(tensor)}), golden, capsys, tmp_path)
    assert o.code == 0, o.err
    return model, golden


def _golden_outputs(golden: Path) -> dict[str, list[np.ndarray]]:
    from polygraphy.comparator import RunResults

    (_, iterations), = list(RunResults.load(str(golden / "golden.json")).items())
    return {name: [np.asarray(it[name]) for it in iterations] for name in iterations[0].keys()}


def _write_golden(golden: Path, iterations: list[dict[str, np.ndarray]]) -> None:
    """golden.json rewritten with Polygraphy's own classes, as a hand edit or a broken recorder would leave it."""
    from polygraphy.comparator import IterationResult, RunResults

    results = RunResults()
    results.add([IterationResult(it, runner_name="old") for it in iterations], runner_name="old")
    results.save(str(golden / "golden.json"))


def _nan_all(a: np.ndarray) -> np.ndarray:
    return np.full_like(a, np.nan)


def _nan_every_7th(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.reshape(-1)[::7] = np.nan
    return a


def _one_inf(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.reshape(-1)[5] = np.inf
    return a


BROKEN = {"nan-all": _nan_all, "nan-every-7th": _nan_every_7th, "plus-inf": _one_inf}


# -- class 31: non-finite, rescaled ---------------------------------------------------------------------------
@pytest.mark.parametrize("tensor", [False, True], ids=["embedding", "tensor"])
@pytest.mark.parametrize("case", list(BROKEN), ids=[f"c31-golden-{c}" for c in BROKEN])
def test_c31_a_golden_holding_nan_or_inf_fails_by_name(case: str, tensor: bool, tmp_path: Path, capsys: Cap) -> None:
    model, golden = _record(tmp_path, capsys, tensor)
    name = "out" if tensor else "emb"
    broken = BROKEN[case](_golden_outputs(golden)[name][0])
    count = int(np.size(broken) - np.isfinite(broken).sum())
    assert count == {"nan-all": np.size(broken), "nan-every-7th": -(-np.size(broken) // 7), "plus-inf": 1}[case]
    _write_golden(golden, [{name: broken}])
    o = run_cli(["check", model, "--golden", golden], capsys, tmp_path)
    assert o.code == 1, o.out + o.err
    fail = [line for line in o.out.splitlines() if line.startswith("FAIL")]
    assert len(fail) == 1 and f"output {name!r}" in fail[0], o.out
    assert f"the golden holds {count} non-finite value{'s' if count > 1 else ''} (NaN or inf)" in fail[0], fail[0]
    assert "PASS" not in o.out and "Traceback" not in o.err
    data = json.loads(run_cli(["check", model, "--golden", golden, "--json"], capsys, tmp_path).out)  # strict: no NaN
    assert not data["passed"] and data["outputs"][name]["nonfinite_golden"] == count


def test_c31_the_models_outputs_holding_nan_fail_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The golden is finite, the model's outputs are not (its inputs carry NaN): named as the model's."""
    from polygraphy.json import save_json

    model, golden = _record(tmp_path, capsys)
    x = _x()
    x[2, 0] = np.nan  # one text's row: 16 NaN outputs
    save_json([{"x": x}], str(golden / "inputs.json"))
    o = run_cli(["check", model, "--golden", golden], capsys, tmp_path)
    assert o.code == 1, o.out + o.err
    fail = [line for line in o.out.splitlines() if line.startswith("FAIL")]
    assert len(fail) == 1, o.out
    assert "the model's outputs hold 16 non-finite values (NaN or inf) in 1 of 24 texts" in fail[0], o.out
    assert "golden holds" not in fail[0]


@pytest.mark.parametrize("tensor", [False, True], ids=["c31-scaled-embedding", "c31-scaled-tensor"])
def test_c31_outputs_scaled_x1000_fail_on_scale(tensor: bool, tmp_path: Path, capsys: Cap) -> None:
    """Every cosine is 1 and every neighbour kept: only the scale tells a model whose outputs grew 1000-fold."""
    _, golden = _record(tmp_path, capsys, tensor)
    scaled = _onnx(tmp_path / "scaled.onnx", scale=1000.0, tensor=tensor)
    o = run_cli(["check", scaled, "--golden", golden], capsys, tmp_path)
    assert o.code == 1, o.out + o.err
    fail = [line for line in o.out.splitlines() if line.startswith("FAIL")]
    assert len(fail) == 1 and f"{N} of {N} texts off the golden by relative error > 0.1 (largest 999" in fail[0], o.out
    assert "matches the golden outputs" not in o.out
    nudged = _onnx(tmp_path / "nudged.onnx", scale=1.001, tensor=tensor)  # a rounding-sized change still passes
    assert run_cli(["check", nudged, "--golden", golden, "--quiet"], capsys, tmp_path).code == 0


def test_c31_a_golden_of_zero_texts_is_refused_when_recorded(tmp_path: Path, capsys: Cap) -> None:
    model = _onnx(tmp_path / "m.onnx")
    inputs = npz(tmp_path / "in.npz", **{"input/x": np.zeros((0, D), np.float32)})
    assert_refused(_record_cmd(model, inputs, tmp_path / "g", capsys, tmp_path), "one row or more")


def test_c31_a_model_producing_nan_is_never_recorded_as_golden(tmp_path: Path, capsys: Cap) -> None:
    model = _onnx(tmp_path / "m.onnx")
    x = _x()
    x[0, 0] = np.inf
    inputs = npz(tmp_path / "in.npz", **{"input/x": x})
    o = _record_cmd(model, inputs, tmp_path / "g", capsys, tmp_path)
    assert_refused(o, "non-finite")
    assert "'emb'" in o.err


# -- class 7: malformed golden folders and --inputs, never a traceback ------------------------------------------
def _no_iterations(golden: Path) -> None:
    _write_golden(golden, [])
    (golden / "inputs.json").write_text("[]")


def _dict_inputs(golden: Path) -> None:
    from polygraphy.json import load_json, save_json

    save_json(load_json(str(golden / "inputs.json"))[0], str(golden / "inputs.json"))  # {"x": a}, not [{"x": a}]


def _missing_output(golden: Path) -> None:
    from polygraphy.json import load_json, save_json

    out = _golden_outputs(golden)["emb"][0]
    x = load_json(str(golden / "inputs.json"))[0]["x"]
    save_json([{"x": x[:12]}, {"x": x[12:]}], str(golden / "inputs.json"))
    _write_golden(golden, [{"emb": out[:12]}, {"other": out[12:]}])


def _string_inputs(golden: Path) -> None:
    from polygraphy.json import save_json

    save_json([{"x": np.array(["a", "b"])}], str(golden / "inputs.json"))


MALFORMED = {"no-iterations": (_no_iterations, "no output batches"), "dict-inputs": (_dict_inputs, "valid list"),
             "missing-output": (_missing_output, "batch 1"), "string-inputs": (_string_inputs, "numeric")}  # fmt: skip


@pytest.mark.parametrize("case", list(MALFORMED), ids=[f"c7-{c}" for c in MALFORMED])
def test_c7_a_malformed_golden_folder_is_refused_in_one_line(case: str, tmp_path: Path, capsys: Cap) -> None:
    model, golden = _record(tmp_path, capsys)
    break_it, expect = MALFORMED[case]
    break_it(golden)
    assert_refused(run_cli(["check", model, "--golden", golden], capsys, tmp_path), expect)


def _object_npz(path: Path) -> Path:
    np.savez(path, **{"input/x": np.array([{"a": 1}], dtype=object)})  # np.savez pickles it: never unpickled when read
    return path


BAD_INPUTS = {
    "object-array": (_object_npz, "object"),
    "random-bytes": (lambda p: random_bytes(p), "not an .npz"),
    "columns-9": (lambda p: npz(p, **{"input/x": np.zeros((4, 9), np.float32)}), "(4, 9)"),
    "rank-1": (lambda p: npz(p, **{"input/x": np.zeros((4,), np.float32)}), "(4,)"),
    "rank-3": (lambda p: npz(p, **{"input/x": np.zeros((4, 2, D), np.float32)}), "(4, 2, 8)"),
    "strings": (lambda p: npz(p, **{"input/x": np.array(["a", "b"])}), "numeric"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=[f"c7-inputs-{c}" for c in BAD_INPUTS])
def test_c7_golden_record_refuses_bad_inputs_in_one_line(case: str, tmp_path: Path, capsys: Cap) -> None:
    model = _onnx(tmp_path / "m.onnx")
    make, expect = BAD_INPUTS[case]
    inputs = make(tmp_path / "in.npz")
    o = _record_cmd(model, inputs, tmp_path / "g", capsys, tmp_path)
    assert_refused(o, expect)
    assert not (tmp_path / "g").exists()


# -- class 14: a FIFO or a device named golden.json ----------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "device"], ids=["c14-fifo", "c14-device"])
def test_c14_a_fifo_or_device_golden_json_is_named_for_what_it_is(kind: str, tmp_path: Path, capsys: Cap) -> None:
    model, golden = _record(tmp_path, capsys)
    (golden / "golden.json").unlink()
    if kind == "fifo":
        os.mkfifo(golden / "golden.json")
    else:
        os.symlink("/dev/null", golden / "golden.json")
    o = run_cli(["check", model, "--golden", golden], capsys, tmp_path)
    assert_refused(o, "a FIFO" if kind == "fifo" else "a character device")
    assert "has no golden.json" not in o.err


def test_c14_a_fifo_as_golden_record_inputs_is_not_called_missing(tmp_path: Path, capsys: Cap) -> None:
    model = _onnx(tmp_path / "m.onnx")
    os.mkfifo(tmp_path / "in.npz")
    o = _record_cmd(model, tmp_path / "in.npz", tmp_path / "g", capsys, tmp_path)
    assert_refused(o, "a FIFO")
    assert "does not exist" not in o.err


# -- the Jetson bundle's golden_on_device.py judges the same way --------------------------------------------
@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import onnxruntime as ort

    from attn_export.deploy.jetson_bundle import write_jetson_bundle
    from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile
    from attn_export.validate.tolerances import Tolerance

    root = tmp_path_factory.mktemp("r5g")
    model = _onnx(root / "m.onnx")
    x = _x()
    y = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    spec = EngineSpec(precision="fp16", profiles=ShapeProfile((1, D), (N, D), (64, D)))
    return write_jetson_bundle(model, root / "bundle", spec, {"x": x}, {"emb": y}, Tolerance(cosine_min=0.999))


def _on_device(bundle: Path, tmp_path: Path, golden: Path) -> subprocess.CompletedProcess:
    """The bundle's own script, from /, with attn_export and polygraphy blocked (JetPack has neither)."""
    blocker = tmp_path / "blocked"
    for name in ("attn_export", "polygraphy"):
        (blocker / name).mkdir(parents=True, exist_ok=True)
        (blocker / name / "__init__.py").write_text(f"raise ImportError('{name} is not on the device')\n")
    cmd = [sys.executable, str(bundle / "golden_on_device.py"), "--backend", "onnxruntime", "--allow-stand-in",
           "--golden", str(golden)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(blocker)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/", env=env)


@pytest.mark.parametrize("case", ["c31-device-nan-every-7th", "c31-device-plus-inf", "c31-device-scaled-x1000"])
def test_c31_the_on_device_golden_check_fails_on_nan_inf_and_scale(case: str, bundle: Path, tmp_path: Path) -> None:
    from polygraphy.comparator import RunResults

    rows = np.asarray(RunResults.load(str(bundle / "golden.json"))[0][1][0]["emb"])
    broken = {"c31-device-nan-every-7th": _nan_every_7th(rows), "c31-device-plus-inf": _one_inf(rows),
              "c31-device-scaled-x1000": rows / 1000}[case]  # fmt: skip
    device = tmp_path / "golden"
    device.mkdir()
    _write_golden(device, [{"emb": broken}])
    (device / "stack.json").write_text((bundle / "golden_stack.json").read_text())
    run = _on_device(bundle, tmp_path, device)
    assert run.returncode == 1, run.stdout + run.stderr
    fail = [line for line in run.stdout.splitlines() if line.startswith("FAIL: output 'emb'")]
    want = {"c31-device-nan-every-7th": f"the golden holds {-(-N * 16 // 7)} non-finite values (NaN or inf)",
            "c31-device-plus-inf": "the golden holds 1 non-finite value (NaN or inf) in 1 of 24 texts",
            "c31-device-scaled-x1000": f"{N} of {N} texts off the golden by relative error > 0.1"}[case]  # fmt: skip
    assert len(fail) == 1 and want in fail[0], run.stdout
    assert run.stdout.splitlines()[-1] == "FAIL"


def test_c14_the_on_device_check_names_a_fifo_golden_json(bundle: Path, tmp_path: Path) -> None:
    device = tmp_path / "golden"
    device.mkdir()
    os.mkfifo(device / "golden.json")
    (device / "stack.json").write_text((bundle / "golden_stack.json").read_text())
    run = _on_device(bundle, tmp_path, device)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stdout + run.stderr
    assert "a FIFO" in run.stderr and "does not exist" not in run.stderr


@pytest.mark.parametrize("case", ["c7-device-no-iterations", "c7-device-missing-output"])
def test_c7_the_on_device_check_refuses_a_malformed_golden_in_one_line(case: str, bundle: Path, tmp_path: Path) -> None:
    from polygraphy.comparator import RunResults

    rows = np.asarray(RunResults.load(str(bundle / "golden.json"))[0][1][0]["emb"])
    device = tmp_path / "golden"
    device.mkdir()
    _write_golden(device, [] if case == "c7-device-no-iterations" else [{"emb": rows[:12]}, {"other": rows[12:]}])
    (device / "stack.json").write_text((bundle / "golden_stack.json").read_text())
    run = _on_device(bundle, tmp_path, device)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    want = "holds no outputs" if case == "c7-device-no-iterations" else "iteration 1 has outputs ['other']"
    assert want in run.stderr


def test_c29_without_polygraphy_golden_record_names_the_package(tmp_path: Path, capsys: Cap, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:  # fmt: skip
    """Not "internal error: ModuleNotFoundError": the one line says which package to install."""
    for name in [m for m in sys.modules if m == "polygraphy" or m.startswith("polygraphy.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "polygraphy", None)  # import polygraphy raises ImportError
    model = _onnx(tmp_path / "m.onnx")
    inputs = npz(tmp_path / "in.npz", **{"input/x": _x()})
    assert_refused(_record_cmd(model, inputs, tmp_path / "g", capsys, tmp_path), "pip install polygraphy")
