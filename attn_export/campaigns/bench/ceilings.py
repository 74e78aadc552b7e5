"""The machine's GEMM ceilings, measured in the benchmark's own process and thread count.

A latency means little without the peak it could reach. Each ceiling is the best rate of a
large square matrix product in the libraries the variants actually run on:

* fp32: ``torch.matmul`` (oneDNN/MKL, used by eager) and ONNX Runtime ``MatMul`` (MLAS);
* fp16: ``torch.matmul`` in half precision and ONNX Runtime ``MatMul`` in float16;
* int8: ``torch._int_mm`` (int8 x int8 -> int32, what int8 eager kernels reduce to) and ONNX
  Runtime ``MatMulInteger`` (uint8 x int8 -> int32, the kernel behind ORT's dynamic and
  QOperator int8 and behind QDQ graphs after ORT fuses them).

The ceiling of a precision is the best of its measurements (the machine's demonstrated peak),
and every measurement is kept in the JSON. Figures are GFLOP/s (GOP/s for int8), 2 per MAC.

Two things keep an efficiency from passing 100% (issue 23 saw 232%):

* The second operand is a constant initializer, as a model's weights are. ONNX Runtime
  prepacks a constant ``B`` once (MLAS packed GEMM; ``MatMulInteger`` and the int8 kernels
  ORT fuses Q/DQ into take that path), and a ceiling timed with ``B`` as a graph input
  measured the unpacked path: ~25-35% below what the int8 models themselves ran at here
  (MatMulInteger 1024^3, 2 threads: 999-1324 GOP/s with ``B`` an input, 1344-1594 constant).
* ``for_precision`` is the best rate among the precisions a variant's products can run in:
  a half-precision graph on a CPU runs part or all of them in fp32 (ONNX Runtime's CPU EP
  casts around ops without fp16 kernels, and fp16 GEMM is no faster than fp32 without fp16
  arithmetic), and an int8 graph keeps its attention products (Q K^T, P V) in fp32. Judging
  such a variant against the fp16 or int8 rate alone can put it above "its" peak.

The int8 ceiling is ONNX Runtime's ``MatMulInteger`` alone: every int8 variant the bench
efficiency column judges runs on it, and ``torch._int_mm`` says nothing about it (on an AVX2
CPU without VNNI it measured 2 GOP/s, which made every efficiency figure meaningless). The
torch figure is still recorded, as ``int8.torch``, for reference.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["RUNS_IN", "Ceilings", "gemm_model", "measure_ceilings"]

log = logging.getLogger(__name__)

# What a variant of each precision may run its matrix products in (see the module docstring).
RUNS_IN: dict[str, tuple[str, ...]] = {"fp32": ("fp32",), "fp16": ("fp16", "fp32"), "int8": ("int8", "fp32")}


@dataclass
class Ceilings:
    """Best GEMM rate per precision, plus each library's measurement and the problem size."""

    fp32_gflops: float
    fp16_gflops: float
    int8_gops: float
    measurements: dict[str, float | None] = field(default_factory=dict)  # "fp32.torch" -> GFLOP/s
    size: int = 0
    threads: int = 0
    unavailable: dict[str, str] = field(default_factory=dict)

    def for_precision(self, precision: str) -> float:
        """The fastest measured rate among the precisions a ``precision`` variant's products can run in (NaN if none)."""
        rates = {"fp32": self.fp32_gflops, "fp16": self.fp16_gflops, "int8": self.int8_gops}
        finite = [rates[p] for p in RUNS_IN[precision] if math.isfinite(rates[p])]
        return max(finite) if finite else float("nan")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def merged(self, other: Ceilings) -> Ceilings:
        """Best of two measurements (e.g. at the start and the end of a run on a busy machine)."""
        meas = {k: max((v for v in (self.measurements.get(k), other.measurements.get(k)) if v), default=None)
                for k in {**self.measurements, **other.measurements}}  # fmt: skip
        return _from_measurements(meas, self.size, self.threads, {**other.unavailable, **self.unavailable})


def _rate(fn: Callable[[], object], flops: float, budget_s: float) -> float:
    fn()  # warm-up: kernel selection, page faults
    best = float("inf")
    start = time.perf_counter()
    runs = 0
    while runs < 3 or (time.perf_counter() - start < budget_s and runs < 50):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return flops / best / 1e9  # best run: a ceiling is what the machine *can* do


def gemm_model(n: int, a_type: int, b_type: int, op: str) -> tuple[Any, dict[str, np.ndarray]]:
    """A one-node ``op`` graph Y = A x B with ``B`` a constant initializer (prepacked like a model's weights), and its feed."""
    import onnx
    import onnx.helper as oh
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    np_type = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16}
    if op == "MatMulInteger":
        a, b = rng.integers(0, 255, (n, n), dtype=np.uint8), rng.integers(-127, 127, (n, n), dtype=np.int8)
    else:
        a, b = (rng.standard_normal((n, n)).astype(np_type[t]) for t in (a_type, b_type))
    out_type = onnx.TensorProto.INT32 if op == "MatMulInteger" else a_type
    graph = oh.make_graph(
        [oh.make_node(op, ["A", "B"], ["Y"])], "gemm", [oh.make_tensor_value_info("A", a_type, [n, n])],
        [oh.make_tensor_value_info("Y", out_type, [n, n])], initializer=[numpy_helper.from_array(b, "B")],
    )  # fmt: skip
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), {"A": a}


def _ort_matmul(tmp: Path, n: int, a_type: int, b_type: int, op: str, threads: int) -> Callable[[], object]:
    # A one-node graph built with onnx.helper: the smallest way to time one ORT kernel.
    import onnx
    import onnxruntime as ort

    model, feed = gemm_model(n, a_type, b_type, op)
    path = tmp / f"{op}_{a_type}.onnx"
    onnx.save(model, path)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feed)


def _from_measurements(meas: dict[str, float | None], size: int, threads: int, unavailable: dict[str, str]) -> Ceilings:
    def best(prefix: str, exclude: tuple[str, ...] = ()) -> float:
        vals = [v for k, v in meas.items() if k.startswith(prefix) and k not in exclude and v]
        return max(vals) if vals else float("nan")

    int8 = best("int8.", exclude=("int8.torch",))  # what ONNX Runtime's int8 kernels can do on this CPU
    return Ceilings(best("fp32."), best("fp16."), int8, dict(sorted(meas.items())), size, threads, unavailable)


def measure_ceilings(threads: int, size: int = 2048, budget_s: float = 1.0) -> Ceilings:
    """Measure every GEMM ceiling at ``size`` x ``size`` with ``threads`` threads."""
    import onnx

    torch.set_num_threads(threads)
    flops = 2.0 * size**3
    meas: dict[str, float | None] = {}
    unavailable: dict[str, str] = {}
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    ai = torch.randint(-127, 127, (size, size), dtype=torch.int8, generator=g)
    bi = torch.randint(-127, 127, (size, size), dtype=torch.int8, generator=g)
    with tempfile.TemporaryDirectory(prefix="attn-ceil-") as tmp:
        cases: dict[str, Callable[[], Callable[[], object]]] = {
            "fp32.torch": lambda: lambda: torch.matmul(a, b),
            "fp32.onnxruntime": lambda: _ort_matmul(Path(tmp), size, onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT, "MatMul", threads),
            "fp16.torch": lambda: partial(torch.matmul, a.half(), b.half()),
            "fp16.onnxruntime": lambda: _ort_matmul(Path(tmp), size, onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT16, "MatMul", threads),
            "int8.torch": lambda: lambda: torch._int_mm(ai, bi),
            "int8.onnxruntime": lambda: _ort_matmul(Path(tmp), size, onnx.TensorProto.UINT8, onnx.TensorProto.INT8, "MatMulInteger", threads),
        }
        with torch.inference_mode():
            for key, make in cases.items():
                try:
                    meas[key] = round(_rate(make(), flops, budget_s), 2)
                except Exception as err:  # noqa: BLE001 - a kernel this build lacks (e.g. ORT fp16 MatMul on CPU)
                    meas[key] = None
                    unavailable[key] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:160] if str(err).strip() else ''}"
                    log.info("ceiling %s unavailable: %s", key, unavailable[key])

    c = _from_measurements(meas, size, threads, unavailable)
    log.info("ceilings: fp32 %.1f GFLOP/s, fp16 %.1f GFLOP/s, int8 %.1f GOP/s", c.fp32_gflops, c.fp16_gflops, c.int8_gops)
    return c
