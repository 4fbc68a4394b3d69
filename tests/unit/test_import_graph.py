"""The import graph of ``src/delayq``: no circle, layers that stack.

Every ``import`` counts, at the top of a module or inside a function (a lazy
import is still a dependency), but not those under ``if TYPE_CHECKING:``.
(A module is not counted as depending on its parent packages' ``__init__``: Python
runs those first, whatever the module imports.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import delayq

SRC = Path(delayq.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    return skipped


def imports_of(name: str) -> set[str]:
    """The delayq modules ``name`` makes Python import."""
    tree = ast.parse(MODULES[name].read_text())
    skipped = _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def _circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
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
                circles.append(sorted(component))

    for name in sorted(GRAPH):
        if name not in index:
            visit(name)
    return circles


def test_the_graph_is_read() -> None:
    """Not vacuous: the adapters' known dependencies are seen."""
    assert "delayq.links" in GRAPH["delayq.sync.publisher"]
    assert "delayq.sync.provision" in GRAPH["delayq.sync._link"]
    assert "delayq.testing.broker" in GRAPH["delayq.testing.links"]


def test_there_is_no_import_circle() -> None:
    assert _circles() == []


def test_the_circle_finder_finds_one() -> None:
    GRAPH["delayq.links"].add("delayq.sync.publisher")
    try:
        assert any("delayq.links" in circle for circle in _circles())
    finally:
        GRAPH["delayq.links"].discard("delayq.sync.publisher")


def test_sync_and_aio_and_the_core_import_no_test_double() -> None:
    for name, imported in GRAPH.items():
        if name.startswith("delayq.testing") or name == "delayq.pytest_plugin":
            continue
        assert not {m for m in imported if m.startswith("delayq.testing")}, name


def _client_exception_importers() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            hits = {n for n in names if n in ("pika.exceptions", "aiormq.exceptions")}
            hits |= {n for n in names if n.startswith("aio_pika.exceptions")}
            if hits:
                found.setdefault(name, set()).update(hits)
    return found


def test_each_adapter_translates_client_errors_in_one_module() -> None:
    """pika's exceptions are named only in ``sync/_errors.py``, aiormq's and aio-pika's
    only in ``aio/_errors.py``: every other module asks those what an error means."""
    assert _client_exception_importers() == {
        "delayq.sync._errors": {"pika.exceptions"},
        "delayq.aio._errors": {"aiormq.exceptions"},
    }
