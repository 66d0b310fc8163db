"""
Import checks that keep the layers' arrows pointing down (docs/architecture.md).

Read from the source with C{ast}, nothing is imported: a module below the
protocols never imports a protocol module, thriftpy2 or the global reactor
(anywhere in the module, functions included). Import cycles, of every kind
of import, are checked by C{test_import_cycles}.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

import pytest

from tests.unit.test_import_cycles import MODULES, PACKAGE

#: The modules below the protocols (a package name covers its submodules).
LOWER = ("kestrel.queue", "kestrel.journal", "kestrel.collection", "kestrel.config",
         "kestrel.session", "kestrel.server", "kestrel.status", "kestrel.stats",
         "kestrel.names", "kestrel.item", "kestrel.waiters", "kestrel.queue_health",
         "kestrel.queue_policy", "kestrel.queue_stats", "kestrel.queue_observer",
         "kestrel.open_reads", "kestrel.read_behind", "kestrel.queue_replay",
         "kestrel.unsynced")

#: What a lower module may never import (a name covers its submodules).
FORBIDDEN = ("kestrel.protocols", "thriftpy2", "twisted.internet.reactor")




def is_type_checking(test: ast.expr) -> bool:
    """Whether an C{if} test is C{TYPE_CHECKING} (or C{typing.TYPE_CHECKING})."""
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imports(node: ast.AST, *, in_functions: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """
    The import statements run by C{node}, leaving out C{if TYPE_CHECKING:}
    bodies and, unless C{in_functions}, function bodies.
    """
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and is_type_checking(child.test):
            for other in child.orelse:
                yield from imports(ast.Module(body=[other], type_ignores=[]),
                                   in_functions=in_functions)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if in_functions:
                yield from imports(child, in_functions=in_functions)
        else:
            yield from imports(child, in_functions=in_functions)


def imported_names(module: str, *, in_functions: bool) -> set[str]:
    """
    The dotted names C{module} imports: for C{from a import b}, C{a.b} when
    that is a module of the package (or the global reactor), else C{a}.
    """
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in imports(tree, in_functions=in_functions):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            parent = package.split(".")[:len(package.split(".")) - node.level + 1]
            base = ".".join(parent + ([base] if base else []))
        for alias in node.names:
            full = f"{base}.{alias.name}"
            names.add(full if full in MODULES or full == "twisted.internet.reactor" else base)
    return names


def covered(name: str, prefixes: tuple[str, ...]) -> bool:
    """Whether C{name} is one of C{prefixes} or lies under one."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if covered(m, LOWER)))
def test_lower_layers_import_no_protocol(module: str) -> None:
    """A module below the protocols imports no protocol module, thriftpy2 or the reactor."""
    bad = sorted(n for n in imported_names(module, in_functions=True) if covered(n, FORBIDDEN))
    assert bad == [], f"{module} imports {', '.join(bad)}"


def test_the_checks_see_what_they_look_for() -> None:
    """The checks find an edge and a forbidden import where there is one."""
    assert "kestrel.collection" in imported_names("kestrel.server", in_functions=False)
    assert "kestrel.session" in imported_names("kestrel.server", in_functions=False)
    assert covered("kestrel.protocols.memcache", FORBIDDEN)
    assert "twisted.internet.reactor" in imported_names("kestrel.tap", in_functions=True)
    assert "twisted.internet.reactor" not in imported_names("kestrel.tap", in_functions=False)
    # session.py knows the server only as a SessionHost: no import, not even for types.
    session_imports = [n for n in ast.walk(ast.parse((PACKAGE / "session.py").read_text()))
                       if isinstance(n, ast.ImportFrom | ast.Import)]
    assert session_imports and not any(
        getattr(n, "module", None) == "kestrel.server"
        or any(a.name == "kestrel.server" for a in n.names) for n in session_imports)
    assert set(LOWER) <= {m for m in MODULES if covered(m, LOWER)} | {"kestrel.journal"}
