"""int8 on CPUs without VNNI: the U8S8 saturation, reproduced, and the encoding that avoids it.

ONNX Runtime's U8S8 GEMM on AVX2 (and AVX-512 without VNNI) sums byte-pair products into a
saturating int16 (VPMADDUBSW). ``simulate_u8s8_matmul`` reproduces that arithmetic, so these
tests show the effect and the fix on any machine; ``test_real_avx2_kernels_under_qemu`` runs
ONNX Runtime's real AVX2 kernels under ``qemu-x86_64 -cpu Haswell`` where qemu-user exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from u8s8_sim import quantize_weight_per_channel, simulate_u8s8_matmul

from attn_export.compress.quant.int8_encoding import choose_cpu_encoding
from attn_export.host.environment import CpuInfo


def test_simulated_kernel_saturates_exactly_like_vpmaddubsw():
    a = np.full((2, 64), 255, np.uint8)
    b = np.full((64, 3), 127, np.int8)
    assert simulate_u8s8_matmul(a, b, saturate=False)[0, 0] == 64 * 255 * 127
    # 32 pairs, each clipped to int16 max: what ORT's AVX2 kernel returned under qemu (1048544)
    assert simulate_u8s8_matmul(a, b)[0, 0] == 32 * 32767 == 1048544
    odd = np.full((1, 5), 200, np.uint8)  # odd K is zero-padded, as MLAS packs it
    assert simulate_u8s8_matmul(odd, np.ones((5, 2), np.int8))[0, 0] == 1000


def _default_layer_gemm() -> tuple[np.ndarray, np.ndarray]:
    """The default layer's fused QKV weight and the calibration set's LayerNorm-ed activations."""
    from attn_export.compress import default_calibration_path, load_calibration
    from attn_export.layers import build_layer

    layer = build_layer("transformer", 512, 8, mask="padding", seed=0)
    weight = next(m for n, m in layer.named_modules() if n.endswith("w_q")).weight.detach().numpy().T  # (K, N)
    acts = load_calibration(default_calibration_path(512), 512).val
    x = acts.x[acts.key_padding_mask.astype(bool)][:256].astype(np.float32)  # (M, K) real tokens
    return x, weight


def _static_u8(x: np.ndarray) -> tuple[np.ndarray, float]:
    """Symmetric int8 activations as x86 ONNX Runtime runs them: shifted to uint8 with zero point 128."""
    scale = float(np.abs(x).max()) / 127
    s8 = np.clip(np.rint(x / scale), -127, 127).astype(np.int32)
    return (s8 + 128).astype(np.uint8), scale


def _rel_err(exact: np.ndarray, got: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - exact) / np.linalg.norm(exact.astype(np.float64)))


def test_default_layer_saturates_with_full_range_weights_and_not_with_the_fixes():
    x, w = _default_layer_gemm()
    a, _ = _static_u8(x)
    full, _ = quantize_weight_per_channel(w, reduce_range=False)
    exact = simulate_u8s8_matmul(a, full, saturate=False)
    saturated = simulate_u8s8_matmul(a, full)
    hit = float((saturated != exact).mean())
    assert hit > 0.01 and _rel_err(exact, saturated) > 1e-3, (hit, _rel_err(exact, saturated))  # the AVX2 defect
    # fix 1, reduce-range: 7-bit weights keep every pair under 32767, so the saturating kernel is exact
    rr, _ = quantize_weight_per_channel(w, reduce_range=True)
    assert np.abs(rr).max() <= 64
    np.testing.assert_array_equal(simulate_u8s8_matmul(a, rr), simulate_u8s8_matmul(a, rr, saturate=False))
    # fix 2, u8u8 (session.x64quantprecision=1): ORT widens both operands to int16 first (VPMADDWD):
    # u8 x u8 pair sums fit int32 exactly, i.e. the exact product of the full-range weights
    w_u8 = (full.astype(np.int32) + 128).astype(np.int64)
    u8u8 = a.astype(np.int64) @ w_u8 - 128 * a.astype(np.int64).sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(u8u8, exact)


def _cpu(isa: str) -> CpuInfo:
    return CpuInfo(isa_class=isa, machine="x86_64", model="test")


@pytest.mark.parametrize("isa,expected", [("x86-avx2", "u8u8"), ("x86-avx512", "u8u8"), ("x86-sse", "u8u8"),
                                          ("x86-avx512-vnni", "full-range"), ("x86-amx", "full-range"), ("arm-dotprod", "full-range")])  # fmt: skip
def test_auto_encoding_follows_the_instruction_set(isa, expected):
    choice = choose_cpu_encoding("auto", _cpu(isa))
    assert choice.encoding == expected and choice.isa_class == isa
    assert choice.session_u8u8 == (expected == "u8u8")
    assert (choice.deploy_note() is not None) == (expected == "u8u8")
    assert choose_cpu_encoding("reduce-range", _cpu(isa)).reduce_range


def test_plan_keeps_tensorrt_q_dq_full_range_on_a_saturating_cpu(monkeypatch):
    from attn_export.compress.methods.int8_dynamic import Int8Dynamic
    from attn_export.compress.methods.int8_static import Int8Static
    from attn_export.config.run import RunConfig
    from attn_export.pipeline.plan import make_plan

    monkeypatch.setenv("ATTN_EXPORT_ISA_CLASS", "x86-avx2")
    cpu = make_plan(RunConfig(quantize="int8"))
    assert cpu.encoding.encoding == "u8u8"
    configs = {s.name: s.config for s in cpu.steps}
    assert isinstance(configs["int8-per-token"], Int8Dynamic) and configs["int8-per-token"].session_u8u8  # per-token is a dynamic route
    assert isinstance(configs["int8-static"], Int8Static) and configs["int8-static"].session_u8u8
    trt = make_plan(RunConfig(quantize="int8", target="tensorrt"))
    static = next(s.config for s in trt.steps if s.name == "int8-static")
    assert static.for_tensorrt and not static.reduce_range and not static.session_u8u8  # TensorRT's Q/DQ never changes
    assert [s.name for s in trt.steps] == ["onnx-fp32", "int8-static"]


_QEMU_SCRIPT = textwrap.dedent(
    """
    import numpy as np, onnx, onnx.helper as oh, onnxruntime as ort
    from onnx import numpy_helper
    rng = np.random.default_rng(0)
    w = rng.integers(100, 128, (64, 16)).astype(np.int8) * np.where(rng.random((64, 16)) < 0.5, 1, -1).astype(np.int8)
    g = oh.make_graph([oh.make_node("MatMulInteger", ["A", "W"], ["Y"])], "g",
        [oh.make_tensor_value_info("A", onnx.TensorProto.UINT8, [8, 64])],
        [oh.make_tensor_value_info("Y", onnx.TensorProto.INT32, [8, 16])], [numpy_helper.from_array(w, "W")])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]); m.ir_version = 8
    onnx.save(m, "mmi.onnx")
    a = rng.integers(200, 256, (8, 64)).astype(np.uint8)
    exact = a.astype(np.int64) @ w.astype(np.int64)
    for prec in ("0", "1"):
        so = ort.SessionOptions(); so.add_session_config_entry("session.x64quantprecision", prec)
        y = ort.InferenceSession("mmi.onnx", so, providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]
        print(prec, int((y != exact).sum()))
    """
)


@pytest.mark.skipif(shutil.which("qemu-x86_64") is None, reason="qemu-user is not installed (apt-get install qemu-user)")
def test_real_avx2_kernels_under_qemu(tmp_path):
    """ONNX Runtime's own AVX2 kernel (qemu -cpu Haswell: AVX2, no VNNI) saturates; the U8U8 session option is exact."""
    script = tmp_path / "probe.py"
    script.write_text(_QEMU_SCRIPT)
    python = os.path.realpath(sys.executable)
    proc = subprocess.run(["qemu-x86_64", "-cpu", "Haswell", python, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.skip(f"qemu could not run Python here: {proc.stderr.strip().splitlines()[-1:] if proc.stderr else proc.returncode}")
    wrong = dict(line.split() for line in proc.stdout.strip().splitlines())
    assert int(wrong["0"]) > 0, proc.stdout  # U8S8 on AVX2: saturated sums
    assert int(wrong["1"]) == 0, proc.stdout  # session.x64quantprecision=1: exact
