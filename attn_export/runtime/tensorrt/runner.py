"""Load a TensorRT engine safely and run it with the same ``infer`` contract as ONNX Runtime.

``TrtRunner(EngineFromPath("model.engine"))`` selects the GPU (``cudaSetDevice``), deserialises
the engine only after its sidecar says it was built for this GPU and TensorRT version
(opting into the embedded lean runtime of a version-compatible engine), picks the smallest
optimization profile that holds the batch when the engine has several (length buckets:
``targets.length_buckets.choose_profile``), sets input shapes (refusing shapes outside every
profile with the profiles in the message), binds buffers with
``set_tensor_address`` and runs ``execute_async_v3``. Device memory goes through
cuda-python, so a Jetson needs neither torch nor pycuda; torch tensors are accepted when
torch is installed (CUDA tensors are bound in place, without a copy).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attn_export.host.lazy import require
from attn_export.errors import EngineError, MissingDependencyError
from attn_export.runtime.base import Feed, Runner
from attn_export.targets.length_buckets import choose_profile
from attn_export.runtime.tensorrt.sidecar import (
    EngineSidecar,
    check_compatible,
    read_sidecar,
    verify_engine_file,
)

__all__ = [
    "deserialize",
    "EngineFromPath",
    "TrtRunner",
    "load_engine",
    "ensure_runnable",
    "check_shape_in_profile",
    "gpu_identity",
    "select_device",
    "cudart",
    "io_numpy_dtype",
]

log = logging.getLogger(__name__)


def cudart() -> Any:
    """cuda-python's runtime module (``cuda.bindings.runtime``, or ``cuda.cudart`` before 12.6)."""
    try:
        from cuda.bindings import runtime  # type: ignore[import-not-found]

        return runtime
    except ImportError:
        try:
            from cuda import cudart as runtime  # type: ignore[import-not-found,no-redef]

            return runtime
        except ImportError as err:
            raise MissingDependencyError("cuda-python (CUDA runtime bindings)", "cuda-python", extra="gpu") from err


def _check(result: Any) -> Any:
    """cuda-python calls return (err, *values): raise on error, return the value(s)."""
    err, *values = result if isinstance(result, tuple) else (result,)
    rt = cudart()
    if err != rt.cudaError_t.cudaSuccess:
        raise EngineError(f"CUDA call failed: {err}; check the GPU and driver (nvidia-smi)")
    return values[0] if len(values) == 1 else tuple(values)


def select_device(device: int = 0) -> None:
    """Make ``device`` current: TensorRT builds and deserialises on the current device
    (trtexec calls ``cudaSetDevice`` first too: release/10.3 samples/common/sampleDevice.cpp)."""
    if device < 0:
        raise EngineError(f"expected a CUDA device index >= 0, got {device}")
    _check(cudart().cudaSetDevice(device))


def gpu_identity(device: int = 0) -> tuple[str, str]:
    """(GPU name, compute capability "major.minor") of ``device`` through cuda-python."""
    rt = cudart()
    prop = _check(rt.cudaGetDeviceProperties(device))
    name = prop.name.decode(errors="replace") if isinstance(prop.name, bytes) else str(prop.name)
    return name.strip("\x00 ").strip(), f"{prop.major}.{prop.minor}"


def check_shape_in_profile(name: str, shape: Sequence[int], lo: Sequence[int], hi: Sequence[int]) -> None:
    """Raise EngineError when ``shape`` is outside the engine's [min, max] profile for ``name``."""
    if len(shape) != len(lo) or any(s < a or s > b for s, a, b in zip(shape, lo, hi)):
        raise EngineError(
            f"input {name!r} shape {tuple(shape)} is outside the engine's profile min {tuple(lo)} max {tuple(hi)}; "
            f"pad/split the batch or rebuild with a wider --min-shape/--max-shape"
        )


def ensure_runnable(path: str | os.PathLike[str], sidecar: EngineSidecar, trt_version: str, gpu: str, cc: str) -> None:
    """Raise EngineError saying "rebuild on the target" when the sidecar does not match this machine."""
    problems = check_compatible(sidecar, trt_version, gpu, cc)
    if problems:
        raise EngineError(
            f"engine {path} cannot run here: {'; '.join(problems)}; rebuild it on the target "
            f"(or build with --hardware-compatibility ampere+ / --version-compatible)"
        )


def load_engine(path: str | os.PathLike[str], device: int = 0) -> Any:
    """Deserialise ``path`` after checking its sidecar against this GPU and TensorRT."""
    sidecar = read_sidecar(path)
    verify_engine_file(path, sidecar)
    trt = require("tensorrt", "tensorrt", what="TensorRT", extra="gpu")
    select_device(device)
    gpu, cc = gpu_identity(device)
    ensure_runnable(path, sidecar, trt.__version__, gpu, cc)
    return deserialize(trt, Path(path).read_bytes(), sidecar.version_compatible, str(path))


def deserialize(trt: Any, blob: bytes | memoryview | Any, version_compatible: bool, what: str) -> Any:
    """``Runtime.deserialize_cuda_engine`` with the opt-in a version-compatible plan needs.

    Such a plan embeds its lean runtime, and TensorRT returns None unless the application
    allows host code (trtexec: ``setEngineHostCodeAllowed(true)``, release/10.3
    samples/common/sampleEngines.cpp). The engine was built by us from a checked sidecar,
    so we allow it for those engines only.
    """
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    if version_compatible:
        runtime.engine_host_code_allowed = True
    engine = runtime.deserialize_cuda_engine(blob)
    if engine is None:
        raise EngineError(f"TensorRT could not deserialise {what} (see the TensorRT log above); rebuild it on this machine")
    return engine


def io_numpy_dtype(trt: Any, name: str, dtype: Any) -> np.dtype:
    """numpy dtype of an engine I/O tensor; EngineError for types numpy lacks (bf16, fp8, fp4, int4)."""
    try:
        return np.dtype(trt.nptype(dtype))
    except TypeError:
        kind = getattr(dtype, "name", str(dtype))
        raise EngineError(
            f"engine I/O tensor {name!r} is {kind}, which has no numpy type, so TrtRunner cannot feed or read it; "
            f"export the model with float32/float16 inputs and outputs (keep {kind} inside the graph)"
        ) from None


class EngineFromPath:
    """Lazy loader: calling it returns the checked, deserialised engine (Polygraphy naming)."""

    def __init__(self, path: str | os.PathLike[str], device: int = 0) -> None:
        self.path = os.fspath(path)
        self.device = device

    def __call__(self) -> Any:
        return load_engine(self.path, self.device)


class TrtRunner(Runner):
    """Runs a TensorRT engine; IO by name, the smallest profile holding each batch, buffers grown on demand.

    With length-bucketed profiles, sort texts by length within the window you allow and cut
    batches first (``targets.length_buckets.batch_order``): each batch then lands on the profile
    tuned for its length. The batch is run at its own shape (padded to its longest text).
    """

    name = "tensorrt"

    def __init__(self, engine_loader: EngineFromPath | Any, name: str | None = None, device: int | None = None) -> None:
        super().__init__()
        self._loader = engine_loader
        self._device = getattr(engine_loader, "device", 0) if device is None else device
        if name:
            self.name = name

    def _activate(self) -> None:
        self._trt = require("tensorrt", "tensorrt", what="TensorRT", extra="gpu")
        self._rt = cudart()
        select_device(self._device)  # streams, buffers and the context live on the engine's GPU
        self.engine = self._loader() if callable(self._loader) else self._loader
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise EngineError("could not create a TensorRT execution context (out of GPU memory?)")
        self.stream = _check(self._rt.cudaStreamCreate())
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == self._trt.TensorIOMode.INPUT for n in names}
        self._inputs = [n for n in names if is_input[n]]
        self._outputs = [n for n in names if not is_input[n]]
        self._dtypes = {n: io_numpy_dtype(self._trt, n, self.engine.get_tensor_dtype(n)) for n in names}
        count = int(self.engine.num_optimization_profiles)
        self._all_profiles = [{n: self._profile(n, i) for n in self._inputs} for i in range(count)]
        self._active = 0  # a new context starts on profile 0
        self._buffers: dict[str, tuple[int, int]] = {}  # name -> (device pointer, capacity bytes)

    def _profile(self, name: str, index: int = 0) -> tuple[tuple[int, ...], ...]:
        """(min, opt, max) of profile ``index``; a static input's own shape three times."""
        shape = tuple(self.engine.get_tensor_shape(name))
        if all(d >= 0 for d in shape):
            return shape, shape, shape
        return tuple(tuple(s) for s in self.engine.get_tensor_profile_shape(name, index))  # type: ignore[return-value]

    def _use_profile_for(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], ...]]:
        """Switch the context to the smallest profile holding ``shapes``; returns that profile's shapes."""
        if len(self._all_profiles) == 1:
            return self._all_profiles[0]
        index = choose_profile(shapes, self._all_profiles)
        if index is None:
            ranges = "; ".join(f"profile {i}: " + ", ".join(f"{n} {tuple(p[n][0])}..{tuple(p[n][2])}" for n in p) for i, p in enumerate(self._all_profiles))
            raise EngineError(f"no optimization profile of the engine holds shapes {shapes} ({ranges}); split the batch or rebuild with a larger --length-buckets")
        if index != self._active:
            # IExecutionContext::setOptimizationProfileAsync switches on the given stream and returns false for a bad index
            if not self.context.set_optimization_profile_async(index, int(self.stream)):
                raise EngineError(f"TensorRT refused to switch to optimization profile {index}; see the TensorRT log")
            self._active = index
        return self._all_profiles[index]

    def _deactivate(self) -> None:
        for ptr, _ in self._buffers.values():
            self._rt.cudaFree(ptr)
        self._buffers.clear()
        self._rt.cudaStreamDestroy(self.stream)
        self.context = None
        self.engine = None

    @property
    def active_profile(self) -> int:
        """The optimization profile the last batch ran on (0 before the first, and for a one-profile engine)."""
        self.activate()
        return self._active

    @property
    def input_names(self) -> list[str]:
        self.activate()
        return list(self._inputs)

    @property
    def output_names(self) -> list[str]:
        self.activate()
        return list(self._outputs)

    def _device_buffer(self, name: str, nbytes: int) -> int:
        ptr, cap = self._buffers.get(name, (0, 0))
        if cap < nbytes:
            if ptr:
                _check(self._rt.cudaFree(ptr))
            ptr, cap = int(_check(self._rt.cudaMalloc(max(nbytes, 1)))), max(nbytes, 1)
            self._buffers[name] = (ptr, cap)
        return ptr

    def _infer(self, feed: Feed) -> dict[str, np.ndarray]:
        rt, h2d, d2h = self._rt, self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice, self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        missing = [n for n in self._inputs if n not in feed]
        if missing:
            raise EngineError(f"missing inputs {missing}; the engine takes {self._inputs}")
        keep_alive = []
        profile = self._use_profile_for({n: tuple(int(s) for s in feed[n].shape) for n in self._inputs})
        for n in self._inputs:
            value: Any = feed[n]
            lo, _, hi = profile[n]
            shape = tuple(int(s) for s in value.shape)
            check_shape_in_profile(n, shape, tuple(lo), tuple(hi))
            if not self.context.set_input_shape(n, shape):
                raise EngineError(f"TensorRT refused shape {shape} for input {n!r}; see the TensorRT log")
            if _is_cuda_tensor(value):  # torch CUDA tensor: bind its memory directly
                value = value.to(_torch_dtype(self._dtypes[n])).contiguous()
                keep_alive.append(value)
                self.context.set_tensor_address(n, int(value.data_ptr()))
                continue
            host = np.ascontiguousarray(_to_numpy(value), dtype=self._dtypes[n])
            keep_alive.append(host)
            ptr = self._device_buffer(n, host.nbytes)
            _check(rt.cudaMemcpyAsync(ptr, host.ctypes.data, host.nbytes, h2d, self.stream))
            self.context.set_tensor_address(n, ptr)
        if any(_is_cuda_tensor(v) for v in keep_alive):
            import torch

            torch.cuda.current_stream().synchronize()  # torch produced those inputs on its own stream
        results: dict[str, np.ndarray] = {}
        for n in self._outputs:
            shape = tuple(self.context.get_tensor_shape(n))
            results[n] = np.empty(shape, dtype=self._dtypes[n])
            self.context.set_tensor_address(n, self._device_buffer(n, results[n].nbytes))
        if not self.context.execute_async_v3(stream_handle=int(self.stream)):
            raise EngineError("execute_async_v3 failed; see the TensorRT log above")
        for n, host in results.items():
            _check(rt.cudaMemcpyAsync(host.ctypes.data, self._buffers[n][0], host.nbytes, d2h, self.stream))
        _check(rt.cudaStreamSynchronize(self.stream))
        return results


def _is_cuda_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and getattr(value, "is_cuda", False)


def _to_numpy(value: Any) -> np.ndarray:
    if type(value).__module__.startswith("torch"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _torch_dtype(dtype: np.dtype) -> Any:
    import torch

    return {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16, np.dtype(np.int32): torch.int32,
            np.dtype(np.int64): torch.int64, np.dtype(np.bool_): torch.bool, np.dtype(np.int8): torch.int8}[np.dtype(dtype)]
