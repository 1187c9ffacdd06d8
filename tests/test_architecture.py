"""The package's layering, read from its source: the import graph has no cycles, and layers import what they may.

The graph is built with :mod:`ast` from every module of ``asynccoord/``: one edge per
``import`` statement, wherever it stands (module level, inside a function, under
``if TYPE_CHECKING:``), to the module it names (``from pkg import name`` names the module
``pkg.name`` when there is one, else ``pkg`` itself). Importing a module also runs its
parent packages' ``__init__``; those implicit edges are not drawn (every module would then
depend on the package root), so a package's ``__init__`` counts only for what it imports.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "asynccoord"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def imports_of(name: str) -> Iterator[tuple[str, int]]:
    """The package's modules that module ``name`` imports, with the line of each import."""
    tree = ast.parse(MODULES[name].read_text("utf-8"), filename=str(MODULES[name]))
    package = name if _is_package(name) else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source not in MODULES:
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                yield (sub if sub in MODULES else source), node.lineno


GRAPH: dict[str, set[str]] = {name: {target for target, _ in imports_of(name)} - {name} for name in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, 1972), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_the_package() -> None:
    """A check of the checker: it finds the modules and the edges everyone knows are there."""
    assert {"asynccoord.node.node", "asynccoord.node.runtime", "asynccoord.node.idlepoll"} <= MODULES.keys()
    assert "asynccoord.node.node" in GRAPH["asynccoord.node.runtime"]
    assert "asynccoord.node" in GRAPH["asynccoord"]  # `from .node import ...` of a package
    assert "asynccoord.node.node" in GRAPH["asynccoord.node.idlepoll"]  # under TYPE_CHECKING, still drawn
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def module_level(name: str) -> set[str]:
    """What importing module ``name`` runs: its imports at top level and in top-level ``if``/``try`` blocks."""
    tree = ast.parse(MODULES[name].read_text("utf-8"))
    lines = {
        stmt.lineno
        for top in tree.body
        for stmt in ast.walk(top)
        if isinstance(stmt, ast.Import | ast.ImportFrom) and not _in_function(top, stmt)
    }
    return {target for target, line in imports_of(name) if line in lines} - {name}


def _in_function(top: ast.stmt, stmt: ast.stmt) -> bool:
    return any(
        isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and stmt in ast.walk(scope)
        for scope in ast.walk(top)
    )


@pytest.mark.xfail(
    strict=True,
    reason="asynccoord.backends.open <-> asynccoord.backends.postgres.store, which the store contract's "
    "restructuring removes; remove this mark when it has",
)
def test_there_are_no_import_cycles_in_the_package() -> None:
    assert cycles({name: module_level(name) for name in MODULES}) == []


def test_there_are_no_import_cycles_in_the_pipeline() -> None:
    """``asynccoord.node`` counting every import, function-local ones too (the runtime's was one)."""
    node = {name: GRAPH[name] for name in MODULES if name.startswith(f"{PACKAGE}.node.")}
    assert cycles({name: targets & node.keys() for name, targets in node.items()}) == []


@pytest.mark.parametrize("layer", ["asynccoord.node"])
def test_the_layer_depends_on_the_contract_not_on_an_engine(layer: str) -> None:
    """The pipeline uses stores through the contract (``asynccoord.contract``): it imports no backend module."""
    reached = {
        (name, target, line)
        for name in MODULES
        if name == layer or name.startswith(layer + ".")
        for target, line in imports_of(name)
        if target.startswith(f"{PACKAGE}.backends")
    }
    assert reached == set()
