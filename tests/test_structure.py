"""The package's shape: no import cycle, no module over 400 lines, no exported name without a caller, one planner.

Read from the source (no import needed for the first three), so a refactor that breaks one of
these fails here with the files and names to look at.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attn_export"
FILES = sorted(PACKAGE.rglob("*.py"))
MAX_LINES = 400


def _module(path: Path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


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
    return _find_cycle({m: {t for t in ts if t not in faces} for m, ts in edges.items() if m not in faces})


def _find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One cycle of ``graph`` (node -> the nodes it imports) as ``[a, b, ..., a]``, or None."""
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
    for node in _tree(path).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:  # a lazy package face builds it from its name map
                return list(importlib.import_module(_module(path)).__all__)
    return []


# -- names resolved, not words: every import is followed to the module that defines the name ------
MODULES = {_module(p): p for p in FILES}


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of ``path``, walked once."""
    return tuple(ast.walk(_tree(path)))


def _top(body: list[ast.stmt]) -> list[ast.stmt]:
    """A module's top-level statements, with those inside ``if``/``try`` blocks (TYPE_CHECKING, fallbacks)."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        for block in ("body", "orelse", "finalbody"):
            if isinstance(node, (ast.If, ast.Try)):
                out.extend(_top(getattr(node, block, [])))
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                out.extend(_top(handler.body))
    return out


def _source(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module of ``from X import ...`` in ``path`` (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = _module(path).split(".") if path.name == "__init__.py" else _module(path).split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


@functools.cache
def _defines(path: Path) -> tuple[frozenset[str], dict[str, tuple[str, str]]]:
    """The names ``path`` defines at its top level, and those it binds by ``from X import N`` or a lazy
    name map (``{"N": "attn_export.x"}``) as name -> (X, N)."""
    defined: set[str] = set()
    imported: dict[str, tuple[str, str]] = {}
    for node in _top(_tree(path).body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            imported.update(_lazy_map(path, node.value))
        elif isinstance(node, ast.ImportFrom):
            imported.update({a.asname or a.name: (_source(path, node), a.name) for a in node.names})
        elif isinstance(node, ast.Import):
            defined.update(a.asname or a.name.split(".")[0] for a in node.names)
    return frozenset(defined), imported


def _lazy_map(path: Path, value: ast.expr | None) -> dict[str, tuple[str, str]]:
    """A lazy face's name map, ``{"N": "attn_export.x.y"}`` or ``{"N": "y"}`` (a submodule), as name -> (module, N)."""
    if not (isinstance(value, ast.Dict) and value.keys):
        return {}
    pairs = [(k.value, v.value) for k, v in zip(value.keys, value.values)
             if isinstance(k, ast.Constant) and isinstance(v, ast.Constant) and isinstance(k.value, str) and isinstance(v.value, str)]  # fmt: skip
    where = {name: m if m in MODULES else f"{_module(path)}.{m}" for name, m in pairs}
    if len(pairs) != len(value.keys) or not all(m in MODULES for m in where.values()):
        return {}  # some other table of strings
    return {name: (m, name) for name, m in where.items()}


@functools.cache
def _home(module: str, name: str) -> tuple[str, str] | None:
    """Where ``module.name`` is defined, following re-exports; None when it is not ours or not there."""
    if f"{module}.{name}" in MODULES:
        return (f"{module}.{name}", "")  # a submodule
    path = MODULES.get(module)
    if path is None:
        return None
    defined, imported = _defines(path)
    if name in imported:
        return _home(*imported[name])
    return (module, name) if name in defined else None


def _dotted(node: ast.AST) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.insert(0, node.attr)
        node = node.value
    return [node.id, *parts] if isinstance(node, ast.Name) else None


@functools.cache
def _uses(path: Path) -> frozenset[tuple[str, str]]:
    """The (module, name) homes ``path`` reaches by importing a name or reading a module's attribute;
    a face's re-export of a name it lists in ``__all__`` hands the name on and is not a use."""
    modules: dict[str, str] = {}  # local name -> the module it is bound to
    homes: set[tuple[str, str] | None] = set()
    handed_on = set(_all_names(path)) if path.suffix == ".py" and path.is_relative_to(PACKAGE) else set()
    top = {id(n) for n in _top(_tree(path).body)}
    for node in _nodes(path):
        if isinstance(node, ast.ImportFrom):
            source = _source(path, node)
            for a in node.names:
                if f"{source}.{a.name}" in MODULES:
                    modules[a.asname or a.name] = f"{source}.{a.name}"
                elif not (id(node) in top and (a.asname or a.name) in handed_on) or (a.asname or a.name) in _loads(path):
                    homes.add(_home(source, a.name))
        elif isinstance(node, ast.Import):
            for a in node.names:
                modules[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    # ``importlib.import_module(name).attr``: the modules the file names in strings (a table of commands)
    named = {n.value for n in _nodes(path) if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in MODULES}
    for node in _nodes(path):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) and (_dotted(node.value.func) or [""])[-1] == "import_module":
            homes.update(_home(m, node.attr) for m in named)
        if isinstance(node, ast.Attribute) and (parts := _dotted(node)) and parts[0] in modules:
            dotted = [*modules[parts[0]].split("."), *parts[1:]]
            for cut in range(len(dotted) - 1, 0, -1):  # the longest module prefix, then the name read from it
                if ".".join(dotted[:cut]) in MODULES:
                    homes.add(_home(".".join(dotted[:cut]), dotted[cut]))
                    break
    return frozenset(h for h in homes if h is not None)


@functools.cache
def _loads(path: Path) -> frozenset[str]:
    """The bare names ``path`` reads (``ast.Name`` loads: its own bindings, not attributes of other objects)."""
    return frozenset(n.id for n in _nodes(path) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))


def _loaded_at_home(module: str, name: str) -> bool:
    """Whether the module that defines ``name`` reads it itself (an exported type or constant of its interface)."""
    return bool(name) and name in _loads(MODULES[module])


def _documented() -> set[str]:
    """Names the README and docs/ show as code (backticks or fenced blocks): the documented API."""
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    code = re.findall(r"```.*?```|`[^`\n]+`", text, flags=re.S)
    return set(re.findall(r"\w+", "\n".join(code)))


def test_every_exported_name_has_a_caller():
    """A name in any ``__all__`` is defined or imported where it is listed, and its definition is
    read: by its own module, or through an import or a module attribute from another package module,
    a bench script or a test (resolved through package faces, relative imports and lazy name maps),
    or it is documented API (shown as code in the README or docs/). A word in a comment, a string or
    another object's attribute of the same name is not a caller."""
    callers = {q: q.read_text() for q in [*FILES, *sorted((ROOT / "bench").glob("*.py")), *sorted((ROOT / "tests").rglob("*.py"))]}
    documented = _documented()
    missing, dead = [], []
    for path in FILES:
        module = _module(path)
        for name in _all_names(path):
            home = _home(module, name)
            if home is None:
                missing.append(f"{path.relative_to(ROOT)}:{name}")
            elif name not in documented and not _loaded_at_home(*home) and not any(
                home in _uses(q) for q, text in callers.items() if q != MODULES.get(home[0]) and (name in text or home[1] in text)  # parse only files that can
            ):  # fmt: skip
                dead.append(f"{path.relative_to(ROOT)}:{name}")
    assert not missing, f"names in __all__ that the module neither defines nor imports: {missing}"
    assert not dead, f"exported names without a caller (delete them, or drop them from __all__): {dead}"


def test_the_exported_name_check_resolves_names_not_words(tmp_path: Path):
    """A word in a comment or string, or a same-named attribute of another object, is not a caller."""
    tree = ast.parse("from attn_export.errors import ConfigError as E\nimport attn_export.errors as errs\n"
                     "# MissingDependencyError\nx = 'ToleranceError'\ny = obj.ExportError\nz = errs.CheckpointError\n")  # fmt: skip
    probe = tmp_path / "probe.py"
    probe.write_text(ast.unparse(tree) + "\n# MissingDependencyError\n")
    uses = _uses(probe)
    assert ("attn_export.errors", "ConfigError") in uses and ("attn_export.errors", "CheckpointError") in uses
    assert not {("attn_export.errors", n) for n in ("MissingDependencyError", "ToleranceError", "ExportError")} & uses


def test_stages_are_made_only_by_the_planner():
    makers = [f"{p.relative_to(ROOT)}:{i + 1}" for p in FILES if p.name != "plan.py"
              for i, line in enumerate(p.read_text().splitlines()) if re.search(r"\bStep\(", line)]  # fmt: skip
    assert not makers, f"plan steps made outside plan.make_plan: {makers}"


@pytest.mark.parametrize("name", ["attn_export.config.run", "attn_export.cli.options", "attn_export.compress.registry", "attn_export.subjects.kinds"])
def test_light_modules_import_neither_torch_nor_onnx(name):
    """What flag validation reads must not load torch/onnx/onnxruntime (a bad value is refused in well under a second)."""
    import subprocess
    import sys

    code = f"import sys, {name}; heavy = [m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules]; print(heavy); sys.exit(bool(heavy))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the floor plan: no two-way tie between top-level units ---------------------------------------
# A unit is a subfolder of attn_export/ (``compress``), a root module (``config``), or the package
# face (``attn_export``). Every import counts: module level, inside functions (lazy), under
# TYPE_CHECKING, in package ``__init__`` files, and module names written as strings (the tables that
# ``importlib.import_module`` reads). A unit may import only units below it, so the unit graph has no
# cycle. ``python tests/test_structure.py`` prints the graph.

# The upward edges that today's layout still needs, each with what has to move to cut it. The big
# folder move of issue 29 removes them; a cut edge must leave this table (a test checks each is still
# an edge on a cycle), and no new one may be added to get a test green.
KNOWN_TIES: dict[tuple[str, str], str] = {
}


def _unit(module: str) -> str:
    """The top-level unit of a package module: ``attn_export.compress.registry`` -> ``compress``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _unit_edges(root: Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """(unit, unit it imports) -> the ``file:line`` of each import, for the ``attn_export`` package under ``root``."""
    modules = {_module(p, root): p for p in sorted((root / "attn_export").rglob("*.py"))}
    edges: dict[tuple[str, str], list[str]] = {}
    for module, path in modules.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in _nodes(path) if root == ROOT else tuple(ast.walk(ast.parse(path.read_text()))):
            if isinstance(node, ast.ImportFrom):
                source = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])]) if node.level else node.module or ""
                named = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
            elif isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules and "." in node.value:
                named = [node.value]  # importlib.import_module("attn_export.x") and the lazy faces' name maps
            else:
                continue
            for target in named:
                if target.split(".")[0] == "attn_export" and _unit(target) != _unit(module):
                    lines = edges.setdefault((_unit(module), _unit(target)), [])
                    if (where := f"{path.relative_to(root)}:{node.lineno}") not in lines:
                        lines.append(where)
    return edges


def _unit_graph(edges: Iterable[tuple[str, str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    return graph


def _tie(edges: dict[tuple[str, str], list[str]]) -> str | None:
    """One cycle between units, with the import lines of each step, or None."""
    cycle = _find_cycle(_unit_graph(edges))
    if cycle is None:
        return None
    steps = [f"{a} -> {b} ({', '.join(edges[a, b][:3])}{', ...' if len(edges[a, b]) > 3 else ''})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(cycle) + ":\n  " + "\n  ".join(steps)


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def _assert_no_tie(edges: dict[tuple[str, str], list[str]]) -> None:
    tie = _tie({e: lines for e, lines in edges.items() if e not in KNOWN_TIES})
    assert tie is None, (
        f"a two-way tie between top-level units of attn_export/ (each imports the other, directly or through a cycle): {tie}\n"
        "move what both need into the lower unit and import it from there"
    )


def test_no_two_way_tie_between_top_level_units():
    _assert_no_tie(_unit_edges())


def test_every_known_tie_is_still_a_tie():
    """KNOWN_TIES only shrinks: an edge that is gone, or no longer closes a cycle, must leave the table."""
    graph = _unit_graph(_unit_edges())
    stale = [f"{a} -> {b}" for a, b in KNOWN_TIES if b not in graph.get(a, ()) or not _reaches(graph, b, a)]
    assert not stale, f"ties cut (delete them from KNOWN_TIES in tests/test_structure.py): {stale}"


def test_the_tie_check_finds_a_planted_tie(tmp_path: Path):
    """A tree with a tie only a folder-level, lazy and string-aware walk can see: ``low`` reaches back to
    ``high`` through a package ``__init__`` (TYPE_CHECKING), a function-level import and an
    ``importlib.import_module`` string; the walker reports each edge and the checker the cycle."""
    files = {
        "attn_export/__init__.py": '"""face"""\n',
        "attn_export/high/__init__.py": "",
        "attn_export/high/top.py": "from attn_export.low.base import thing\n",
        "attn_export/low/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from attn_export.high.top import x\n",
        "attn_export/low/base.py": "def thing():\n    from ..mid import helper\n    return helper\n",
        "attn_export/mid.py": "import importlib\nTABLE = {'run': 'attn_export.high.top'}\n"
        "def helper(name):\n    return importlib.import_module(TABLE[name])\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    edges = _unit_edges(tmp_path)
    assert edges == {
        ("high", "low"): ["attn_export/high/top.py:1"],
        ("low", "high"): ["attn_export/low/__init__.py:3"],
        ("low", "mid"): ["attn_export/low/base.py:2"],
        ("mid", "high"): ["attn_export/mid.py:2"],
    }
    with pytest.raises(AssertionError, match=r"high -> low -> high:\s+high -> low \(attn_export/high/top\.py:1\)"):
        _assert_no_tie(edges)
    del edges["low", "high"]  # the __init__ edge gone, the lazy import and the string table still close a cycle
    with pytest.raises(AssertionError, match="high -> low -> mid -> high"):
        _assert_no_tie(edges)
    del edges["mid", "high"]
    _assert_no_tie(edges)


def _print_unit_graph() -> None:
    """The unit graph: each unit and the units it imports; the known ties marked."""
    edges = _unit_edges()
    graph = _unit_graph(edges)
    for unit in sorted(graph):
        print(f"{unit} -> {', '.join(sorted(graph[unit]))}")
    for (a, b), why in KNOWN_TIES.items():
        print(f"known tie {a} -> {b} ({', '.join(edges.get((a, b), ['gone']))}): {why}")


if __name__ == "__main__":
    _print_unit_graph()


ROOT_MODULES = {"__init__.py", "errors.py", "testing.py"}  # the public face, the error tree, the pytest plugin


def test_the_package_root_holds_only_the_public_face_the_errors_and_the_plugin():
    """Every other module lives in the folder of its layer (docs/architecture.md, "The floor plan")."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ROOT_MODULES)
    assert not loose, f"modules in the package root (move each into the folder of its layer): {loose}"
