"""The Jetson bundle's ``validate_on_device.py`` never passes on nothing and never shows a traceback (issue 20, class 15).

A bundle is written by the real writer (``write_jetson_bundle``) for a small exported layer,
copied, and one file is corrupted per case: ``bundle.json`` (no outputs, an empty or
non-finite tolerance, an old schema, not JSON), ``reference.npz`` (an input or output missing
or extra, truncated, empty, wrong shapes, NaN) or ``model.onnx`` (an output the bundle does
not list). Each must end in exit 2 with one ``error:`` line, except a reference that does not
match the model (negated), which must FAIL (exit 1), never PASS. The script runs as the
device runs it, in a subprocess with the ONNX Runtime stand-in, for the file-level cases,
and in process (the same file loaded as a module) for the rest.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from fixtures import eager, feed_for, small_layer

from attn_export.deploy import jetson_bundle
from attn_export.deploy.jetson_bundle import write_jetson_bundle
from attn_export.export import export_onnx
from attn_export.targets.targets import export_spec_for
from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile
from attn_export.validate import tolerance_for

SPEC = EngineSpec(precision="fp16", profiles=ShapeProfile((1, 8), (2, 16), (4, 32)), workspace_bytes=1 << 30)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    layer = small_layer("transformer", "padding", d_model=32, heads=2)
    root = tmp_path_factory.mktemp("bundle")
    export_onnx(layer, root / "model.onnx", export_spec_for("jetson", "fp16"))
    feed = feed_for(layer, 2, 16, seed=3, d_model=32)
    return write_jetson_bundle(root / "model.onnx", root / "bundle", SPEC, feed, {"y": eager(layer, feed)}, tolerance_for("fp32"))


def _meta(b: Path, edit: Callable[[dict], object]) -> None:
    meta = json.loads((b / "bundle.json").read_text())
    edit(meta)
    (b / "bundle.json").write_text(json.dumps(meta))


def _npz(b: Path, edit: Callable[[dict], object]) -> None:
    with np.load(b / "reference.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    edit(arrays)
    np.savez(b / "reference.npz", **arrays)


def _extra_model_output(b: Path) -> None:
    proto = onnx.load(b / "model.onnx")
    probs = next(n for n in proto.graph.node if n.op_type == "Softmax").output[0]  # a float tensor nobody compares
    proto.graph.output.append(onnx.helper.make_tensor_value_info(probs, onnx.TensorProto.FLOAT, None))
    onnx.save(proto, b / "model.onnx")


def _truncate(b: Path) -> None:
    data = (b / "reference.npz").read_bytes()
    (b / "reference.npz").write_bytes(data[: len(data) // 2])


# case id -> (corruption, exit code, text on stderr (exit 2) or stdout (exit 1))
CASES: dict[str, tuple[Callable[[Path], object], int, str]] = {
    "no-outputs-to-compare": (lambda b: _meta(b, lambda m: m.update(outputs=[], output_dims={}, tolerances={})), 2, "'outputs' must be a non-empty list"),
    "an-empty-tolerance": (lambda b: _meta(b, lambda m: m["tolerances"].update(y={})), 2, "empty tolerance for output 'y'"),
    "an-empty-tolerance-and-a-negated-reference": (
        lambda b: (_meta(b, lambda m: m["tolerances"].update(y={})), _npz(b, lambda a: a.update({"output/y": -a["output/y"]}))), 2, "empty tolerance"),
    "no-tolerances-at-all": (lambda b: _meta(b, lambda m: m.pop("tolerances")), 2, "'tolerances' must map every output"),
    "the-old-single-tolerance": (lambda b: _meta(b, lambda m: (m.pop("tolerances"), m.update(schema=1, tolerance={}))), 2, "schema 1"),
    "a-nan-tolerance": (lambda b: _meta(b, lambda m: m["tolerances"]["y"].update(max_abs=float("nan"))), 2, "tolerance of 'y' has max_abs=nan"),
    "an-unknown-tolerance-key": (lambda b: _meta(b, lambda m: m["tolerances"].update(y={"atol": 1.0})), 2, "atol"),
    "a-tolerance-for-no-output": (lambda b: _meta(b, lambda m: m["tolerances"].update(z={"max_abs": 1.0})), 2, "not an output ['z']"),
    "bundle-json-not-json": (lambda b: (b / "bundle.json").write_text("{not json"), 2, "cannot read"),
    "bundle-json-a-list": (lambda b: (b / "bundle.json").write_text("[]"), 2, "must hold a JSON object"),
    "a-missing-input": (lambda b: _npz(b, lambda a: a.pop("input/key_padding_mask")), 2, "missing ['input/key_padding_mask']"),
    "a-missing-output": (lambda b: _npz(b, lambda a: a.pop("output/y")), 2, "missing ['output/y']"),
    "an-extra-output-in-the-reference": (lambda b: _npz(b, lambda a: a.update({"output/z": a["output/y"]})), 2, "extra ['output/z']"),
    "an-extra-output-in-the-model": (_extra_model_output, 2, "every output must be in both"),
    "a-truncated-reference": (_truncate, 2, "truncated or not an .npz"),
    "an-empty-reference-file": (lambda b: (b / "reference.npz").write_bytes(b""), 2, "truncated or not an .npz"),
    "a-reference-with-no-arrays": (lambda b: np.savez(b / "reference.npz"), 2, "missing ['input/x'"),
    "an-output-shape-mismatch": (lambda b: _npz(b, lambda a: a.update({"output/y": a["output/y"][..., :16]})), 2, "output/y has shape (2, 16, 16)"),
    "a-wrong-input-width": (lambda b: _npz(b, lambda a: a.update({"input/x": np.zeros((2, 16, 33), np.float32)})), 2, "input/x has shape (2, 16, 33)"),
    "an-output-batch-unlike-the-inputs": (lambda b: _npz(b, lambda a: a.update({"output/y": a["output/y"][:1]})), 2, "batch=1 where the other tensors have batch=2"),
    "an-empty-input": (lambda b: _npz(b, lambda a: a.update({"input/x": np.zeros((0, 16, 32), np.float32)})), 2, "non-empty numeric array"),
    "a-nan-in-the-reference": (lambda b: _npz(b, lambda a: a["output/y"].__setitem__((0, 0, 0), np.nan)), 2, "NaN/Inf"),
    "a-pickled-object-array": (lambda b: _npz(b, lambda a: a.update({"output/y": np.array([{}], dtype=object)})), 2, "truncated or not an .npz"),
    "a-negated-reference": (lambda b: _npz(b, lambda a: a.update({"output/y": -a["output/y"]})), 1, "y: FAIL ("),
}
SUBPROCESS = {"a-truncated-reference", "an-extra-output-in-the-model", "a-negated-reference", "no-outputs-to-compare"}


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("validate_on_device_rel", jetson_bundle._SCRIPT)
    vod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vod)  # type: ignore[union-attr]
    return vod


@pytest.mark.parametrize("case", list(CASES), ids=[f"c15-{c}" for c in CASES])
def test_a_corrupted_bundle_never_passes_and_never_shows_a_traceback(case: str, bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corrupt, want_code, text = CASES[case]
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    corrupt(copy)
    args = ["--backend", "onnxruntime", "--allow-stand-in", "--warmup", "0", "--repeats", "1"]
    if case in SUBPROCESS:  # as the device runs it: its own interpreter, no attn-export on the path
        run = subprocess.run([sys.executable, str(copy / "validate_on_device.py"), *args], capture_output=True, text=True, timeout=120,
                             cwd="/", env={**os.environ, "PYTHONPATH": ""})  # fmt: skip
        code, out, err = run.returncode, run.stdout, run.stderr
    else:
        vod = _script()
        here = [f"--{k}={copy / f}" for k, f in (("engine", "model.engine"), ("onnx", "model.onnx"), ("reference", "reference.npz"), ("bundle-json", "bundle.json"))]
        code = vod.main([*here, *args])
        cap = capsys.readouterr()
        out, err = cap.out, cap.err
    assert "Traceback" not in out + err, err
    assert code == want_code, f"exit {code}; stdout {out[-300:]!r}; stderr {err!r}"
    if want_code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], lines
        assert "PASS" not in out
    else:
        assert text in out and out.strip().endswith("FAIL") and "PASS" not in out, out
