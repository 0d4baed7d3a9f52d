"""The stairs go one way: no import cycles, and each layer imports only the layers below it.

Layers, bottom to top (docs/architecture.md, "Layers and the one-way rule"):
    core         autoclust/ except the front doors: IR, op table, passes, clustering,
                 kernel IR, runtime, report, flags, registry
    importers    importers/ (autoclust.importers.*)     backends   backends/ (autoclust.backends.*)
    front doors  autoclust/__init__, session, hook, onnx_backend, tracing, ray
    tools        tools/, serve/ (and models/, the zoo, which imports only errors)

Every import statement counts, those inside functions too; imports under
`if TYPE_CHECKING:` (annotations only, never executed) do not. A module reaches a higher
layer only through `autoclust.registry` (a name -> module table, like entry points).
Private names (`_x`) are never imported across packages.
"""

from __future__ import annotations

import ast
import os

import pytest
from support import paths

REPO = paths.REPO
FRONT_DOORS = {"autoclust", "autoclust.session", "autoclust.hook", "autoclust.onnx_backend",
               "autoclust.tracing", "autoclust.ray"}
OUTER = ("autoclust.importers", "autoclust.backends", "autoclust.tools", "autoclust.serve",
         "autoclust.models")


def package_dirs() -> dict[str, str]:
    """pyproject's package-dir: installed package -> folder of the repo."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


def module_files() -> dict[str, str]:
    """Every module of the installed tree: dotted name -> file."""
    mods = {}
    for pkg, folder in package_dirs().items():
        root = os.path.join(REPO, folder)
        for dirpath, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            rel = os.path.relpath(dirpath, root)
            prefix = pkg if rel == "." else pkg + "." + rel.replace(os.sep, ".")
            if prefix != pkg and prefix in package_dirs():
                continue  # a mapped subpackage of its own (autoclust/ holds no such folder)
            for name in files:
                if name.endswith(".py"):
                    stem = name[:-3]
                    mods[prefix if stem == "__init__" else f"{prefix}.{stem}"] = \
                        os.path.join(dirpath, name)
    return mods


def _runtime_imports(tree: ast.AST):
    """Import nodes, skipping `if TYPE_CHECKING:` bodies."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for body in node.orelse for n in _runtime_imports_in(body))
            continue
        yield from _runtime_imports_in(node)


def _runtime_imports_in(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _runtime_imports(node)


def import_edges(mods: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """module -> {imported module: [names imported from it]}."""
    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, dict[str, list[str]]] = {}
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
        out = edges.setdefault(mod, {})
        for node in _runtime_imports(tree):
            if isinstance(node, ast.Import):
                targets = [(resolve(a.name), "") for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = []
                for a in node.names:
                    sub = resolve(f"{base}.{a.name}")
                    is_module = sub == f"{base}.{a.name}"
                    targets.append((sub, "") if is_module else (resolve(base), a.name))
            for target, name in targets:
                if target and target != mod:
                    out.setdefault(target, []).append(name)
    return edges


def cycles(edges: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root, first in edges.items():
        if root in index:
            continue
        work = [(root, iter(first))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer(mod: str) -> str:
    if mod in FRONT_DOORS:
        return "front door"
    for prefix in OUTER:
        if mod == prefix or mod.startswith(prefix + "."):
            return prefix.split(".")[1]
    return "core"


# What each layer may import, besides itself and the core.
ALLOWED = {
    "core": set(),
    "importers": set(),
    "backends": set(),
    "models": set(),
    "front door": {"front door"},
    "tools": {"importers", "backends", "front door", "models", "serve", "tools"},
    "serve": {"importers", "backends", "front door", "models", "serve", "tools"},
}


def subsystem(mod: str) -> str:
    """The package a module belongs to for the private-name rule: autoclust.ops,
    autoclust.importers.onnx, autoclust.backends.cpu, ..."""
    parts = mod.split(".")
    depth = 3 if layer(mod) in ("importers", "backends", "tools", "serve") else 2
    return ".".join(parts[:depth])


@pytest.fixture(scope="module")
def graph():
    return import_edges(module_files())


def test_the_walk_sees_the_whole_tree(graph):
    assert "autoclust.ops.table" in graph and "autoclust.importers.onnx.load" in graph
    assert "autoclust.backends.cpu.codegen" in graph and "autoclust.tools.cli" in graph
    assert "autoclust.kernel.ir" in graph["autoclust.kernel.fusion"]
    # an import inside a function counts
    assert "autoclust.compile" in graph["autoclust.runtime.runner"]


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_each_layer_imports_only_below_it(graph):
    bad = []
    for mod, targets in graph.items():
        for target in targets:
            here, there = layer(mod), layer(target)
            if there not in ("core", here) and there not in ALLOWED[here]:
                bad.append(f"{mod} ({here}) -> {target} ({there})")
    assert bad == [], "reach these through autoclust.registry:\n" + "\n".join(bad)


def test_no_private_names_across_packages(graph):
    bad = [f"{mod} imports {target}.{name}"
           for mod, targets in graph.items() for target, names in targets.items()
           for name in names
           if name.startswith("_") and not name.startswith("__")
           and subsystem(mod) != subsystem(target)]
    assert bad == []


def test_the_checker_catches_a_cycle_and_an_upward_import():
    """The rules themselves, on a made-up graph (so a broken walker cannot pass silently)."""
    fake = {"autoclust.a": {"autoclust.b": [""]}, "autoclust.b": {"autoclust.a": [""]},
            "autoclust.c": {"autoclust.importers.onnx.load": ["import_model"]},
            "autoclust.importers.onnx.load": {}}
    assert cycles(fake) == [["autoclust.a", "autoclust.b"]]
    assert layer("autoclust.c") == "core"
    assert layer("autoclust.importers.onnx.load") == "importers"
    assert "importers" not in ALLOWED["core"]


MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 60


def test_modules_and_functions_stay_small():
    """No module over ~800 lines, no function over ~60 (as tinygrad's line-count check):
    past that, split by concern."""
    too_long = []
    for mod, path in module_files().items():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        lines = text.count("\n") + 1
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{mod}: {lines} lines")
        for node in ast.walk(ast.parse(text, path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    too_long.append(f"{mod}.{node.name}: {size} lines")
    assert too_long == []


def test_no_test_module_imports_another():
    """Tests share helpers through tests/support, never by importing a test module (also
    inside the scripts tests hand to subprocesses): every test file runs on its own."""
    bad = []
    for root, _, names in os.walk(paths.TESTS):
        for name in names:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for lineno, line in enumerate(text.splitlines(), 1):
                words = line.split()
                if words[:1] in (["import"], ["from"]) and len(words) > 1 \
                        and words[1].split(".")[0].startswith(("test_", "conftest")):
                    bad.append(f"{os.path.relpath(path, paths.TESTS)}:{lineno}: {line.strip()}")
    assert bad == []
