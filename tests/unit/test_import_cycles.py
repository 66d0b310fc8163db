"""
No import cycle anywhere in kestrel: not at module level, not inside functions,
not under C{if TYPE_CHECKING:}.

The graph is read from the source with C{ast} (nothing is imported): an edge
C{a -> b} for every C{import} or C{from ... import} statement of module C{a}
that names module C{b} of the package, wherever the statement stands. A cycle
hidden in a function body or behind C{TYPE_CHECKING} still ties two modules
together (neither can be understood, typed or moved without the other), so it
counts as a cycle here.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kestrel"


def module_name(path: Path) -> str:
    """The dotted name of a source file of the package (a package is its C{__init__})."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(module: str, source: str | None = None) -> set[str]:
    """
    The kestrel modules that C{module} imports anywhere in its source (module
    level, function bodies, C{TYPE_CHECKING} blocks), self excluded.

    For C{from a import b}, the edge goes to C{a.b} when that is a module of
    the package, else to C{a}. Relative imports are resolved against the module's
    package. C{source} replaces the file's text (for the checks of this test).
    """
    path = MODULES[module]
    text = path.read_text() if source is None else source
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parents = package.split(".")
                parents = parents[:len(parents) - node.level + 1]
                base = ".".join(parents + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                names.add(full if full in MODULES else base)
    return {n for n in names if n in MODULES and n != module}


def import_graph() -> dict[str, set[str]]:
    """Every import edge between kestrel's modules."""
    return {module: imported_modules(module) for module in MODULES}


def strongly_connected(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found, key=sorted)


def test_no_import_cycle_anywhere() -> None:
    """No two kestrel modules import each other, directly or round a longer loop."""
    assert [sorted(c) for c in strongly_connected(import_graph())] == []


def test_the_graph_sees_every_kind_of_import() -> None:
    """Module-level, function-level, TYPE_CHECKING and relative imports all make edges."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "import kestrel.errors\n"
        "from kestrel import names\n"
        "from kestrel.config import parse_config\n"
        "from . import item\n"
        "if TYPE_CHECKING:\n"
        "    from kestrel.status import Status\n"
        "def f():\n"
        "    from kestrel.client.fleet import KestrelClient\n"
        "class C:\n"
        "    def g(self):\n"
        "        import kestrel.metrics\n"
    )
    assert imported_modules("kestrel.stats", source) == {
        "kestrel.errors", "kestrel.names", "kestrel.config", "kestrel.item",
        "kestrel.status", "kestrel.client.fleet", "kestrel.metrics"}
    assert "kestrel.client.stream" in import_graph()["kestrel.client.fleet"]
    assert "kestrel.config.values" in import_graph()["kestrel.config.schema"]


def test_the_cycle_search_finds_cycles() -> None:
    """A loop of three, a pair and an acyclic tail are told apart."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"a"}}
    assert strongly_connected(graph) == [frozenset("abc"), frozenset("de")]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []
