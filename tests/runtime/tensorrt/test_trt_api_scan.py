"""Every TensorRT name the package spells out exists in the real bindings of every version it runs on.

The source of ``attn_export/`` is parsed (no import), and each attribute chain rooted at
the ``tensorrt`` module (``trt.X.Y`` or ``self._trt.X``) is resolved against the manifests
recorded from the PyPI wheels: module names, class attributes, nested enums and enum
members. Names looked up dynamically (``getattr(trt.BuilderFlag, flag)``) are checked by
enumerating what the code can pass for each version. Calls on TensorRT objects
(``config.set_flag``) are checked by the strict doubles in ``test_trt_build_fakes.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from trt_fakes import load_manifest, major_minor, manifest_versions

from attn_export.errors import ConfigError
from attn_export.runtime.tensorrt.build_plan import plan_build
from attn_export.runtime.tensorrt.spec import HARDWARE_COMPATIBILITY, EngineSpec, ShapeProfile

PACKAGE = Path(__file__).resolve().parents[3] / "attn_export"
VERSIONS = manifest_versions()
# Names the package binds the tensorrt module to (``trt = require("tensorrt", ...)``,
# ``import tensorrt as trt``, ``self._trt = ...``, ``self.trt, ... = trt, ...``).
ROOTS = {"trt", "tensorrt", "self._trt", "self.trt"}
# chain -> (versions it runs on, why): for code paths guarded by version. Empty today: every
# literal chain runs on every supported version (the version-dependent names are looked up
# dynamically and enumerated below).
ONLY_ON: dict[str, tuple[tuple[str, ...], str]] = {}


def _root(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


def _chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    """(root, [attr, ...]) for ``root.a.b``; None when the chain is not rooted at a TensorRT name."""
    names: list[str] = []
    cur: ast.expr = node
    while isinstance(cur, ast.Attribute):
        names.append(cur.attr)
        cur = cur.value
        root = _root(cur)
        if root in ROOTS:
            return root, list(reversed(names))
    return None


def scan() -> tuple[dict[str, list[str]], list[tuple[str, str]]]:
    """({"trt.X.Y": [file:line, ...]}, [(getattr target chain, file:line), ...])."""
    chains: dict[str, list[str]] = {}
    dynamic: list[tuple[str, str]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or isinstance(parents.get(node), ast.Attribute):
                continue  # only maximal chains
            found = _chain(node)
            if found is None:
                continue
            root, names = found
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            chains.setdefault(".".join(["trt", *names]), []).append(where)
            parent = parents.get(node)
            if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "getattr" and parent.args[0] is node:
                dynamic.append((".".join(["trt", *names]), where))
    return chains, dynamic


def resolve(manifest: dict, names: list[str]) -> str | None:
    """None when ``trt.<names>`` exists in ``manifest``, else what is missing."""
    head, rest = names[0], names[1:]
    if head in manifest["enums"]:
        kind, target = "e", head
    elif head in manifest["classes"]:
        kind, target = "c", head
    elif head in manifest["functions"] or head in manifest["values"]:
        return None if not rest else f"{head} is not a class or enum, so {head}.{rest[0]} cannot exist"
    else:
        return f"module has no {head!r}"
    path = head
    for name in rest:
        if kind == "e":
            if name not in manifest["enums"][target]:
                return f"enum {target} has no member {name!r}"
            kind, target = "ev", f"{target}.{name}"
        elif kind == "c":
            code = manifest["classes"][target]["attrs"].get(name)
            if code is None:
                return f"class {target} has no attribute {name!r}"
            kind, target = (code[:2].rstrip(":"), code.split(":", 1)[1]) if ":" in code else (code, f"{target}.{name}")
        else:
            return f"{path} is a {kind!r}, it has no {name!r}"
        path += "." + name
    return None


def test_scan_finds_the_tensorrt_calls() -> None:
    chains, dynamic = scan()
    assert {"trt.Builder", "trt.Runtime", "trt.Logger.WARNING", "trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED",
            "trt.MemoryPoolType.WORKSPACE", "trt.ProfilingVerbosity.DETAILED", "trt.LayerInformationFormat.JSON",
            "trt.TensorIOMode.INPUT", "trt.DeviceType.DLA", "trt.nptype", "trt.__version__"} <= set(chains), sorted(chains)
    assert any("on_device_validator.py" in w for ws in chains.values() for w in ws), "the bundle's device script is scanned too"
    assert {d for d, _ in dynamic} == {"trt.BuilderFlag", "trt.HardwareCompatibilityLevel"}, dynamic


def _bindings() -> list[tuple[str, str]]:
    """(name the tensorrt module is bound to, file:line) for every import/require of it."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.name}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                out += [(a.asname or a.name, where) for a in node.names if a.name == "tensorrt"]
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                call = node.value
                if isinstance(call.func, ast.Name) and call.func.id == "require" and call.args and getattr(call.args[0], "value", None) == "tensorrt":
                    out += [(ast.unparse(t), where) for t in node.targets]
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
                for target, value in zip(getattr(node.targets[0], "elts", []), node.value.elts):
                    if isinstance(value, ast.Name) and value.id in ROOTS:
                        out.append((ast.unparse(target), where))
    return out


def test_tensorrt_is_only_bound_to_scanned_names() -> None:
    bound = _bindings()
    assert len(bound) >= 4 and all(name in ROOTS for name, _ in bound), bound


@pytest.mark.parametrize("version", VERSIONS)
def test_every_literal_chain_exists(version: str) -> None:
    manifest = load_manifest(version)
    chains, _ = scan()
    missing = []
    for chain, where in sorted(chains.items()):
        only = ONLY_ON.get(chain)
        if only is not None and version not in only[0]:
            continue
        why = resolve(manifest, chain.split(".")[1:])
        if why is not None:
            missing.append(f"{chain} ({', '.join(where)}): {why}")
    assert not missing, f"TensorRT {version}: " + "; ".join(missing)


def test_only_on_exceptions_are_real() -> None:
    for chain, (versions, why) in ONLY_ON.items():
        assert why and any(resolve(load_manifest(v), chain.split(".")[1:]) for v in VERSIONS if v not in versions), chain


def _flags_the_plan_can_emit(version: str) -> set[str]:
    """Every BuilderFlag name plan_build asks for on ``version``, over the spec space."""
    out: set[str] = set()
    static = ShapeProfile((1, 8), (1, 8), (1, 8))
    for precision in ("fp32", "fp16", "int8"):
        for graph_float in ("fp32", "fp16"):
            for has_qdq in (False, True):
                for strongly in (None, True, False):
                    for dla in (None, 0):
                        for vc in (False, True):
                            try:
                                spec = EngineSpec(precision=precision, dla_core=dla, profiles=static, version_compatible=vc, strongly_typed=strongly)
                                out |= set(plan_build(spec, version, graph_float, has_qdq).builder_flags)
                            except ConfigError:
                                continue
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_dynamic_builder_flags_exist(version: str) -> None:
    flags = _flags_the_plan_can_emit(version)
    members = set(load_manifest(version)["enums"]["BuilderFlag"])
    assert flags and flags <= members, f"TensorRT {version} lacks BuilderFlag {sorted(flags - members)}"
    if major_minor(version) >= (11, 0):
        assert not {"FP16", "INT8"} & flags  # removed in 11: the plan must not ask for them


@pytest.mark.parametrize("version", VERSIONS)
def test_dynamic_hardware_levels_exist(version: str) -> None:
    members = set(load_manifest(version)["enums"]["HardwareCompatibilityLevel"])
    for ours, (member, _) in HARDWARE_COMPATIBILITY.items():
        if ours == "none":
            continue  # never set: the default
        try:
            plan_build(EngineSpec(precision="fp32", hardware_compatibility=ours), version, "fp32", False)
        except ConfigError:
            assert member not in members, f"{ours} is refused on {version} though TensorRT has {member}"
            continue
        assert member in members, f"plan_build allows {ours} on {version}, whose HardwareCompatibilityLevel lacks {member}"
