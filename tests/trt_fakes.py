"""Strict TensorRT doubles, generated from the real bindings' manifests in ``fixtures/trt/``.

``fake_tensorrt("10.14.1.48.post1")`` returns a module that answers exactly to the API of
that version, as ``tools/trt_manifest.py`` recorded it from the PyPI wheel:

* a name the version lacks (module attribute, class attribute, instance attribute, enum
  member) raises AttributeError, as pybind11 does; setting a read-only or unknown property
  raises AttributeError too;
* enums are ``IntEnum``s with the real members and values (``STRONGLY_TYPED`` is 1 on
  10.x and 0 on 11.x, ``BuilderFlag.FP16`` does not exist on 11.x);
* every call into a class the project uses is checked against the recorded docstring
  signature(s): positional count, keyword names, and enum-typed parameters (a
  ``ProfilingVerbosity`` where ``LayerInformationFormat`` is expected is a TypeError);
* ``nptype`` answers as the real one does, raising TypeError for bf16/fp8/fp4/int4.

Behaviour (what a build returns, what deserialisation does) lives in small ``_Behaviour``
classes below and is steered by a ``World``: a failing parser, a build returning None, a
timing cache TensorRT refuses, ``get_timing_cache()`` returning None, an engine whose
deserialisation returns None. A version-compatible plan deserialises to None unless
``engine_host_code_allowed`` is set, and a plan records the CUDA device current at build
time (``World.current_device``, shared with ``fake_cudart``). A method the manifest has but
no behaviour class implements raises NotImplementedError, so a test never passes by
accident.

``unknown_flags(argv, "11.0")`` checks a trtexec command line against the option list that
``tools/trt_manifest.py trtexec`` recorded from that release's sampleOptions.cpp.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import json
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

MANIFESTS = Path(__file__).parent / "fixtures" / "trt"
TRTEXEC_FIXTURES = Path(__file__).parent / "fixtures" / "trtexec"
TRTEXEC_VERSIONS = ("10.3", "10.14", "11.0")
_PLAN = b"FAKE-TRT-PLAN\n"
_CACHE = b"FAKE-TRT-TIMING-CACHE\n"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("post")[0])[:4])


@functools.cache
def manifest_versions() -> tuple[str, ...]:
    """Every recorded bindings version, oldest first (e.g. ``10.3.0`` ... ``11.4.0.106``)."""
    names = [p.name[len("trt-"):-len(".json")] for p in MANIFESTS.glob("trt-*.json")]
    return tuple(sorted(names, key=_key))


@functools.cache
def load_manifest(version: str) -> dict[str, Any]:
    return json.loads((MANIFESTS / f"trt-{version}.json").read_text())


def major_minor(version: str) -> tuple[int, int]:
    k = _key(version)
    return k[0], k[1]


# --- signatures ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Param:
    name: str
    annotation: str
    has_default: bool


def _split_top(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(<{":
            depth += 1
        elif ch in "])>}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


@functools.cache
def _parse_sig(sig: str) -> tuple[_Param, ...] | None:
    """Parameters of ``name(self: X, a: int, b: T = d) -> R``; None for ``(*args, **kwargs)``."""
    m = re.match(r"^[\w.]+\((.*)\)(?:\s*->.*)?$", sig)
    if not m or "*args" in m.group(1):
        return None
    params = []
    for part in _split_top(m.group(1)):
        if part in ("/", "*"):
            continue
        head, _, default = part.partition("=")
        name, _, annotation = head.partition(":")
        params.append(_Param(name.strip(), annotation.strip(), bool(default.strip())))
    if params and params[0].name in ("self", "this"):
        params = params[1:]
    return tuple(params)


def _matches(params: tuple[_Param, ...], args: tuple, kwargs: dict, enum_of: Callable[[str], type | None]) -> str | None:
    """None when the call fits ``params``; else why not."""
    if len(args) > len(params):
        return f"{len(args)} positional arguments, the signature takes {len(params)}"
    bound: dict[str, Any] = {}
    for p, a in zip(params, args):
        bound[p.name] = a
    for k, v in kwargs.items():
        if k not in {p.name for p in params}:
            return f"unexpected keyword {k!r}"
        if k in bound:
            return f"{k!r} given twice"
        bound[k] = v
    for p in params:
        if p.name not in bound and not p.has_default:
            return f"missing argument {p.name!r}"
        if p.name in bound:
            want = enum_of(p.annotation)
            if want is not None and not isinstance(bound[p.name], want):
                return f"{p.name!r} must be {p.annotation}, got {bound[p.name]!r}"
    return None


# --- the world the fakes act in ---------------------------------------------------------


@dataclass
class World:
    """What the fake TensorRT and cudart do; tests flip these and read ``calls``."""

    devices: list[tuple[str, int, int]] = field(default_factory=lambda: [("NVIDIA H200", 9, 0), ("NVIDIA L4", 8, 9)])
    current_device: int = 0
    cuda_runtime: int = 12060  # cudaRuntimeGetVersion: 1000 * major + 10 * minor (CUDA Runtime API, Version Management)
    parser_errors: list[tuple[str, str, str]] = field(default_factory=list)  # (node name, op, message)
    build_returns_none: bool = False
    fused_attention: bool = True
    inspector: dict[str, Any] | None = None  # the detailed layer list the engine inspector returns (a recorded fixture)
    timing_cache_refused: bool = False  # set_timing_cache returns False for a cache read from a file
    timing_cache_none: bool = False  # get_timing_cache returns None after the build
    deserialize_returns_none: bool = False
    io_dtype: str | None = None  # override every engine I/O type (e.g. "BF16")
    compute: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def record(self, what: str, value: Any = None) -> None:
        self.calls.append((what, value))

    def called(self, what: str) -> list[Any]:
        return [v for w, v in self.calls if w == what]


# --- strict classes -----------------------------------------------------------------------


class _StrictMeta(type):
    """Class-level access (``trt.Logger.WARNING``) and construction, checked against the manifest."""

    def __getattribute__(cls, name: str) -> Any:
        if name.startswith("_"):
            return type.__getattribute__(cls, name)
        spec = type.__getattribute__(cls, "_trt_attrs")
        module = type.__getattribute__(cls, "_trt_module")
        if name not in spec:
            raise AttributeError(f"type object '{cls.__name__}' has no attribute '{name}' (TensorRT {module.__version__})")
        resolved = module._resolve(spec[name])
        if resolved is not _UNRESOLVED:
            return resolved
        return type.__getattribute__(cls, name)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        module = type.__getattribute__(cls, "_trt_module")
        qual = type.__getattribute__(cls, "_trt_name")
        module._check_call(qual, "__init__", args, kwargs)
        obj = cls.__new__(cls)
        object.__setattr__(obj, "_props", {})
        obj._construct(*args, **kwargs)
        return obj


_UNRESOLVED = object()


class _Strict:
    """Instance access checked against the manifest class (pybind11's behaviour)."""

    _trt_attrs: dict[str, str] = {}
    _trt_name = ""
    _trt_module: Any = None
    _defaults: dict[str, Any] = {}

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_"):
            return object.__getattribute__(self, name)
        cls = type(self)
        code = cls._trt_attrs.get(name)
        module = cls._trt_module
        if code is None:
            raise AttributeError(f"'{cls._trt_name}' object has no attribute '{name}' (TensorRT {module.__version__})")
        resolved = module._resolve(code)
        if resolved is not _UNRESOLVED:
            return resolved
        if code in ("p", "pw"):
            props = object.__getattribute__(self, "_props")
            if name in props:
                return props[name]
            if name in cls._defaults:
                return cls._defaults[name]
            try:
                return object.__getattribute__(self, name)
            except AttributeError:
                raise NotImplementedError(f"the fake {cls._trt_name}.{name} has no value; add it to tests/trt_fakes.py") from None
        try:
            fn = object.__getattribute__(self, name)
        except AttributeError:
            raise NotImplementedError(f"the fake {cls._trt_name}.{name} is not implemented; add it to tests/trt_fakes.py") from None

        def checked(*args: Any, **kwargs: Any) -> Any:
            module._check_call(cls._trt_name, name, args, kwargs)
            return fn(*args, **kwargs)

        return checked

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        cls = type(self)
        code = cls._trt_attrs.get(name)
        if code is None:
            raise AttributeError(f"'{cls._trt_name}' object has no attribute '{name}' (TensorRT {cls._trt_module.__version__})")
        if code != "pw":
            raise AttributeError(f"property '{name}' of '{cls._trt_name}' object has no setter")
        self._props[name] = value
        cls._trt_module._world.record(f"{cls._trt_name}.{name}", value)

    def _construct(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"the fake {type(self)._trt_name} cannot be constructed; add _construct to tests/trt_fakes.py")


# --- behaviour ----------------------------------------------------------------------------


class _Logger:
    def _construct(self, min_severity: Any = None) -> None:
        self._props["min_severity"] = min_severity


class _Builder:
    def _construct(self, logger: Any) -> None:
        self._logger = logger

    def create_network(self, flags: int = 0) -> Any:
        self._trt_module._world.record("create_network", flags)
        return self._trt_module._make("INetworkDefinition", flags=int(flags))

    def create_builder_config(self) -> Any:
        return self._trt_module._make("IBuilderConfig")

    def create_optimization_profile(self) -> Any:
        return self._trt_module._make("IOptimizationProfile")

    def build_serialized_network(self, network: Any, config: Any) -> Any:
        trt, world = self._trt_module, self._trt_module._world
        world.record("build", {"device": world.current_device})
        if world.build_returns_none:
            return None
        if config._cache is not None:
            config._cache._entries += 1  # the build timed something
        header = {
            "trt": trt.__version__, "device": world.current_device, "flags": sorted(config._flags),
            "network_flags": network._flags, "fused": world.fused_attention,
            "verbosity": getattr(config._props.get("profiling_verbosity"), "name", "LAYER_NAMES_ONLY"),  # TensorRT's default
            "io": [[t._props["name"], "INPUT", t._dtype, list(t._props["shape"])] for t in network._inputs]
            + [[t._props["name"], "OUTPUT", t._dtype, list(t._props["shape"])] for t in network._outputs],
            "profiles": config._profiles, "dla_core": config._props.get("DLA_core"),
        }
        return trt._make("IHostMemory", data=_PLAN + json.dumps(header).encode())


class _Network:
    def _init(self, flags: int) -> None:
        self._flags, self._inputs, self._outputs = flags, [], []

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def get_input(self, index: int) -> Any:
        return self._inputs[index]

    def get_output(self, index: int) -> Any:
        return self._outputs[index]


class _Tensor:
    def _init(self, name: str, shape: tuple[int, ...], dtype: str) -> None:
        self._props.update(name=name, shape=tuple(shape))
        self._dtype = dtype


_ONNX_TO_TRT = {"FLOAT": "FLOAT", "FLOAT16": "HALF", "BFLOAT16": "BF16", "INT32": "INT32", "INT64": "INT64", "BOOL": "BOOL", "INT8": "INT8", "UINT8": "UINT8"}


class _OnnxParser:
    def _construct(self, network: Any, logger: Any) -> None:
        self._network, self._errors = network, []

    def parse_from_file(self, model: str) -> bool:
        import onnx

        world = self._trt_module._world
        if world.parser_errors:
            self._errors = [self._trt_module._make("ParserError", node=i, node_name=n, op=o, desc=d) for i, (n, o, d) in enumerate(world.parser_errors)]
            return False
        proto = onnx.load(model, load_external_data=False)
        inits = {t.name for t in proto.graph.initializer}

        def tensor(vi: Any) -> Any:
            tt = vi.type.tensor_type
            shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
            dtype = _ONNX_TO_TRT[onnx.TensorProto.DataType.Name(tt.elem_type)]
            return self._trt_module._make("ITensor", name=vi.name, shape=shape, dtype=dtype)

        self._network._inputs = [tensor(vi) for vi in proto.graph.input if vi.name not in inits]
        self._network._outputs = [tensor(vi) for vi in proto.graph.output]
        return True

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index: int) -> Any:
        return self._errors[index]


class _ParserError:
    def _init(self, node: int, node_name: str, op: str, desc: str) -> None:
        self._node, self._name, self._op, self._desc = node, node_name, op, desc

    def desc(self) -> str:
        return self._desc

    def node(self) -> int:
        return self._node

    def node_name(self) -> str:
        return self._name

    def node_operator(self) -> str:
        return self._op


class _BuilderConfig:
    _defaults = {"builder_optimization_level": 3}

    def _init(self) -> None:
        self._flags: set[str] = set()
        self._profiles: list[dict] = []
        self._pools: dict[str, int] = {}
        self._cache: Any = None

    def set_flag(self, flag: Any) -> None:
        self._flags.add(flag.name)
        self._trt_module._world.record("set_flag", flag.name)

    def get_flag(self, flag: Any) -> bool:
        return flag.name in self._flags

    def set_memory_pool_limit(self, pool: Any, pool_size: int) -> None:
        self._pools[pool.name] = int(pool_size)
        self._trt_module._world.record("set_memory_pool_limit", (pool.name, int(pool_size)))

    def add_optimization_profile(self, profile: Any) -> int:
        self._profiles.append(profile._shapes)
        self._trt_module._world.record("add_optimization_profile", profile._shapes)
        return len(self._profiles) - 1

    def create_timing_cache(self, serialized_timing_cache: Any) -> Any:
        blob = bytes(serialized_timing_cache)
        trt = self._trt_module
        trt._world.record("create_timing_cache", blob)
        if not blob:
            return trt._make("ITimingCache", origin="fresh", device=trt._world.current_device, entries=0, version=trt.__version__)
        if not blob.startswith(_CACHE):
            return None  # not a timing cache TensorRT can read
        meta = json.loads(blob[len(_CACHE):])
        return trt._make("ITimingCache", origin="file", **meta)

    def set_timing_cache(self, cache: Any, ignore_mismatch: bool) -> bool:
        world, trt = self._trt_module._world, self._trt_module
        world.record("set_timing_cache", {"origin": cache._origin, "ignore_mismatch": ignore_mismatch})
        if cache._origin == "file" and (world.timing_cache_refused or cache._version != trt.__version__):
            return False
        if cache._device != world.current_device and not ignore_mismatch:
            return False  # "A failure will be reported if the CUDA device property ... is different"
        self._cache = cache
        return True

    def get_timing_cache(self) -> Any:
        return None if self._trt_module._world.timing_cache_none else self._cache


class _Profile:
    def _init(self) -> None:
        self._shapes: dict[str, list[list[int]]] = {}

    def set_shape(self, input: str, min: Any, opt: Any, max: Any) -> None:  # noqa: A002 - TensorRT's names
        self._shapes[input] = [list(min), list(opt), list(max)]


class _TimingCache:
    def _init(self, origin: str, device: int, entries: int, version: str) -> None:
        self._origin, self._device, self._entries, self._version = origin, device, entries, version

    def serialize(self) -> Any:
        meta = {"device": self._device, "entries": self._entries, "version": self._version}
        return self._trt_module._make("IHostMemory", data=_CACHE + json.dumps(meta).encode())


class _Runtime:
    _defaults = {"engine_host_code_allowed": False}

    def _construct(self, logger: Any) -> None:
        self._logger = logger

    def deserialize_cuda_engine(self, serialized_engine: Any) -> Any:
        trt, world = self._trt_module, self._trt_module._world
        blob = bytes(serialized_engine)
        world.record("deserialize", {"device": world.current_device, "host_code_allowed": self.engine_host_code_allowed})
        if world.deserialize_returns_none or not blob.startswith(_PLAN):
            return None
        header = json.loads(blob[len(_PLAN):])
        if "VERSION_COMPATIBLE" in header["flags"]:
            if not self.engine_host_code_allowed:
                return None  # the plan embeds a lean runtime: refused unless host code is allowed
        elif header["trt"] != trt.__version__:
            return None
        return trt._make("ICudaEngine", header=header)


class _Engine:
    def _init(self, header: dict) -> None:
        self._header = header
        dtype = self._trt_module._world.io_dtype
        self._io = [(n, mode, dtype or dt, tuple(shape)) for n, mode, dt, shape in header["io"]]

    def create_engine_inspector(self) -> Any:
        return self._trt_module._make("EngineInspector", engine=self)

    def create_execution_context(self, strategy: Any = None) -> Any:
        return self._trt_module._make("IExecutionContext", engine=self)

    @property
    def num_io_tensors(self) -> int:
        return len(self._io)

    def _find(self, name: str) -> tuple:
        for entry in self._io:
            if entry[0] == name:
                return entry
        raise RuntimeError(f"no tensor {name!r}")

    def get_tensor_name(self, index: int) -> str:
        return self._io[index][0]

    def get_tensor_mode(self, name: str) -> Any:
        return getattr(self._trt_module.TensorIOMode, self._find(name)[1])

    def get_tensor_dtype(self, name: str) -> Any:
        return getattr(self._trt_module.DataType, self._find(name)[2])

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self._find(name)[3]

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple[int, ...]]:
        shapes = self._header["profiles"][profile_index][name]
        return [tuple(s) for s in shapes]

    @property
    def num_optimization_profiles(self) -> int:
        return max(1, len(self._header["profiles"]))


class _Inspector:
    """What ``get_*_information`` returns follows the build's profiling verbosity, as the docs say: names only by
    default, the detailed layer list (``World.inspector``, else one attention layer) with ``DETAILED``, nothing with ``NONE``."""

    def _init(self, engine: Any) -> None:
        self._engine = engine

    def _layers(self) -> list[Any]:
        header, world = self._engine._header, self._trt_module._world
        if header["verbosity"] == "NONE":
            return []
        fused = header["fused"]
        detailed = (world.inspector or {}).get("Layers") or [
            {"Name": "_gemm_mha_v2_myl0_1" if fused else "node_softmax", "LayerType": "gemm" if fused else "kgen", "Inputs": [], "Outputs": [],
             "TacticName": "_gemm_mha_v2_0x1" if fused else "__myl_Softmax_0x1", "StreamId": 0, "Metadata": ""}]  # fmt: skip
        return detailed if header["verbosity"] == "DETAILED" else [layer["Name"] for layer in detailed]

    def _text(self, layers: list[Any], format: Any) -> str:  # noqa: A002 - TensorRT's name
        if format.name == "ONELINE":
            return "".join(f"{layer if isinstance(layer, str) else layer['Name']}\n" for layer in layers)
        return json.dumps({"Layers": layers, "Bindings": [n for n, *_ in self._engine._io]})

    def get_engine_information(self, format: Any) -> str:  # noqa: A002 - TensorRT's name
        return self._text(self._layers(), format)

    def get_layer_information(self, layer_index: int, format: Any) -> str:  # noqa: A002 - TensorRT's name
        layers = self._layers()
        if not 0 <= layer_index < len(layers):
            return ""  # the C++ API returns nullptr for an index out of range
        layer = layers[layer_index]
        if format.name == "JSON":
            return json.dumps(layer)
        return layer if isinstance(layer, str) else layer["Name"]


class _Context:
    def _init(self, engine: Any) -> None:
        self._engine, self._shapes, self._addr, self._profile = engine, {}, {}, 0

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        if not 0 <= profile_index < self._engine.num_optimization_profiles:
            return False  # TensorRT logs an error and returns false for an index the engine lacks
        self._profile = int(profile_index)
        self._shapes.clear()  # input shapes are per profile: the caller sets them again
        self._trt_module._world.record("set_optimization_profile_async", int(profile_index))
        return True

    def set_input_shape(self, name: str, shape: Any) -> bool:
        lo, _, hi = self._engine.get_tensor_profile_shape(name, self._profile) if any(d < 0 for d in self._engine._find(name)[3]) else [self._engine._find(name)[3]] * 3
        shape = tuple(shape)
        if len(shape) != len(lo) or any(s < a or s > b for s, a, b in zip(shape, lo, hi)):
            return False
        self._shapes[name] = shape
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        if name in self._shapes:
            return self._shapes[name]
        first = next(iter(self._shapes.values()))
        return first  # outputs take the first input's shape (y = f(x) elementwise)

    def set_tensor_address(self, name: str, memory: int) -> bool:
        self._addr[name] = int(memory)
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        world, trt = self._trt_module._world, self._trt_module
        feeds = {}
        for name, mode, dt, _ in self._engine._io:
            dtype = np.dtype(trt.nptype(getattr(trt.DataType, dt)))
            shape = self.get_tensor_shape(name)
            n = int(np.prod(shape)) * dtype.itemsize
            buf = (ctypes.c_char * n).from_address(self._addr[name])
            feeds[name] = (np.frombuffer(buf, dtype).reshape(shape), mode)
        outs = (world.compute or (lambda ins: {k: 2 * v for k, v in ins.items()}))({k: v for k, (v, m) in feeds.items() if m == "INPUT"})
        for (name, (arr, mode)), value in zip([(k, v) for k, v in feeds.items() if v[1] == "OUTPUT"], outs.values()):
            arr[...] = value
        return True


class _HostMemory(bytes):
    """IHostMemory: a buffer (``memoryview`` works), with ``nbytes``."""

    @property
    def nbytes(self) -> int:
        return len(self)


_BEHAVIOUR: dict[str, type] = {
    "Logger": _Logger, "Builder": _Builder, "INetworkDefinition": _Network, "ITensor": _Tensor, "OnnxParser": _OnnxParser,
    "ParserError": _ParserError, "IBuilderConfig": _BuilderConfig, "IOptimizationProfile": _Profile, "ITimingCache": _TimingCache,
    "Runtime": _Runtime, "ICudaEngine": _Engine, "EngineInspector": _Inspector, "IExecutionContext": _Context,
    "IHostMemory": _HostMemory,
}


# --- the module ---------------------------------------------------------------------------


def _nptype_of(manifest: dict[str, Any]) -> Callable[[Any], Any]:
    table = manifest["nptype"]

    def nptype(trt_type: Any) -> Any:
        name = table.get(getattr(trt_type, "name", ""), None)
        if name is None:
            raise TypeError("Could not resolve TensorRT datatype to an equivalent numpy datatype.")
        return np.dtype(name).type

    return nptype


class FakeTensorRT(types.ModuleType):
    """A ``tensorrt`` module built from one manifest (see the module docstring)."""

    def __init__(self, version: str, world: World | None = None) -> None:
        super().__init__("tensorrt")
        self._manifest = load_manifest(version)
        self._world = world or World()
        self._enums: dict[str, type] = {}
        self._classes: dict[str, type] = {}
        self._functions = {"nptype": _nptype_of(self._manifest)}

    @property
    def __version__(self) -> str:  # type: ignore[override]
        return self._manifest["__version__"]

    # names ------------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        m = self._manifest
        if name in m["enums"]:
            return self._enum(name)
        if name in m["classes"]:
            return self._class(name)
        if name in m["functions"]:
            if name in self._functions:
                fn = self._functions[name]

                def checked(*args: Any, **kwargs: Any) -> Any:
                    self._check_call(None, name, args, kwargs)
                    return fn(*args, **kwargs)

                return checked
            raise NotImplementedError(f"the fake tensorrt.{name}() is not implemented; add it to tests/trt_fakes.py")
        if name in m["values"]:
            resolved = self._resolve(m["values"][name])
            if resolved is not _UNRESOLVED:
                return resolved
        raise AttributeError(f"module 'tensorrt' ({self.__version__}) has no attribute '{name}'")

    def _enum(self, qual: str) -> type:
        if qual not in self._enums:
            members = self._manifest["enums"][qual]
            self._enums[qual] = enum.IntEnum(qual.rsplit(".", 1)[-1], members)  # type: ignore[misc]
        return self._enums[qual]

    def _class(self, qual: str) -> type:
        if qual not in self._classes:
            spec = self._manifest["classes"][qual]
            behaviour = _BEHAVIOUR.get(qual)
            bases = (behaviour, _Strict) if behaviour is not None else (_Strict,)
            if behaviour is _HostMemory:
                bases = (_Strict, _HostMemory)
            ns = {"_trt_attrs": spec["attrs"], "_trt_name": qual, "_trt_module": self, "_defaults": getattr(behaviour, "_defaults", {})}
            self._classes[qual] = _StrictMeta(qual.rsplit(".", 1)[-1], bases, ns)
        return self._classes[qual]

    def _resolve(self, code: str) -> Any:
        if code.startswith("ev:"):
            target, _, _value = code[3:].partition("=")
            qual, _, member = target.rpartition(".")
            return self._enum(qual)[member]
        if code.startswith("e:"):
            return self._enum(code[2:])
        if code.startswith("c:"):
            return self._class(code[2:])
        return _UNRESOLVED

    def _make(self, qual: str, data: bytes | None = None, **state: Any) -> Any:
        """An instance created by TensorRT itself (no Python constructor involved)."""
        cls = self._class(qual)
        obj = bytes.__new__(cls, data) if data is not None else object.__new__(cls)
        object.__setattr__(obj, "_props", {})
        if hasattr(cls, "_init"):
            obj._init(**state)
        return obj

    # calls ------------------------------------------------------------------------------

    def _enum_for(self, annotation: str) -> type | None:
        name = annotation.split("::")[-1].strip()
        return self._enum(name) if name in self._manifest["enums"] else None

    def _check_call(self, qual: str | None, name: str, args: tuple, kwargs: dict) -> None:
        sigs = self._manifest["functions"].get(name, []) if qual is None else self._manifest["signatures"].get(f"{qual}.{name}")
        if sigs is None:
            raise NotImplementedError(f"no recorded signature for {qual}.{name}; add {qual} to SIGNED in tools/trt_manifest.py")
        parsed = [p for p in (_parse_sig(s) for s in sigs) if p is not None]
        if not parsed:
            return
        why = [_matches(p, args, kwargs, self._enum_for) for p in parsed]
        if all(w is not None for w in why):
            where = f"{qual}.{name}" if qual else name
            raise TypeError(f"{where}(): incompatible function arguments ({'; '.join(w for w in why if w)}); TensorRT {self.__version__} has: {' | '.join(sigs)}")


def fake_cudart(world: World) -> types.SimpleNamespace:
    """cuda-python's runtime calls that attn-export makes, with host memory standing in for the GPU.

    Each returns ``(cudaError_t, *values)`` as cuda-python does; a name not listed here
    raises AttributeError (SimpleNamespace).
    """
    memory: dict[int, ctypes.Array] = {}

    def set_device(device: int) -> tuple:
        if not 0 <= device < len(world.devices):
            return (1,)
        world.current_device = device
        world.record("cudaSetDevice", device)
        return (0,)

    def properties(device: int) -> tuple:
        name, major, minor = world.devices[device]
        return 0, types.SimpleNamespace(name=name.encode() + b"\x00", major=major, minor=minor)

    def malloc(n: int) -> tuple:
        buf = ctypes.create_string_buffer(n)
        memory[ctypes.addressof(buf)] = buf
        return 0, ctypes.addressof(buf)

    def memcpy(dst: int, src: int, n: int, kind: int, stream: int) -> tuple:
        ctypes.memmove(dst, src, n)
        return (0,)

    rt = types.SimpleNamespace(
        cudaError_t=types.SimpleNamespace(cudaSuccess=0), cudaSetDevice=set_device, cudaGetDeviceProperties=properties,
        cudaMalloc=malloc, cudaFree=lambda p: ((memory.pop(int(p), None), 0)[1],),
        cudaMemcpyKind=types.SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2), cudaMemcpyAsync=memcpy,
        cudaStreamCreate=lambda: (0, 7), cudaStreamSynchronize=lambda s: (0,), cudaStreamDestroy=lambda s: (0,),
        cudaRuntimeGetVersion=lambda: (0, world.cuda_runtime),
    )
    rt._memory = memory
    return rt


def install(monkeypatch: Any, version: str, world: World | None = None) -> FakeTensorRT:
    """Put the fake ``tensorrt`` (and cuda-python's runtime) where the project imports them from."""
    world = world or World()
    trt = FakeTensorRT(version, world)
    rt = fake_cudart(world)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    cuda = types.ModuleType("cuda")
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = rt  # type: ignore[attr-defined]
    cuda.bindings = bindings  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", rt)
    trt._cudart = rt
    return trt


# --- trtexec's recorded command line ------------------------------------------------------


@functools.cache
def trtexec_options(version: str) -> dict[str, Any]:
    """The option list of trtexec ``version`` (``fixtures/trtexec/``, from its sampleOptions.cpp)."""
    return json.loads((TRTEXEC_FIXTURES / f"trtexec-{version}.json").read_text())


def unknown_flags(cmd: list[str], version: str) -> list[str]:
    """Flags (and values of the options whose values are recorded) that trtexec ``version`` does not parse."""
    known = trtexec_options(version)
    problems = []
    for arg in cmd[1:]:
        flag, _, value = arg.partition("=")
        if flag not in known["options"]:
            problems.append(flag)
        elif flag in known["values"]:
            accepted = {v.lower() for v in known["values"][flag]}  # sampleOptions compares lower-cased
            token = value.split(":", 1)[0] if flag == "--memPoolSize" else value
            if token.lower() not in accepted:
                problems.append(arg)
    return problems
