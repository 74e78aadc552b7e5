"""The package's shape: no import cycle, no module over 400 lines, no exported name without a caller, one planner.

Read from the source (no import needed for the first three), so a refactor that breaks one of
these fails here with the files and names to look at.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attn_export"
FILES = sorted(PACKAGE.rglob("*.py"))
MAX_LINES = 400


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _imports() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its body (lazy imports inside functions count too)."""
    names = {_module(p): p for p in FILES}
    edges: dict[str, set[str]] = {m: set() for m in names}
    for mod, path in names.items():
        base = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                parts = base.split(".")
                pkg = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else [])) if node.level else (node.module or "")
                targets = [f"{pkg}.{a.name}" for a in node.names] + [pkg]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t in names and t != mod:
                    edges[mod].add(t)
                    break
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among non-``__init__`` modules (package faces only hand names on), or None."""
    faces = {_module(p) for p in FILES if p.name == "__init__.py"}
    graph = {m: {t for t in ts if t not in faces} for m, ts in edges.items() if m not in faces}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                return stack[stack.index(t) :] + [t]
            if t not in state and (found := visit(t)):
                return found
        state[m] = 2
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle_in_the_package():
    cycle = _cycle(_imports())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_cycle():
    """The walker itself: a two-module loop is reported (a check that cannot fail proves nothing)."""
    assert _cycle({"attn_export.a": {"attn_export.b"}, "attn_export.b": {"attn_export.a"}}) is not None


def test_no_module_over_400_lines():
    big = {str(p.relative_to(ROOT)): n for p in FILES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines (split them along their seams): {big}"


def _all_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:  # a lazy package face builds it from its name map
                return list(importlib.import_module(_module(path)).__all__)
    return []


@functools.cache
def _used_names(path: Path) -> frozenset[str]:
    """The names ``path`` uses other than where it defines them (loads and attributes), parsed once per file."""
    return frozenset(n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(ast.parse(path.read_text()))
                     if (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)) or isinstance(n, ast.Attribute))  # fmt: skip


def _loads(path: Path, name: str) -> bool:
    """Whether ``path`` uses ``name`` other than at its definition (a load, or an attribute)."""
    return name in _used_names(path)


def test_every_exported_name_has_a_caller():
    """A name in any ``__all__`` is used in the package, its CLI, the bench scripts or the documented API (README, docs/)."""
    words = {p: set(re.findall(r"\w+", p.read_text())) for p in FILES}  # a name is a whole word: \bname\b
    documented = set(re.findall(r"\w+", "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                                                                            *sorted((ROOT / "bench").glob("*.py"))])))  # fmt: skip
    dead = []
    for path in FILES:
        for name in _all_names(path):
            # a package face that hands the name on is not a caller
            callers = [q for q, w in words.items() if q != path and name in w
                       and not (q.name == "__init__.py" and q.parent in path.parents and not _loads(q, name))]  # fmt: skip
            if not callers and name not in documented and not _loads(path, name):
                dead.append(f"{path.relative_to(ROOT)}:{name}")
    assert not dead, f"exported names without a caller (delete them, or drop them from __all__): {dead}"


def test_stages_are_made_only_by_the_planner():
    makers = [f"{p.relative_to(ROOT)}:{i + 1}" for p in FILES if p.name != "plan.py"
              for i, line in enumerate(p.read_text().splitlines()) if re.search(r"\bStep\(", line)]  # fmt: skip
    assert not makers, f"plan steps made outside plan.make_plan: {makers}"


@pytest.mark.parametrize("name", ["attn_export.config", "attn_export.cli.options", "attn_export.compress.registry", "attn_export.subjects.kinds"])
def test_light_modules_import_neither_torch_nor_onnx(name):
    """What flag validation reads must not load torch/onnx/onnxruntime (a bad value is refused in well under a second)."""
    import subprocess
    import sys

    code = f"import sys, {name}; heavy = [m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules]; print(heavy); sys.exit(bool(heavy))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
