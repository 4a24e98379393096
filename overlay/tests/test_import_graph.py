"""No import circles inside deepinfer_sm80: the module import graph, built statically with `ast` from
every import statement (module level, inside functions, under `if TYPE_CHECKING:`), has no strongly
connected component of more than one module. A lazy import that closes a circle counts as one: moving
an import into a function hides the circle from Python, not from this test.

An edge goes to the most specific module an import names: `from a.b import c` is an edge to `a.b.c`
when that is a module of the package, else to `a.b`. The implicit import of parent packages (`import
a.b.c` runs `a/__init__.py`) is not an edge, so a package `__init__` that re-exports its submodules
does not by itself make a circle."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepinfer_sm80.testing.imports import import_statements, module_name

PACKAGE = Path(__file__).resolve().parents[1] / "deepinfer_sm80"
ROOT = PACKAGE.name


def package_modules() -> dict[str, Path]:
    return {module_name(p, PACKAGE.parent): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(source: str, module: str, is_package: bool, modules: set[str]) -> dict[str, int]:
    """The package modules `source`'s import statements load, each with the first line importing it.
    `from X import y` is an edge to `X.y` when that is a module, else to `X`."""
    edges: dict[str, int] = {}
    for line, base, names in import_statements(source, module, is_package):
        targets = [f"{base}.{n}" if f"{base}.{n}" in modules else base for n in names] or [base]
        for name in targets:
            if name in modules and name != module:
                edges[name] = min(edges.get(name, line), line)
    return edges


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {package module it imports: first line importing it}."""
    modules = package_modules()
    return {
        mod: imported_modules(path.read_text(), mod, path.name == "__init__.py", set(modules))
        for mod, path in modules.items()
    }


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop(0)
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, {}))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def describe(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    """The component's edges, as 'a:line -> b', so the failure names where each circle closes."""
    members = set(component)
    edges = [f"{a}:{graph[a][b]} -> {b}" for a in component for b in sorted(graph[a]) if b in members]
    return "{" + ", ".join(component) + "}: " + "; ".join(edges)


def test_graph_sees_the_package():
    """Every module is a node; lazy imports are edges (the oracle's `__init__` re-exports `model`)."""
    graph = import_graph()
    assert len(graph) == len(list(PACKAGE.rglob("*.py"))) > 100
    assert f"{ROOT}.testing.oracle.model" in graph[f"{ROOT}.testing.oracle"]
    lazy = f"{ROOT}.device"  # imported inside startup_notes only
    assert lazy in graph[f"{ROOT}.integration.attention_select"]


@pytest.mark.parametrize(
    ("source", "module", "is_package", "expected"),
    [
        ("import deepinfer_sm80.a.b", "deepinfer_sm80.x", False, {"deepinfer_sm80.a.b"}),
        ("from deepinfer_sm80.a import b", "deepinfer_sm80.x", False, {"deepinfer_sm80.a.b"}),
        ("from deepinfer_sm80.a import f", "deepinfer_sm80.x", False, {"deepinfer_sm80.a"}),
        ("def g():\n    from .a import f\n", "deepinfer_sm80.x", False, {"deepinfer_sm80.a"}),
        ("from ..a import b", "deepinfer_sm80.p.x", False, {"deepinfer_sm80.a.b"}),
        ("from .x import f", "deepinfer_sm80.p", True, {"deepinfer_sm80.p.x"}),
        ("from . import x", "deepinfer_sm80.p", True, {"deepinfer_sm80.p.x"}),
    ],
)
def test_edges_resolve(source, module, is_package, expected):
    modules = {"deepinfer_sm80.a", "deepinfer_sm80.a.b", "deepinfer_sm80.p", "deepinfer_sm80.p.x"}
    assert set(imported_modules(source, module, is_package, modules)) == expected


def test_components_found():
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1, "d": 1}, "d": {}, "e": {"e": 1}}
    assert strongly_connected(graph) == [["a", "b", "c"]]


def test_no_import_circles():
    graph = import_graph()
    circles = [describe(c, graph) for c in strongly_connected(graph)]
    assert not circles, "import circles in deepinfer_sm80:\n" + "\n".join(circles)
