#!/usr/bin/env python3
"""Record the real TensorRT Python API of each supported version as a JSON manifest.

Why: no GPU is available to this project's CI, so every TensorRT call only ever meets test
doubles. Hand-written doubles accept whatever the code asks for; doubles generated from a
record of the real bindings refuse an attribute, method, keyword or enum member that the
version lacks. This script makes that record.

How: the ``tensorrt-cu12-bindings`` wheels on PyPI are pybind11 modules that need only a
handful of native entry points to import. A C file of stubs (``createInferBuilder_INTERNAL``
and friends, all returning null) is compiled with the system C compiler into
``libnvinfer.so.N``, ``libnvonnxparser.so.N`` and ``libnvinfer_plugin.so.N`` in a temporary
directory; each wheel is downloaded with pip, unpacked, and imported in a subprocess with
``LD_LIBRARY_PATH`` pointing at the stubs. Nothing is ever built or run with them: the
subprocess only walks the module (classes, their attributes and method signatures, enums
and their integer values, module functions, ``nptype`` per ``DataType``) and prints JSON.

    python tools/trt_manifest.py                      # the default versions -> tests/fixtures/trt/
    python tools/trt_manifest.py --versions 10.13.3.9.post1 --out /tmp/m
    python tools/trt_manifest.py trtexec --git-dir TensorRT/   # trtexec option lists -> tests/fixtures/trtexec/

This is the only part of the project that downloads anything; the test suite reads the
committed manifests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# Supported versions (the bindings' own version strings on PyPI). 10.3 = JetPack 6;
# 10.7 = the last 10.x with DLA; 10.8/10.9 = API additions the code branches on; 10.14 =
# the first with the ONNX Attention importer, and its only wheel carries ".post1";
# 11.0 = strong typing only; 11.4 = the newest 11.x on PyPI when this was written.
DEFAULT_VERSIONS = ("10.3.0", "10.7.0.post1", "10.8.0.43", "10.9.0.34", "10.14.1.48.post1", "11.0.0.114", "11.4.0.106")
PACKAGES = ("tensorrt-cu12-bindings", "tensorrt-cu13-bindings")  # cu12 first; 11.x also exists as cu12 so far
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# Classes the project calls into: every method of these gets its docstring signature line
# recorded, so the strict fakes can check positional counts and keyword names.
SIGNED = ("Builder", "IBuilderConfig", "INetworkDefinition", "ITensor", "OnnxParser", "ParserError", "IOptimizationProfile",
          "ITimingCache", "IHostMemory", "Runtime", "ICudaEngine", "IExecutionContext", "EngineInspector", "Logger", "ILogger")
OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "trt"

STUBS = {
    "libnvinfer": """
void* createInferBuilder_INTERNAL(void* logger, int version) { return 0; }
void* createInferRuntime_INTERNAL(void* logger, int version) { return 0; }
void* createInferRefitter_INTERNAL(void* engine, void* logger, int version) { return 0; }
int getInferLibVersion(void) { return 0; }
void* getPluginRegistry(void) { return 0; }
void* getBuilderPluginRegistry(int capability) { return 0; }
""",
    "libnvonnxparser": """
void* createNvOnnxParser_INTERNAL(void* network, void* logger, int version) { return 0; }
void* createNvOnnxParserRefitter_INTERNAL(void* refitter, void* logger, int version) { return 0; }
int getNvOnnxParserVersion(void) { return 0; }
""",
    "libnvinfer_plugin": """
int initLibNvInferPlugins(void* logger, const char* ns) { return 1; }
""",
}

# Runs inside the subprocess, with the unpacked wheel on sys.path and the stubs loadable.
INTROSPECT = r'''
import enum, inspect, json, sys
import importlib
trt = importlib.import_module(sys.argv[1])

def is_enum(obj):
    return isinstance(obj, type) and hasattr(obj, "__members__") and all(
        isinstance(v, obj) for v in obj.__members__.values())

def sig_lines(name, doc):
    out = []
    for line in (doc or "").splitlines():
        line = line.strip()
        if line[:1].isdigit() and ". " in line[:4]:
            line = line.split(". ", 1)[1]
        if line.startswith(name + "(") and line not in out:
            out.append(line)
    return out

def py_sig(name, fn):
    try:
        return [name + str(inspect.signature(fn))]
    except (TypeError, ValueError):
        return sig_lines(name, getattr(fn, "__doc__", ""))

KEEP_DUNDER = ("__init__", "__len__", "__getitem__", "__iter__", "__enter__", "__exit__", "__int__", "__index__")
SIGNED = set(sys.argv[2].split(","))
signatures = {}
SKIP = set(dir(object)) | {"__members__", "__entries", "__dict__", "__module__", "__weakref__", "_pybind11_conduit_v1_"}
enums, classes = {}, {}

def enum_record(obj):
    return {name: int(member) for name, member in obj.__members__.items()}

def class_record(qual, cls):
    """{"bases": [...], "attrs": {name: code}}; codes: m method, s static method, p read-only
    property, pw writable property, c:<Class> nested class, e:<Enum> nested enum,
    ev:<Enum>.<MEMBER>=<int> enum member, v:<type> other value."""
    attrs = {}
    for name in dir(cls):
        if name in SKIP and name not in KEEP_DUNDER:
            continue
        if name.startswith(("_pybind11", "__pybind11")):
            continue
        raw = None
        for base in cls.__mro__:
            if name in base.__dict__:
                raw = base.__dict__[name]
                break
        value = getattr(cls, name, None)
        if isinstance(raw, property):
            attrs[name] = "pw" if raw.fset is not None else "p"
        elif isinstance(raw, staticmethod) or (raw is not None and type(raw).__name__ == "builtin_function_or_method"):
            attrs[name] = "s"
            signature(qual, name, value)
        elif is_enum(value):
            sub = value.__qualname__
            if sub not in enums:
                enums[sub] = enum_record(value)
            attrs[name] = "e:" + sub
        elif isinstance(value, type):
            sub = value.__qualname__
            if sub not in classes:
                classes[sub] = None
                classes[sub] = class_record(sub, value)
            attrs[name] = "c:" + sub
        elif callable(value):
            attrs[name] = "m"
            signature(qual, name, value)
        elif is_enum(type(value)):
            attrs[name] = f"ev:{type(value).__qualname__}.{value.name}={int(value)}"
        else:
            attrs[name] = "v:" + type(value).__name__
    bases = [b.__name__ for b in cls.__mro__[1:] if b.__module__ == cls.__module__]
    return {"bases": bases, "attrs": attrs}

def signature(qual, name, fn):
    """The docstring signature line(s) of a method of a class the project uses."""
    if qual.split(".")[0] not in SIGNED:
        return
    sigs = [s for s in sig_lines(name, getattr(fn, "__doc__", "")) if "(*args, **kwargs)" not in s] or py_sig(name, fn)
    signatures[qual + "." + name] = sigs

functions, values = {}, {}
for name in sorted(dir(trt)):
    if name.startswith("__") and name != "__version__":
        continue
    obj = getattr(trt, name)
    if inspect.ismodule(obj):
        continue
    if is_enum(obj):
        enums[name] = enum_record(obj)
        # nested classes of enums (none in practice) are ignored
    elif isinstance(obj, type):
        classes[name] = class_record(name, obj)
    elif callable(obj):
        functions[name] = sig_lines(name, getattr(obj, "__doc__", "")) or py_sig(name, obj)
    elif is_enum(type(obj)):
        values[name] = f"ev:{type(obj).__qualname__}.{obj.name}={int(obj)}"
    else:
        values[name] = "v:" + type(obj).__name__ + (f"={obj!r}" if isinstance(obj, (str, int, float, bool)) else "")

nptype = {}
for member_name, member in trt.DataType.__members__.items():
    try:
        import numpy as np
        nptype[member_name] = np.dtype(trt.nptype(member)).name
    except TypeError:
        nptype[member_name] = None

PREFIX = trt.__name__ + ".tensorrt."
def strip(obj):
    if isinstance(obj, str):
        return obj.replace(PREFIX, "").replace(trt.__name__ + ".", "")
    if isinstance(obj, list):
        return [strip(x) for x in obj]
    if isinstance(obj, dict):
        return {k: strip(v) for k, v in obj.items()}
    return obj

print(json.dumps({"__version__": trt.__version__, "module": trt.__name__, "functions": strip(functions), "values": values,
                  "enums": enums, "classes": classes, "signatures": strip(signatures), "nptype": nptype}, sort_keys=True))
'''


def _compile_stubs(major: int, where: Path, cc: str) -> None:
    for lib, code in STUBS.items():
        src = where / f"{lib}.c"
        src.write_text(code)
        so = f"{lib}.so.{major}"
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(where / so), f"-Wl,-soname,{so}", str(src)], check=True)


def _download(version: str, dest: Path) -> Path:
    errors = []
    for package in PACKAGES:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version",
               f"{sys.version_info.major}.{sys.version_info.minor}", *[a for p in PLATFORMS for a in ("--platform", p)],
               "--dest", str(dest), f"{package}=={version}"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode == 0:
            wheel = [p for p in dest.glob("*.whl") if version.replace("-", "_") in p.name]
            if wheel:
                return wheel[0]
        errors.append(f"{package}: {run.stderr.strip().splitlines()[-1:] or run.returncode}")
    raise SystemExit(f"could not download TensorRT bindings {version}: {'; '.join(map(str, errors))}")


def _major(version: str) -> int:
    return int(version.split(".", 1)[0])


def manifest_for(version: str, work: Path, cc: str) -> dict:
    """Download, unpack and introspect one version; returns the manifest dict."""
    wheels = work / "wheels"
    wheels.mkdir(exist_ok=True)
    wheel = _download(version, wheels)
    site = work / f"site-{version}"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    stubs = work / f"stubs-{_major(version)}"
    if not stubs.is_dir():
        stubs.mkdir()
        _compile_stubs(_major(version), stubs, cc)
    module = "tensorrt_bindings" if (site / "tensorrt_bindings").is_dir() else "tensorrt"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    env.update(PYTHONPATH=str(site), LD_LIBRARY_PATH=str(stubs), PYTHONNOUSERSITE="1")
    run = subprocess.run([sys.executable, "-c", INTROSPECT, module, ",".join(SIGNED)], capture_output=True, text=True, env=env, cwd=work)
    if run.returncode != 0:
        raise SystemExit(f"importing TensorRT {version} against the stubs failed:\n{run.stderr[-3000:]}")
    data = json.loads(run.stdout)
    data["wheel"] = {"file": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}
    data["generated_by"] = "tools/trt_manifest.py"
    return data


# trtexec's command line, per release branch: the flags that samples/common/sampleOptions.cpp
# parses for building and running (SafeBuilderOptions belongs to the safety runtime, not
# trtexec), plus the values it accepts for the options whose values we write.
TRTEXEC_BRANCHES = {"10.3": "release/10.3", "10.14": "release/10.14", "11.0": "release/11.0", "11.1": "release/11.1"}
TRTEXEC_VALUE_OPTIONS = {"--hardwareCompatibilityLevel": "hardwareCompatibleArgs", "--profilingVerbosity": "profilingVerbosityString",
                         "--memPoolSize": "memPoolName"}
TRTEXEC_OUT = OUT.parent / "trtexec"


def trtexec_options(source: str) -> tuple[list[str], dict[str, list[str]]]:
    """(flags, accepted values per option) parsed out of sampleOptions.cpp's text."""
    import re

    parts = re.split(r"^void (\w+)::parse\(Arguments& arguments\)", source, flags=re.M)
    flags: set[str] = set()
    for name, body in zip(parts[1::2], parts[2::2]):
        if name.startswith("Safe"):
            continue
        flags |= set(re.findall(r'[(,]\s*"(--[A-Za-z0-9]+)"', body))
    values = {}
    for flag, var in TRTEXEC_VALUE_OPTIONS.items():
        found = re.findall(rf'{var}\)?\s*==\s*"([^"]+)"', source)
        values[flag] = sorted(set(found))
    return sorted(flags), values


def write_trtexec_fixtures(git_dir: Path, out: Path) -> None:
    """One JSON per trtexec version from a clone of github.com/NVIDIA/TensorRT."""
    out.mkdir(parents=True, exist_ok=True)
    path = "samples/common/sampleOptions.cpp"
    for version, branch in TRTEXEC_BRANCHES.items():
        commit = subprocess.run(["git", "-C", str(git_dir), "rev-parse", branch], capture_output=True, text=True, check=True).stdout.strip()
        text = subprocess.run(["git", "-C", str(git_dir), "show", f"{commit}:{path}"], capture_output=True, text=True, check=True).stdout
        flags, values = trtexec_options(text)
        data = {"trtexec": version, "source": {"repository": "https://github.com/NVIDIA/TensorRT", "branch": branch, "commit": commit,
                                                "path": path, "extracted_by": "tools/trt_manifest.py trtexec"},
                "options": flags, "values": values}
        target = out / f"trtexec-{version}.json"
        target.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"{target}: {len(flags)} options from {branch} @ {commit[:12]}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["trtexec"]:
        sub = argparse.ArgumentParser(description="record trtexec's option lists from a NVIDIA/TensorRT clone")
        sub.add_argument("--git-dir", type=Path, required=True, help="clone (or bare mirror) of github.com/NVIDIA/TensorRT")
        sub.add_argument("--out", type=Path, default=TRTEXEC_OUT)
        args = sub.parse_args(argv[1:])
        write_trtexec_fixtures(args.git_dir, args.out)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", nargs="+", default=list(DEFAULT_VERSIONS), help="bindings versions as PyPI spells them")
    parser.add_argument("--out", type=Path, default=OUT, help="directory for trt-<version>.json")
    parser.add_argument("--cc", default=os.environ.get("CC", "cc"), help="C compiler for the stub libraries")
    args = parser.parse_args(argv)
    if shutil.which(args.cc) is None:
        raise SystemExit(f"C compiler {args.cc!r} not found; install gcc or pass --cc")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trt-manifest-") as tmp:
        for version in args.versions:
            data = manifest_for(version, Path(tmp), args.cc)
            path = args.out / f"trt-{version}.json"
            path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
            print(f"{path}: TensorRT {data['__version__']}, {len(data['classes'])} classes, {len(data['enums'])} enums, "
                  f"{path.stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
