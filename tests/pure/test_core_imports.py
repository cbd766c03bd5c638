"""The pure core's modules import each other in one direction: no circle (issue #32,
item 9: work.py and failure.py used to import each other). Read from the source, so
an import inside a function counts too. Pure: no server."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import actors.core

pytestmark = [pytest.mark.timeout(30)]

CORE = Path(actors.core.__file__).parent
PACKAGE = "actors.core"


def core_imports(source: str) -> set[str]:
    """The actors.core modules a module's source imports (by module name under actors.core)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name.removeprefix(f"{PACKAGE}.") for a in node.names if a.name.startswith(f"{PACKAGE}.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module == PACKAGE:  # from actors.core import failure
                found |= {a.name for a in node.names}
            elif node.module.startswith(f"{PACKAGE}."):
                found.add(node.module.removeprefix(f"{PACKAGE}.").split(".")[0])
    return found


def graph() -> dict[str, set[str]]:
    return {p.stem: core_imports(p.read_text()) - {p.stem} for p in CORE.glob("*.py")}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports, as the modules along it (the first repeated at the end), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for nxt in sorted(edges.get(node, ())):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(edges):
        found = visit(start, [])
        if found:
            return found
    return None


def test_the_finder_sees_a_circle_and_every_import_form() -> None:
    assert cycle({"work": {"failure"}, "failure": {"decision", "work"}, "decision": set()}) == [
        "failure",
        "work",
        "failure",
    ]
    assert cycle({"work": {"failure"}, "failure": {"decision"}, "decision": set()}) is None
    source = "from actors.core import failure\nimport actors.core.state\ndef f():\n    from actors.core.work import x\n"
    assert core_imports(source) == {"failure", "state", "work"}


def test_the_core_modules_import_each_other_in_one_direction() -> None:
    edges = graph()
    assert {"work", "failure", "attempt", "effects", "decide"} <= set(edges)
    assert "work" not in edges["failure"]  # failure returns what follows; work applies it
    assert cycle(edges) is None, " -> ".join(cycle(edges) or [])
