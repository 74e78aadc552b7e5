#!/usr/bin/env python3
"""Validate a TensorRT engine on the device against the reference outputs in this bundle.

Copied into every Jetson bundle as ``validate_on_device.py``. It is self-contained on purpose: it needs only numpy,
tensorrt and cuda-python (all on JetPack), not attn-export or torch. It runs ``model.engine`` on the inputs stored in
``reference.npz``, compares the outputs with the stored eager-PyTorch outputs, and prints the same figures as attn-
export's report: max_abs, mean_abs, rel_l2, cosine and sqnr_db per output, then latency p50/p90/p99 in ms. The first
line names the backend that ran. Without tensorrt it runs ONNX Runtime on ``model.onnx`` as a stand-in backend and says
so (useful to check the bundle itself on a workstation, meaningless for the engine).

First ``bundle.json`` and ``reference.npz`` are checked against each other and the model (each input stored, each
output with a reference and a tolerance of its own, the model's shapes, finite arrays). ``model.engine.layers.json``
is attested against bundle.json's ``expectation`` by ``engine_attest.py``: a GEMM wider than planned or attention
unfused is a FAIL line naming the layer (``--accept-engine-mismatch``: recorded).

Exit status: 0 every output is within its tolerance (and the engine attested); 1 one is not; 2 a setup or bundle error
(one line: no tensorrt nor onnxruntime, a truncated ``reference.npz``, an output without a tolerance...); 3 only the
ONNX Runtime stand-in ran (the engine was not checked), unless ``--allow-stand-in`` is given, which makes that 0 or 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

SQNR_CAP_DB = 300.0  # same cap as attn_export.validate.metrics
BUNDLE_SCHEMA = 2  # what attn_export.deploy.jetson_bundle writes
TOLERANCE_KEYS = ("max_abs", "rel_l2", "cosine_min")


class BundleError(Exception):
    """The bundle cannot be checked as it is (a missing, corrupted or inconsistent file): one line, exit 2."""


def accuracy(reference: np.ndarray, candidate: np.ndarray) -> dict:
    """max/mean abs error, relative L2, cosine and SQNR in float64 (attn-export's formulas)."""
    ref = np.asarray(reference, dtype=np.float64)
    out = np.asarray(candidate, dtype=np.float64)
    if ref.shape != out.shape:
        raise ValueError(f"shape mismatch: reference {ref.shape} vs candidate {out.shape}")
    if not np.all(np.isfinite(out)):
        nan = float("nan")
        return {"max_abs": nan, "mean_abs": nan, "rel_l2": nan, "cosine": nan, "sqnr_db": -SQNR_CAP_DB}
    err = np.abs(ref - out)
    ref_norm = float(np.linalg.norm(ref))
    rel = float(np.linalg.norm(ref - out)) / ref_norm if ref_norm > 0 else float(np.linalg.norm(out))
    a, b = ref.ravel(), out.ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    cos = 1.0 if na == 0.0 and nb == 0.0 else (0.0 if na == 0.0 or nb == 0.0 else float(np.dot(a, b) / (na * nb)))
    noise, signal = float(np.sum((ref - out) ** 2)), float(np.sum(ref * ref))
    if noise == 0.0:
        sqnr = SQNR_CAP_DB
    elif signal == 0.0:
        sqnr = -SQNR_CAP_DB
    else:
        sqnr = float(min(SQNR_CAP_DB, 10.0 * math.log10(signal / noise)))
    return {"max_abs": float(err.max(initial=0.0)), "mean_abs": float(err.mean()) if err.size else 0.0, "rel_l2": rel, "cosine": cos, "sqnr_db": sqnr}


def violations(acc: dict, tol: dict) -> list:
    if any(math.isnan(acc[k]) for k in ("max_abs", "rel_l2", "cosine")):
        return ["output contains NaN/Inf"]
    out = [f"{k} {acc[k]:.3g} > {tol[k]:.3g}" for k in ("max_abs", "rel_l2") if tol.get(k) is not None and acc[k] > tol[k]]
    if tol.get("cosine_min") is not None and acc["cosine"] < tol["cosine_min"]:
        out.append(f"cosine {acc['cosine']:.6f} < {tol['cosine_min']:.6f}")
    return out


def latency(samples_s: list, batch: int) -> dict:
    ms = np.asarray(samples_s, dtype=np.float64) * 1e3
    p50 = float(np.percentile(ms, 50))
    return {"p50": p50, "p90": float(np.percentile(ms, 90)), "p99": float(np.percentile(ms, 99)), "mean": float(ms.mean()),
            "repeats": int(ms.size), "throughput_per_s": (batch * 1e3 / p50) if p50 > 0 else 0.0}


def _one_line(err: object) -> str:
    return " ".join(str(err).split())[:300]  # a message from numpy or a runtime may span lines


def _names(meta: dict, key: str) -> list:
    names = meta.get(key)
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise BundleError(f"bundle.json {key!r} must be a non-empty list of distinct tensor names, got {names!r}: rebuild the bundle")
    return names


def _dims(meta: dict, key: str, names: list) -> dict:
    dims = meta.get(key)
    if not isinstance(dims, dict) or set(dims) != set(names):
        raise BundleError(f"bundle.json {key!r} must give the dims of exactly {names}, got {dims!r}; rebuild the bundle with attn-export")
    for name, d in dims.items():
        if not isinstance(d, list) or not all(x is None or isinstance(x, str) or (type(x) is int and x >= 0) for x in d):
            raise BundleError(f"bundle.json {key}[{name!r}] must be a list of sizes or axis names, got {d!r}")
    return dims


def _tolerance(name: str, tol: object) -> dict:
    if not isinstance(tol, dict) or not tol:
        raise BundleError(f"bundle.json has an empty tolerance for output {name!r}: a check with no bound passes anything; rebuild the bundle")
    for key, value in tol.items():
        lo, hi = (-1.0, 1.0) if key == "cosine_min" else (0.0, math.inf)
        if key not in TOLERANCE_KEYS or type(value) not in (int, float) or not lo <= value <= hi or math.isinf(value):
            raise BundleError(f"bundle.json tolerance of {name!r} has {key}={value!r}; expected finite {', '.join(TOLERANCE_KEYS)} (cosine_min in [-1, 1])")
    return {k: float(v) for k, v in tol.items()}


def check_meta(meta: object) -> dict:
    """bundle.json's schema, checked by hand: the device has numpy but not pydantic (attn-export's schemas)."""
    if not isinstance(meta, dict):
        raise BundleError(f"bundle.json must hold a JSON object, got {type(meta).__name__}")
    if meta.get("schema") != BUNDLE_SCHEMA:
        raise BundleError(f"bundle.json has schema {meta.get('schema')!r}; this validator reads schema {BUNDLE_SCHEMA}: rebuild the bundle with attn-export")
    inputs, outputs = _names(meta, "inputs"), _names(meta, "outputs")
    tols = meta.get("tolerances")
    if not isinstance(tols, dict):
        raise BundleError(f"bundle.json 'tolerances' must map every output to its tolerance, got {tols!r}")
    missing, extra = [o for o in outputs if o not in tols], sorted(set(tols) - set(outputs))
    if missing or extra:
        raise BundleError(f"bundle.json tolerances must cover exactly the outputs {outputs} (missing {missing}, not an output {extra}); every output is compared")
    for key, kind in (("precision", str), ("version_compatible", bool), ("attention_blocks", int), ("expectation", dict)):
        if meta.get(key) is not None and not isinstance(meta[key], kind):
            raise BundleError(f"bundle.json {key!r} must be a {kind.__name__}, got {meta[key]!r}")
    return {**meta, "input_dims": _dims(meta, "input_dims", inputs), "output_dims": _dims(meta, "output_dims", outputs),
            "tolerances": {o: _tolerance(o, tols[o]) for o in outputs}}


def _check_shape(what: str, shape: tuple, dims: list, bound: dict) -> None:
    """``shape`` against the model's ``dims``: the rank, every fixed size, and one size per axis name."""
    if len(shape) != len(dims) or any(type(d) is int and d > 0 and size != d for size, d in zip(shape, dims)):
        raise BundleError(f"{what} has shape {tuple(shape)}, the model's is {dims}: rebuild the bundle")
    for size, d in zip(shape, dims):
        if isinstance(d, str) and bound.setdefault(d, size) != size:
            raise BundleError(f"{what} has {d}={size} where the other tensors have {d}={bound[d]}: rebuild the bundle")


def load_reference(path: str, meta: dict) -> tuple:
    """(inputs, expected outputs) from reference.npz, each present, non-empty, finite and of the model's shape."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: np.asarray(npz[k]) for k in npz.files}
    except Exception as err:  # numpy raises zipfile, zlib, EOF, OS and value errors for a damaged archive
        raise BundleError(f"{path} cannot be read ({type(err).__name__}: {_one_line(err)}); it is truncated or not an .npz: copy the bundle again") from None
    want = [f"input/{n}" for n in meta["inputs"]] + [f"output/{n}" for n in meta["outputs"]]
    missing, extra = [k for k in want if k not in arrays], sorted(set(arrays) - set(want))
    if missing or extra:
        raise BundleError(f"{path} must hold exactly {want} (bundle.json's inputs and outputs), missing {missing}, extra {extra}: rebuild the bundle")
    bound: dict = {}
    for key in want:
        arr, kind = arrays[key], key.split("/", 1)[0]
        dims = meta[f"{kind}_dims"][key.split("/", 1)[1]]
        if arr.dtype.kind not in "biuf" or arr.size == 0:
            raise BundleError(f"{path}: {key} must be a non-empty numeric array, got {arr.dtype} of shape {arr.shape}: rebuild the bundle")
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            raise BundleError(f"{path}: {key} holds NaN/Inf values: rebuild the bundle")
        _check_shape(f"{path}: {key}", arr.shape, dims, bound)
    split = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("input/")}
    return split, {n: arrays[f"output/{n}"] for n in meta["outputs"]}


def check_backend(backend, meta: dict) -> None:
    """The model that runs has exactly the bundle's inputs and outputs: an output nobody compares is refused."""
    for kind in ("inputs", "outputs"):
        have, listed = list(backend.inputs if kind == "inputs" else backend.outputs), meta[kind]
        if set(have) != set(listed):
            raise BundleError(f"{backend.name} model has {kind} {have}, bundle.json lists {listed}: every {kind[:-1]} must be in both; "
                              "rebuild the bundle (or the engine from its model.onnx)")


def numpy_dtype(trt, name: str, dtype) -> np.dtype:
    """numpy dtype of an engine I/O tensor; bf16/fp8/fp4/int4 have none (trt.nptype raises TypeError)."""
    try:
        return np.dtype(trt.nptype(dtype))
    except TypeError:
        kind = getattr(dtype, "name", str(dtype))
        raise RuntimeError(f"engine I/O tensor {name!r} is {kind}, which numpy cannot hold; export the model with "
                           f"float32/float16 inputs and outputs") from None


class TensorRTBackend:
    name = "tensorrt"

    def __init__(self, engine_path: str, version_compatible: bool = False, device: int = 0) -> None:
        import tensorrt as trt

        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            from cuda import cudart
        self.trt, self.rt = trt, cudart
        self._ok(cudart.cudaSetDevice(device))  # deserialise and run on the GPU asked for
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        if version_compatible:
            # a --versionCompatible plan embeds its lean runtime; TensorRT refuses it unless allowed
            runtime.engine_host_code_allowed = True
        with open(engine_path, "rb") as f:
            self.engine = runtime.deserialize_cuda_engine(f.read())
        if self.engine is None:
            raise RuntimeError(f"TensorRT could not deserialise {engine_path}; rebuild it here with ./build_engine.sh")
        self.context = self.engine.create_execution_context()
        self.stream = self._ok(cudart.cudaStreamCreate())
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dtypes = {n: numpy_dtype(trt, n, self.engine.get_tensor_dtype(n)) for n in names}
        self.buffers: dict = {}

    def _ok(self, result):
        err, *vals = result
        if err != self.rt.cudaError_t.cudaSuccess:
            raise RuntimeError(f"CUDA error {err}")
        return vals[0] if vals else None

    def _buf(self, name: str, nbytes: int) -> int:
        ptr, cap = self.buffers.get(name, (0, 0))
        if cap < nbytes:
            if ptr:
                self._ok(self.rt.cudaFree(ptr))
            ptr, cap = int(self._ok(self.rt.cudaMalloc(max(nbytes, 1)))), max(nbytes, 1)
            self.buffers[name] = (ptr, cap)
        return ptr

    def infer(self, feed: dict) -> dict:
        h2d, d2h = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice, self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        hosts = []
        for n in self.inputs:
            host = np.ascontiguousarray(feed[n], dtype=self.dtypes[n])
            hosts.append(host)
            if not self.context.set_input_shape(n, host.shape):
                raise RuntimeError(f"shape {host.shape} for {n} is outside the engine's profile; rebuild with wider shapes")
            ptr = self._buf(n, host.nbytes)
            self._ok(self.rt.cudaMemcpyAsync(ptr, host.ctypes.data, host.nbytes, h2d, self.stream))
            self.context.set_tensor_address(n, ptr)
        outs = {n: np.empty(tuple(self.context.get_tensor_shape(n)), dtype=self.dtypes[n]) for n in self.outputs}
        for n, host in outs.items():
            self.context.set_tensor_address(n, self._buf(n, host.nbytes))
        if not self.context.execute_async_v3(stream_handle=int(self.stream)):
            raise RuntimeError("execute_async_v3 failed")
        for n, host in outs.items():
            self._ok(self.rt.cudaMemcpyAsync(host.ctypes.data, self.buffers[n][0], host.nbytes, d2h, self.stream))
        self._ok(self.rt.cudaStreamSynchronize(self.stream))
        return outs


class OnnxRuntimeBackend:
    name = "onnxruntime (stand-in)"

    def __init__(self, onnx_path: str) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
        self.types = {i.name: i.type for i in self.session.get_inputs()}
        self.inputs = list(self.types)
        self.outputs = [o.name for o in self.session.get_outputs()]

    def infer(self, feed: dict) -> dict:
        np_type = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int32)": np.int32, "tensor(int64)": np.int64, "tensor(bool)": np.bool_}
        cast = {n: np.asarray(feed[n]).astype(np_type.get(t, np.float32)) for n, t in self.types.items()}
        return dict(zip(self.outputs, self.session.run(None, cast)))


def _stand_in(args: argparse.Namespace, why: str):
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise SystemExit(f"error: {why}, and onnxruntime (the stand-in) is not installed either; "
                         "install JetPack's python3-libnvinfer, or pip install onnxruntime to check the bundle alone") from None
    print(f"backend: onnxruntime (stand-in): {why}; running ONNX Runtime on {args.onnx}: these figures check the bundle, not the engine")
    return OnnxRuntimeBackend(args.onnx)


def _backend(args: argparse.Namespace, meta: dict):
    want = args.backend
    if want in ("auto", "tensorrt"):
        try:
            import tensorrt  # noqa: F401
        except ImportError:
            if want == "tensorrt":
                raise SystemExit("error: tensorrt is not importable; install JetPack's python3-libnvinfer (or pip install tensorrt)") from None
            return _stand_in(args, "tensorrt is not installed")
        if not os.path.isfile(args.engine):
            raise SystemExit(f"error: engine {args.engine} does not exist; build it first with ./build_engine.sh")
        backend = TensorRTBackend(args.engine, bool(meta.get("version_compatible", False)), args.device)
        print(f"backend: tensorrt ({args.engine})")
        return backend
    return _stand_in(args, "--backend onnxruntime was asked for")


def attest(layers_json: str, meta: dict, accept: bool, passed: bool):
    """The engine's layer list against bundle.json's expectation, printed: (passed and attested, attestation dict or None)."""
    try:
        from engine_attest import attest_bundle  # shipped beside this script
    except ImportError:
        from attn_export.runtime.tensorrt.attest import attest_bundle  # run from the package
    try:
        att = attest_bundle(layers_json, meta.get("expectation"), "--accept-engine-mismatch" if accept else None)
    except (OSError, ValueError, KeyError, TypeError) as err:  # a damaged layer list or expectation
        raise BundleError(f"cannot attest the engine from {layers_json} ({_one_line(err)}); rebuild it with ./build_engine.sh") from None
    if att is None:
        return passed, None
    print("\n".join(att.report_lines()))
    return passed and att.passed, att.to_dict()


def _setup(args: argparse.Namespace) -> tuple:
    """bundle.json, reference.npz and the backend, each checked against the others; BundleError/SystemExit on a problem."""
    try:
        with open(args.bundle_json, encoding="utf-8") as f:
            meta = check_meta(json.load(f))
    except (OSError, ValueError) as err:
        raise BundleError(f"cannot read {args.bundle_json} ({_one_line(err)}); copy the bundle again") from None
    feed, expected = load_reference(args.reference, meta)
    try:
        backend = _backend(args, meta)
    except Exception as err:  # the runtime's own errors (a damaged model, a CUDA error) are one line here
        raise BundleError(f"the backend could not load the model: {type(err).__name__}: {_one_line(err)}") from None
    check_backend(backend, meta)
    return meta, feed, expected, backend


def _compare(meta: dict, expected: dict, got: dict) -> tuple:
    """Every output against its reference with its own tolerance: (passed, accuracy per output)."""
    passed, accs = True, {}
    for name, want in expected.items():
        if name not in got:
            raise BundleError(f"the backend returned no output {name!r} (it returned {sorted(got)})")
        out = np.asarray(got[name])
        if out.shape != want.shape:
            raise BundleError(f"output {name!r} has shape {out.shape} on this backend, the reference has {want.shape}: rebuild the bundle")
        acc = accuracy(want, out)
        bad = violations(acc, meta["tolerances"][name])
        passed &= not bad
        accs[name] = acc
        status = "PASS" if not bad else "FAIL (" + "; ".join(bad) + ")"
        print(f"{name}: {status} max_abs={acc['max_abs']:.3g} mean_abs={acc['mean_abs']:.3g} rel_l2={acc['rel_l2']:.3g} "
              f"cosine={acc['cosine']:.6f} sqnr={acc['sqnr_db']:.1f}dB")
    return passed, accs


def main(argv: list | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description="Compare a TensorRT engine with the bundle's reference outputs.")
    p.add_argument("--engine", default=os.path.join(here, "model.engine"))
    p.add_argument("--onnx", default=os.path.join(here, "model.onnx"))
    p.add_argument("--reference", default=os.path.join(here, "reference.npz"))
    p.add_argument("--bundle-json", default=os.path.join(here, "bundle.json"))
    p.add_argument("--backend", choices=("auto", "tensorrt", "onnxruntime"), default="auto")
    p.add_argument("--device", type=int, default=0, help="CUDA device index")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--json", default=None, help="also write the stage (report.json schema) here")
    p.add_argument("--allow-stand-in", action="store_true", help="exit 0/1 on the stand-in's figures instead of 3")
    p.add_argument("--accept-engine-mismatch", action="store_true", help="a GEMM wider than planned or attention unfused: recorded, not a failure")
    args = p.parse_args(argv)
    try:
        meta, feed, expected, backend = _setup(args)
        try:
            got = backend.infer(feed)
        except Exception as err:  # a shape outside the profile, a runtime error: the bundle does not fit the model
            raise BundleError(f"{backend.name} could not run the reference inputs: {type(err).__name__}: {_one_line(err)}") from None
        passed, accs = _compare(meta, expected, got)
        passed, attestation = attest(args.engine + ".layers.json", meta, args.accept_engine_mismatch, passed)
    except (SystemExit, BundleError) as err:
        print(err if isinstance(err, SystemExit) else f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    for _ in range(max(0, args.warmup)):
        backend.infer(feed)
    samples = []
    for _ in range(max(1, args.repeats)):
        t0 = time.perf_counter()
        backend.infer(feed)
        samples.append(time.perf_counter() - t0)
    batch = int(next(iter(feed.values())).shape[0]) if feed else 1
    lat = latency(samples, batch)
    print(f"latency_ms ({backend.name}): p50={lat['p50']:.3f} p90={lat['p90']:.3f} p99={lat['p99']:.3f} "
          f"mean={lat['mean']:.3f} repeats={lat['repeats']} throughput={lat['throughput_per_s']:.1f}/s")
    if args.json:
        worst = min(accs, key=lambda n: -math.inf if math.isnan(accs[n]["cosine"]) else accs[n]["cosine"])  # NaN is the worst
        stage = {"name": f"device-{backend.name.split()[0]}", "artifact": args.engine if backend.name == "tensorrt" else args.onnx,
                 "precision": meta.get("precision"), "accuracy": accs[worst], "latency_ms": {"artifact": lat},
                 "passed": passed, "tolerance": meta["tolerances"][worst],
                 "details": {"per_output": accs, "tolerances": meta["tolerances"], "worst_output": worst, "backend": backend.name,
                             "attestation": attestation}}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(stage, f, indent=2)
    stand_in = backend.name != "tensorrt"
    if stand_in and not args.allow_stand_in:
        print(f"{'PASS' if passed else 'FAIL'} on the stand-in only: the engine was not checked (exit 3; --allow-stand-in accepts it)")
        return 3
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
