#!/usr/bin/env python3
"""Validate a TensorRT engine on the device against the reference outputs in this bundle.

Copied into every Jetson bundle as ``validate_on_device.py``. It is self-contained on
purpose: it needs only numpy, tensorrt and cuda-python (all on JetPack), not attn-export
or torch. It runs ``model.engine`` on the inputs stored in ``reference.npz``, compares the
outputs with the stored eager-PyTorch outputs, and prints the same figures as
attn-export's report: max_abs, mean_abs, rel_l2, cosine and sqnr_db per output, then
latency p50/p90/p99 in ms. The first line names the backend that ran.

Without tensorrt it runs ONNX Runtime on ``model.onnx`` as a stand-in backend and says so
(useful to check the bundle itself on a workstation, meaningless for the engine).

Exit status: 0 the engine is within tolerance; 1 outside it; 2 setup error (one line, e.g.
neither tensorrt nor onnxruntime is installed); 3 only the ONNX Runtime stand-in ran (the
engine was not checked), unless ``--allow-stand-in`` is given, which makes that 0 or 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time

import numpy as np

SQNR_CAP_DB = 300.0  # same cap as attn_export.validate.metrics


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
    out = []
    if tol.get("max_abs") is not None and acc["max_abs"] > tol["max_abs"]:
        out.append(f"max_abs {acc['max_abs']:.3g} > {tol['max_abs']:.3g}")
    if tol.get("rel_l2") is not None and acc["rel_l2"] > tol["rel_l2"]:
        out.append(f"rel_l2 {acc['rel_l2']:.3g} > {tol['rel_l2']:.3g}")
    if tol.get("cosine_min") is not None and acc["cosine"] < tol["cosine_min"]:
        out.append(f"cosine {acc['cosine']:.6f} < {tol['cosine_min']:.6f}")
    return out


def latency(samples_s: list, batch: int) -> dict:
    ms = np.asarray(samples_s, dtype=np.float64) * 1e3
    p50 = float(np.percentile(ms, 50))
    return {"p50": p50, "p90": float(np.percentile(ms, 90)), "p99": float(np.percentile(ms, 99)), "mean": float(ms.mean()),
            "repeats": int(ms.size), "throughput_per_s": (batch * 1e3 / p50) if p50 > 0 else 0.0}


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


def fused_attention_layers(layers_json: str) -> int | None:
    """Count fused MHA kernels in trtexec's --exportLayerInfo output (None if absent)."""
    if not os.path.isfile(layers_json):
        return None
    with open(layers_json, encoding="utf-8") as f:
        info = json.load(f)
    pattern = re.compile(r"(_mha_|mha_v\d|fmha|flash_?attn|flash_?attention|fused_?mha|cask\w*attention)", re.I)
    layers = info.get("Layers", []) if isinstance(info, dict) else info
    texts = [json.dumps(layer) if isinstance(layer, dict) else str(layer) for layer in layers]
    return sum(1 for t in texts if pattern.search(t))


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
    args = p.parse_args(argv)
    try:
        with open(args.bundle_json, encoding="utf-8") as f:
            meta = json.load(f)
        ref = np.load(args.reference, allow_pickle=False)
        feed = {k.split("/", 1)[1]: ref[k] for k in ref.files if k.startswith("input/")}
        expected = {k.split("/", 1)[1]: ref[k] for k in ref.files if k.startswith("output/")}
        backend = _backend(args, meta)
    except SystemExit as err:
        print(err, file=sys.stderr)
        return 2
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    tol = meta.get("tolerance", {})
    got = backend.infer(feed)
    passed, accs = True, {}
    for i, (name, want) in enumerate(expected.items()):
        out = got[name] if name in got else list(got.values())[i]
        acc = accuracy(want, out)
        bad = violations(acc, tol)
        passed &= not bad
        accs[name] = acc
        status = "PASS" if not bad else "FAIL (" + "; ".join(bad) + ")"
        print(f"{name}: {status} max_abs={acc['max_abs']:.3g} mean_abs={acc['mean_abs']:.3g} rel_l2={acc['rel_l2']:.3g} "
              f"cosine={acc['cosine']:.6f} sqnr={acc['sqnr_db']:.1f}dB")
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
    fused = fused_attention_layers(args.engine + ".layers.json")
    if fused is not None:
        print(f"fused attention kernels in the engine: {fused} (attention blocks in the model: {meta.get('attention_blocks', '?')})")
    if args.json:
        first = next(iter(accs.values())) if accs else None
        stage = {"name": f"device-{backend.name.split()[0]}", "artifact": args.engine if backend.name == "tensorrt" else args.onnx,
                 "precision": meta.get("precision"), "accuracy": first, "latency_ms": {"artifact": lat},
                 "passed": passed, "tolerance": tol, "details": {"per_output": accs, "backend": backend.name}}
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
