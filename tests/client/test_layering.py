"""The client's modules form a tree: no import cycle, not even one hidden behind
``TYPE_CHECKING`` or a function-level import, and only the top (``aio.py``, the blocking
wrappers, the package) knows the :class:`Client`. The parts reach the cluster through the
:class:`Caller` they are given; every loop that retries uses the one retry policy, and every
blocking view the one helper. Read from the source (AST), so a cycle that happens to import
fine still fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import rallypoint.client

CLIENT = Path(rallypoint.client.__file__).resolve().parent
PACKAGE = "rallypoint.client"
# The only modules allowed to import aio.py (the Client): what is above it.
ABOVE_THE_CLIENT = {"__init__", "sync"}
# The parts the Client is made of, given the Caller and never the Client.
PARTS = {"jobs", "checkpoints", "roundstore", "rendezvous", "lease", "watch", "heartbeats"}


def modules() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text()) for path in sorted(CLIENT.glob("*.py"))}


def sibling_imports(name: str, tree: ast.Module) -> set[str]:
    """The client modules ``name`` imports, anywhere in its source (type-checking blocks and
    functions included)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                base = node.module
            elif node.level == 0 and node.module and node.module.startswith(PACKAGE):
                base = node.module[len(PACKAGE) :].lstrip(".") or None
            else:
                continue
            if base is None:  # from . import a, b
                found |= {alias.name for alias in node.names}
            else:
                found.add(base.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    found.add(alias.name[len(PACKAGE) + 1 :].split(".")[0])
    return found - {name}


def import_graph() -> dict[str, set[str]]:
    trees = modules()
    return {name: sibling_imports(name, tree) & set(trees) for name, tree in trees.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as a path that starts and ends at one module, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for successor in sorted(graph[node]):
            cycle = visit(successor, [*path, node])
            if cycle is not None:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start, [])
        if cycle is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_a_hidden_cycle() -> None:
    # The shape the client had: aio imports jobs, jobs imports aio under TYPE_CHECKING.
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .aio import Client\n"
    hidden = sibling_imports("jobs", ast.parse(source))
    assert hidden == {"aio"}
    assert find_cycle({"aio": {"jobs"}, "jobs": hidden}) == ["aio", "jobs", "aio"]
    assert find_cycle({"aio": {"jobs"}, "jobs": set()}) is None


def test_the_client_modules_have_no_import_cycle() -> None:
    graph = import_graph()
    assert PARTS | {"aio", "caller", "transport", "sync", "sync_rendezvous"} <= set(graph)
    assert find_cycle(graph) is None


def test_only_the_top_knows_the_client() -> None:
    importers = {name for name, imported in import_graph().items() if "aio" in imported}
    assert importers <= ABOVE_THE_CLIENT, importers - ABOVE_THE_CLIENT


def test_the_caller_sits_under_the_parts() -> None:
    graph = import_graph()
    assert {"jobs", "checkpoints", "roundstore", "rendezvous", "lease"} <= {
        name for name, imported in graph.items() if "caller" in imported
    }
    # The caller knows none of the parts, so none of them can reach back through it.
    assert not graph["caller"] & (PARTS | {"aio", "sync", "sync_rendezvous"})


def classes_defining(method: str) -> list[str]:
    return sorted(
        f"{name}.{node.name}"
        for name, tree in modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(
            isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == method
            for item in node.body
        )
    )


def functions_named(function: str) -> list[str]:
    return sorted(
        name
        for name, tree in modules().items()
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") == function
    )


def test_one_retry_policy() -> None:
    assert classes_defining("after_failure") == ["transport.Retrier"]
    assert classes_defining("delay_s") == ["backoff.Backoff", "transport.Retrier"]


def test_one_blocking_helper() -> None:
    assert functions_named("blocking") == ["blocking"]
