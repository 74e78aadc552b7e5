"""ONNX Runtime runner (``SessionFromOnnx`` + ``OrtRunner``), with explicit providers.

CPU is the default. CUDA and TensorRT execution providers are used only when asked for,
and asking for one that this onnxruntime build lacks is an error naming the package to
install, never a silent fall-back to CPU.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from attn_export.errors import ConfigError, MissingDependencyError
from attn_export.runtime.base import Feed, Runner

__all__ = ["PROVIDER_ALIASES", "PROVIDER_PACKAGES", "ProviderSpec", "SessionFromOnnx", "OrtRunner", "available_providers"]

log = logging.getLogger(__name__)

PROVIDER_ALIASES: dict[str, str] = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}

# What to install for a provider this onnxruntime build lacks (the stand-in's reason names it).
PROVIDER_PACKAGES: dict[str, str] = {
    "CUDAExecutionProvider": "onnxruntime-gpu on a CUDA machine",
    "TensorrtExecutionProvider": "onnxruntime-gpu with the TensorRT libraries on a CUDA machine",
}


def available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


@dataclass(frozen=True)
class ProviderSpec:
    """Provider options for GPU execution providers (ignored on CPU).

    ``fp16`` enables TensorRT EP fp16 kernels; ``engine_cache_dir`` lets the TensorRT EP
    reuse engines across sessions; ``workspace_bytes`` bounds TensorRT/cuDNN scratch.
    """

    fp16: bool = False
    engine_cache_dir: str | None = None
    workspace_bytes: int | None = None
    device_id: int = 0

    def options_for(self, provider: str) -> dict[str, Any]:
        if provider == "TensorrtExecutionProvider":
            opts: dict[str, Any] = {"device_id": self.device_id, "trt_fp16_enable": self.fp16}
            if self.engine_cache_dir:
                opts.update(trt_engine_cache_enable=True, trt_engine_cache_path=self.engine_cache_dir)
                opts.update(trt_timing_cache_enable=True, trt_timing_cache_path=self.engine_cache_dir)
            if self.workspace_bytes:
                opts["trt_max_workspace_size"] = int(self.workspace_bytes)
            return opts
        if provider == "CUDAExecutionProvider":
            opts = {"device_id": self.device_id}
            if self.workspace_bytes:
                opts["gpu_mem_limit"] = int(self.workspace_bytes)
            return opts
        return {}


def _resolve(providers: list[str] | tuple[str, ...] | None) -> list[str]:
    names = [PROVIDER_ALIASES.get(p, p) for p in (providers or ["cpu"])]
    have = available_providers()
    for name in names:
        if name not in have:
            if name in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
                raise MissingDependencyError(f"ONNX Runtime provider {name}", "onnxruntime-gpu", extra="gpu")
            raise ConfigError(f"unknown ONNX Runtime provider {name!r}; available: {', '.join(have)}")
    return names


class SessionFromOnnx:
    """Lazy loader: calling it builds an ``onnxruntime.InferenceSession`` (Polygraphy naming)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        providers: list[str] | tuple[str, ...] | None = None,
        intra_op_threads: int | None = None,
        inter_op_threads: int = 1,
        provider_spec: ProviderSpec | None = None,
        graph_optimization: str = "all",
        disabled_optimizers: tuple[str, ...] | None = None,
        flush_denormals: bool = True,
        allow_spinning: bool = False,
        cpu_mem_arena: bool = True,
        qdq_fusion: bool = True,
        u8u8: bool = False,
    ) -> None:
        self.path = str(path)
        self.providers = _resolve(providers)
        self.intra_op_threads = intra_op_threads
        self.inter_op_threads = inter_op_threads
        self.provider_spec = provider_spec or ProviderSpec()
        self.graph_optimization = graph_optimization
        # ORT 1.32's fused SkipLayerNormalization CPU kernel is ~5x slower than the Add +
        # LayerNormalization it replaces on this layer (docs/quantization.md); off on CPU.
        if disabled_optimizers is None:
            disabled_optimizers = ("SkipLayerNormFusion",) if self.providers == ["CPUExecutionProvider"] else ()
        # Q/DQ as written also means keeping a Relu in front of a QuantizeLinear: ORT's
        # "ReluQuantRewrite" (qdq_transformer/relu_quantizelinear.cc) removes the Relu unless the
        # zero point is an int8 -128 or a uint8 0, so it drops it before a float8 Q (zero point
        # 0.0), which turns FP8 FFN2 inputs negative (tests/compress/test_fp8.py).
        if not qdq_fusion and "ReluQuantRewrite" not in disabled_optimizers:
            disabled_optimizers = (*disabled_optimizers, "ReluQuantRewrite")
        self.disabled_optimizers = tuple(disabled_optimizers)
        # The padding-mask bias drives exp() in Softmax into denormals, which run ~8x slower.
        self.flush_denormals = flush_denormals
        # Spinning pool threads steal the core from whatever runs next (e.g. eager, when timed
        # side by side); a deployment that owns the machine may turn it back on.
        self.allow_spinning = allow_spinning
        # The arena keeps a session's peak memory resident after a run; benchmarks that hold
        # many sessions and measure each inference's own peak turn it off.
        self.cpu_mem_arena = cpu_mem_arena
        # False runs Q/DQ nodes as written ("session.disable_quant_qdq", onnxruntime_session_options_config_keys.h):
        # the reference arithmetic TensorRT implements, which no CPU int8 kernel (or its
        # VPMADDUBSW saturation on CPUs without VNNI) can distort. Used to judge TensorRT's Q/DQ graphs.
        self.qdq_fusion = qdq_fusion
        # True runs int8 GEMMs on ORT's U8U8 kernel ("session.x64quantprecision"): exact on x86 CPUs
        # without VNNI, where the default U8S8 kernel saturates (compress/int8_encoding.py).
        self.u8u8 = u8u8

    def __call__(self) -> Any:
        import onnxruntime as ort

        if not os.path.isfile(self.path):
            raise ConfigError(f"ONNX model {self.path} does not exist; export it first")
        so = ort.SessionOptions()
        if self.intra_op_threads:
            so.intra_op_num_threads = int(self.intra_op_threads)
        so.inter_op_num_threads = int(self.inter_op_threads)
        so.log_severity_level = 3
        so.graph_optimization_level = {
            "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.graph_optimization]
        so.enable_cpu_mem_arena = self.cpu_mem_arena
        if self.flush_denormals:
            so.add_session_config_entry("session.set_denormal_as_zero", "1")
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if self.allow_spinning else "0")
        if not self.qdq_fusion:
            so.add_session_config_entry("session.disable_quant_qdq", "1")
        if self.u8u8:
            so.add_session_config_entry("session.x64quantprecision", "1")
        providers = [(p, self.provider_spec.options_for(p)) for p in self.providers]
        kwargs = {"disabled_optimizers": list(self.disabled_optimizers)} if self.disabled_optimizers else {}
        try:
            return ort.InferenceSession(self.path, sess_options=so, providers=providers, **kwargs)
        except Exception as err:  # a TensorRT-only op or a float type ORT has no kernels for (bf16): emulate it, else re-raise
            import onnx

            from attn_export.export.forms.trt_packed import decomposed_twin, has_trt_attention
            from attn_export.runtime.emulate import emulated_model, needs_emulation

            proto = onnx.load(self.path)
            twin = has_trt_attention(proto)
            if twin:  # TensorRT 11's packed IAttention: its decomposed twin (export/forms/trt_packed.py) runs the same numbers
                proto, _ = decomposed_twin(proto)
            emulate = needs_emulation(proto)
            if emulate is None and not twin:
                raise
            log.debug("%s: %s; running %s", self.path, str(err).splitlines()[0],
                      " and ".join(([f"fp32 with {emulate} rounding"] if emulate else []) + (["its decomposed twin"] if twin else [])))
            if emulate is not None:
                proto = emulated_model(proto, emulate)
            return ort.InferenceSession(proto.SerializeToString(), sess_options=so, providers=providers, **kwargs)


class OrtRunner(Runner):
    """Runs an ONNX model through ONNX Runtime; IO by name, dtypes cast to what the graph wants."""

    name = "onnxruntime"

    def __init__(self, session_loader: SessionFromOnnx | Any, name: str | None = None) -> None:
        super().__init__()
        self._loader = session_loader
        self.session: Any = None
        if name:
            self.name = name

    def _activate(self) -> None:
        self.session = self._loader() if callable(self._loader) else self._loader
        self._input_types = {i.name: i.type for i in self.session.get_inputs()}
        self._output_names = [o.name for o in self.session.get_outputs()]
        from attn_export.host.process import reapply_denormal_flush

        reapply_denormal_flush()  # a new session resets this thread's FTZ flag

    def _deactivate(self) -> None:
        self.session = None

    @property
    def input_names(self) -> list[str]:
        self.activate()
        return list(self._input_types)

    @property
    def output_names(self) -> list[str]:
        self.activate()
        return list(self._output_names)

    def _infer(self, feed: Feed) -> dict[str, np.ndarray]:
        # The calling thread's denormal flag is the process context's (attn_export.host.process), the same
        # for eager and ONNX Runtime; the session flushes its own pool threads.
        cast = {n: np.ascontiguousarray(np.asarray(feed[n]).astype(_np_type(t), copy=False)) for n, t in self._input_types.items()}
        outs = self.session.run(None, cast)
        return dict(zip(self._output_names, outs))


_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
}


def _np_type(ort_type: str) -> Any:
    return _ORT_TYPES.get(ort_type, np.float32)
