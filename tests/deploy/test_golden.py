"""Golden outputs: record, re-check on the same stack, catch 5% of texts moved to cosine 0.98, load in Polygraphy."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest

from attn_export.deploy.golden_judge import judge_golden
from attn_export.errors import ConfigError, DataError

N_TEXTS, DIM = 40, 16


def _model(path, out_dim=DIM, name="emb"):
    """A tiny ONNX embedding model (one MatMul), made with onnx.helper: no torch export."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((8, out_dim)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], [name])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n", out_dim])], [numpy_helper.from_array(w, "W")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _inputs(path, n=N_TEXTS):
    np.savez(path, **{"input/x": np.random.default_rng(1).standard_normal((n, 8)).astype(np.float32)})
    return path


def _main(args, capsys):
    from attn_export.cli import main

    code = main([str(a) for a in args])
    return code, capsys.readouterr()


def _rotate_to_cosine(rows: np.ndarray, picked: np.ndarray, cosine: float, seed: int = 2) -> np.ndarray:
    """Rotate each picked row in the plane of a random vector orthogonal to it, to exactly ``cosine`` (norm kept)."""
    out = rows.astype(np.float64).copy()
    rng = np.random.default_rng(seed)
    for i in picked:
        v = out[i]
        r = rng.standard_normal(v.shape)
        r -= (r @ v) / (v @ v) * v
        r *= np.linalg.norm(v) / np.linalg.norm(r)
        out[i] = cosine * v + np.sqrt(1 - cosine**2) * r
    return out.astype(rows.dtype)


@pytest.fixture
def recorded(tmp_path, capsys):
    model, inputs, golden = _model(tmp_path / "m.onnx"), _inputs(tmp_path / "in.npz"), tmp_path / "golden"
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(f"sentence number {i}\n" for i in range(N_TEXTS)))
    code, out = _main(["golden", "record", model, "--inputs", inputs, "--golden", golden, "--texts", texts], capsys)
    assert code == 0, out.err
    return model, golden


def test_record_then_check_on_the_same_stack_passes(recorded, capsys):
    model, golden = recorded
    assert sorted(p.name for p in golden.iterdir()) == [".attn-export-deploy.json", "golden.json", "inputs.json", "stack.json"]
    code, out = _main(["check", model, "--golden", golden], capsys)
    assert code == 0, out.out + out.err
    assert "PASS m.onnx" in out.out and "stack: golden vs now" in out.out and "onnxruntime" in out.out


def test_five_percent_of_texts_at_cosine_098_fail_with_exit_1_and_are_named(recorded, capsys):
    """The golden is perturbed as a broken upgrade would move the outputs: the check names exactly those texts."""
    from polygraphy.comparator import IterationResult, RunResults

    model, golden = recorded
    results = RunResults.load(str(golden / "golden.json"))
    runner, iterations = results[0]
    emb = np.asarray(iterations[0]["emb"])
    picked = np.random.default_rng(3).choice(N_TEXTS, size=N_TEXTS // 20, replace=False)  # 5%
    moved = _rotate_to_cosine(emb, picked, 0.98)
    cos = np.sum(moved * emb, axis=1) / (np.linalg.norm(moved, axis=1) * np.linalg.norm(emb, axis=1))
    np.testing.assert_allclose(cos[picked], 0.98, atol=1e-5)
    np.testing.assert_allclose(np.delete(cos, picked), 1.0, atol=1e-6)
    perturbed = RunResults()
    perturbed.add([IterationResult({"emb": moved}, runner_name=runner)], runner_name=runner)
    perturbed.save(str(golden / "golden.json"))

    code, out = _main(["check", model, "--golden", golden], capsys)
    assert code == 1
    fail = [line for line in out.out.splitlines() if line.startswith("FAIL")]
    assert len(fail) == 1 and "output 'emb' (embedding) moved: 2 of 40 texts below cosine 0.995" in fail[0]
    for i in picked:
        assert f"text {i} 'sentence number {i}' cosine 0.98" in fail[0]

    code, out = _main(["check", model, "--golden", golden, "--json"], capsys)
    data = json.loads(out.out)
    assert code == 1 and not data["passed"] and data["outputs"]["emb"]["texts_moved"] == 2


def test_golden_files_load_with_polygraphy_and_stack_json_is_validated(recorded):
    from polygraphy.comparator import RunResults
    from polygraphy.json import load_json

    from attn_export.deploy.golden import load_golden

    _, golden = recorded
    results = RunResults.load(str(golden / "golden.json"))
    assert len(results) == 1 and results[0][1][0]["emb"].shape == (N_TEXTS, DIM)
    assert load_json(str(golden / "inputs.json"))[0]["x"].shape == (N_TEXTS, 8)  # polygraphy run --load-inputs
    loaded = load_golden(golden)
    assert loaded.meta.stack["runtime"] == "onnxruntime" and loaded.meta.stack["cpu_class"]
    assert loaded.meta.kinds == {"emb": "embedding"} and len(loaded.meta.texts) == N_TEXTS
    stack = json.loads((golden / "stack.json").read_text())
    (golden / "stack.json").write_text(json.dumps(stack | {"surprise": 1}))
    with pytest.raises(DataError, match="not a valid golden folder"):
        load_golden(golden)


def test_a_pickled_array_in_golden_json_is_refused_never_unpickled(recorded):
    """Polygraphy decodes arrays with allow_pickle=False; an object array (a pickle) is a one-line DataError."""
    from attn_export.deploy.golden import load_golden

    _, golden = recorded
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    data = json.loads((golden / "golden.json").read_text())
    text = json.dumps(data)
    first = text.index('"array": "') + len('"array": "')
    text = text[:first] + base64.b64encode(buf.getvalue()).decode() + text[text.index('"', first):]
    (golden / "golden.json").write_text(text)
    with pytest.raises(DataError, match="not a valid golden folder"):
        load_golden(golden)


def test_a_folder_of_user_files_or_of_a_bundle_is_refused(tmp_path, capsys):
    model, inputs = _model(tmp_path / "m.onnx"), _inputs(tmp_path / "in.npz")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "thesis.txt").write_text("mine")
    code, out = _main(["golden", "record", model, "--inputs", inputs, "--golden", theirs], capsys)
    assert code == 2 and "'thesis.txt', which attn-export did not write" in out.err
    assert (theirs / "thesis.txt").read_text() == "mine" and sorted(p.name for p in theirs.iterdir()) == ["thesis.txt"]
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / ".attn-export-deploy.json").write_text(json.dumps({"format": 1, "kind": "jetson-bundle", "files": {}}))
    code, out = _main(["golden", "record", model, "--inputs", inputs, "--golden", bundle], capsys)
    assert code == 2 and "not a golden one" in out.err


def test_labels_are_judged_by_label_agreement():
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((50, 3))
    flipped = logits.copy()
    flipped[:5] = flipped[:5][:, ::-1] * 3  # 5 texts change label and direction
    verdict = judge_golden({"logits": [logits]}, {"logits": [flipped]}, {"logits": "labels"})
    assert not verdict.passed and "label agreement" in verdict.failure_lines()[0]
    assert judge_golden({"logits": [logits]}, {"logits": [logits + 1e-7]}, {"logits": "labels"}).passed


def test_check_golden_refusals_are_one_line(recorded, tmp_path, capsys):
    model, golden = recorded
    code, out = _main(["check", model, "--golden", tmp_path / "nowhere"], capsys)
    assert code == 2 and "has no golden.json" in out.err
    code, out = _main(["check", model, "--golden", golden, "--baseline", tmp_path / "b.json"], capsys)
    assert code == 2 and "drop --baseline" in out.err
    other = _model(tmp_path / "other.onnx", out_dim=4)
    with pytest.raises(DataError, match="shape"):
        from attn_export.deploy.golden import load_golden, run_artifact

        judge_golden(load_golden(golden).outputs, run_artifact(other, load_golden(golden).inputs)[1], {"emb": "embedding"})
    with pytest.raises(ConfigError, match="neither an ONNX model"):
        run_artifact(tmp_path / "in.npz", [])


def test_an_engine_records_its_gpu_tensorrt_and_cuda_and_checks_on_the_new_stack(tmp_path, monkeypatch):
    """Up to the hardware boundary: a TensorRT engine built and run by the strict doubles, recorded and checked."""
    from trt_fakes import World, install, manifest_versions

    from attn_export.deploy.golden import load_golden, record_golden
    from attn_export.runtime.tensorrt.build import build_engine
    from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile
    from attn_export.cli.golden import run_golden_check

    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 4])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "double", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", 4])], initializer=[two])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), tmp_path / "double.onnx")
    version = manifest_versions()[0]
    world = World(devices=[("NVIDIA L4", 8, 9)])
    install(monkeypatch, version, world)
    spec = EngineSpec(precision="fp16", profiles=ShapeProfile((1, 8), (2, 16), (4, 32)))
    engine = Path(build_engine(str(tmp_path / "double.onnx"), tmp_path / "m.engine", spec).engine_path)
    feeds = [{"x": np.random.default_rng(i).standard_normal((2, 16, 4)).astype(np.float32)} for i in range(3)]
    meta = record_golden(tmp_path / "golden", engine, feeds)
    assert meta.stack["runtime"] == "tensorrt" and meta.stack["gpu"] == "NVIDIA L4" and meta.stack["compute_capability"] == "8.9"
    assert meta.stack["tensorrt"] == version and meta.stack["cuda"] == "12.6" and meta.kinds == {"y": "tensor"}
    assert len(load_golden(tmp_path / "golden").outputs["y"]) == 3
    world.cuda_runtime = 13000  # the upgrade: same engine, new CUDA
    assert run_golden_check(engine, tmp_path / "golden", quiet=True) == 0
