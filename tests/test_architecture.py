"""The package's layering, read from its source: no import cycles, no reaching into an engine, small modules.

The import graph is built with ``ast`` from every ``.py`` file of ``asynccoord``: a
module-level import (``TYPE_CHECKING`` blocks included) is an edge of the graph the
cycle check walks; the layering checks look at every import, function-local ones too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "asynccoord"
ENGINES = ("memory", "sqlite", "postgres")
MAX_LINES = 900

ENTRY_POINTS = frozenset(
    {
        "asynccoord.backends.open",
        "asynccoord.backends.redis",
        *(f"asynccoord.backends.{engine}" for engine in ENGINES),
    }
)
"""What code outside ``asynccoord.backends`` may import from it: ``open_store`` and each engine's store class."""

INNER_MODULES = {
    "asynccoord.backends.redisconn": "asynccoord.backends",
    "asynccoord.backends.redisscripts": "asynccoord.backends",
    "asynccoord.backends.sqlite.claim": "asynccoord.backends.sqlite",
    "asynccoord.backends.sqlite.commit": "asynccoord.backends.sqlite",
    "asynccoord.backends.sqlite.heads": "asynccoord.backends.sqlite",
    "asynccoord.backends.sqlite.taskrows": "asynccoord.backends.sqlite",
    "asynccoord.locks.guard": "asynccoord.locks",
    "asynccoord.locks.handle": "asynccoord.locks",
    "asynccoord.locks.localqueue": "asynccoord.locks",
    "asynccoord.locks.poolline": "asynccoord.locks",
    "asynccoord.locks.poolturns": "asynccoord.locks",
    "asynccoord.locks.watchdogrenew": "asynccoord.locks",
    "asynccoord.locks.watchdogstats": "asynccoord.locks",
    "asynccoord.locks.watchdogtask": "asynccoord.locks",
    "asynccoord.membershipbeats": "asynccoord",
    "asynccoord.membershipchanges": "asynccoord",
    "asynccoord.membershipstats": "asynccoord",
    "asynccoord.membershipview": "asynccoord",
    "asynccoord.monitor.flushing": "asynccoord.monitor",
    "asynccoord.monitor.incidents": "asynccoord.monitor",
    "asynccoord.monitor.judging": "asynccoord.monitor",
    "asynccoord.monitor.leadership": "asynccoord.monitor",
}
"""Parts of a module split by concept, and the package that may import them: the rest of the
code imports the public module that re-exports their names (``asynccoord.locks.lock``...)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def imported_modules(name: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The package's modules an import statement of module ``name`` names."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in MODULES:
                yield alias.name
        return
    if node.level:
        base = name.split(".") if is_package(name) else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, node.module] if node.module else base)
    else:
        target = node.module or ""
    if target not in MODULES:
        return
    names = [f"{target}.{alias.name}" for alias in node.names]
    submodules = [n for n in names if n in MODULES]
    yield from submodules
    if len(submodules) < len(names):  # an attribute of the module (or package) itself
        yield target


def module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports run when the module is imported: at top level, and in top-level if/try blocks."""
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        stmt = pending.pop()
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            yield stmt
        elif isinstance(stmt, ast.If | ast.Try):
            pending.extend(stmt.body)
            pending.extend(stmt.orelse)
            if isinstance(stmt, ast.Try):
                pending.extend(stmt.finalbody)
                for handler in stmt.handlers:
                    pending.extend(handler.body)


def parse(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"), filename=str(MODULES[name]))


def module_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        tree = parse(name)
        graph[name] = {t for node in module_level_imports(tree) for t in imported_modules(name, node)} - {name}
    return graph


def all_imports(name: str) -> set[str]:
    tree = parse(name)
    return {
        t
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for t in imported_modules(name, node)
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, 1972)."""
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


def test_the_graph_sees_the_imports() -> None:
    """The parser finds real edges (a check that cannot pass on an empty graph)."""
    graph = module_graph()
    assert "asynccoord.backends.base" in graph["asynccoord.backends.sqlite.queue"]
    assert "asynccoord.backends.sqlite.commit" in graph["asynccoord.backends.sqlite.queue"]
    assert "asynccoord.contract.queue" in graph["asynccoord.backends.base"]
    assert "asynccoord.backends.sqlite.writer" in graph["asynccoord.backends.sqlite.locks"]  # under TYPE_CHECKING
    assert "asynccoord.locks.handle" in graph["asynccoord.locks.lock"]
    assert "asynccoord.locks.poolline" in graph["asynccoord.locks.pool"]
    assert "asynccoord.locks.watchdogtask" in graph["asynccoord.locks.watchdog"]
    assert "asynccoord.monitor.judging" in graph["asynccoord.monitor.monitor"]
    assert "asynccoord.membershipview" in graph["asynccoord.membership"]
    assert "asynccoord.backends.redisconn" in graph["asynccoord.backends.redis"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    assert cycles(module_graph()) == []


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not n.startswith("asynccoord.backends")))
def test_upper_layers_use_only_the_entry_points_of_backends(name: str) -> None:
    """Outside ``asynccoord.backends`` nothing imports an engine's internals, only open_store and store classes."""
    reached = {t for t in all_imports(name) if t.startswith("asynccoord.backends")}
    assert reached <= ENTRY_POINTS, sorted(reached - ENTRY_POINTS)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_the_parts_of_a_split_module_are_imported_only_within_their_package(name: str) -> None:
    """``Lock`` is imported from ``asynccoord.locks.lock``, not from the module that holds its machinery."""
    reached = {t for t in all_imports(name) if t in INNER_MODULES and not name.startswith(INNER_MODULES[t] + ".")}
    assert reached == set(), sorted(reached)


def test_the_parts_of_split_modules_exist() -> None:
    assert set(INNER_MODULES) <= set(MODULES)


@pytest.mark.parametrize("layer", ["asynccoord.node", "asynccoord.locks", "asynccoord.monitor"])
def test_node_locks_and_monitor_depend_on_the_contract_not_on_an_engine(layer: str) -> None:
    members = [n for n in MODULES if n == layer or n.startswith(layer + ".")]
    assert members
    for name in members:
        reached = sorted(t for t in all_imports(name) if t.startswith("asynccoord.backends"))
        assert reached == [], (name, reached)


def test_no_module_over_the_line_limit() -> None:
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines()) for path in MODULES.values()
    }
    assert {name: lines for name, lines in sizes.items() if lines > MAX_LINES} == {}


def test_no_import_cycles_in_the_pipeline_counting_function_local_imports() -> None:
    """``asynccoord.node`` counting every import, function-local ones too (the runtime's was one)."""
    node = {name for name in MODULES if name.startswith("asynccoord.node.")}
    assert cycles({name: all_imports(name) & node for name in node}) == []
