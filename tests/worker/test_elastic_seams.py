"""The elastic loop's modules reach each other only through public names: no module of
worker/elastic/ (or the join routine it shares with the torchrun backend) reads or writes
another object's private attribute (``round_._ended``) or imports a private name. And no
module of the worker reaches into torch's private modules or names but
worker/torch_compat.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rallypoint.worker import elastic, joining

MODULES = sorted(
    [*Path(elastic.__file__).parent.glob("*.py"), Path(joining.__file__)], key=lambda p: p.name
)


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.name)
def test_no_private_names_across_objects_or_modules(module: Path) -> None:
    found = []
    for node in ast.walk(ast.parse(module.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and private(node.attr)
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"line {node.lineno}: .{node.attr}")
        if isinstance(node, ast.ImportFrom):
            module_name = node.module or ""
            if any(private(part) for part in module_name.split(".")):
                found.append(f"line {node.lineno}: from {module_name}")
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if private(a.name)]
    assert not found, f"{module.name}: {found}"


WORKER = Path(joining.__file__).parent


def torch_private_uses(source: str) -> list[str]:
    """Imports from a private torch module or of a private torch name, and ``torch._x``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".")
            names = [alias.name for alias in node.names]
            if parts[0] == "torch" and any(private(name) for name in [*parts, *names]):
                found.append(f"line {node.lineno}: from {node.module}")
        if isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {alias.name}"
                for alias in node.names
                if alias.name.split(".")[0] == "torch"
                and any(private(part) for part in alias.name.split("."))
            ]
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "torch"
            and private(node.attr)
        ):
            found.append(f"line {node.lineno}: torch.{node.attr}")
    return found


@pytest.mark.parametrize(
    "module",
    sorted(p for p in WORKER.rglob("*.py") if p.name != "torch_compat.py"),
    ids=lambda p: str(p.relative_to(WORKER)),
)
def test_torch_private_apis_only_through_torch_compat(module: Path) -> None:
    assert torch_private_uses(module.read_text()) == []


def test_the_torch_check_sees_a_private_use() -> None:
    assert torch_private_uses(
        "from torch._C._distributed_c10d import Store\nimport torch\ntorch._C.x()\n"
    ) == ["line 1: from torch._C._distributed_c10d", "line 3: torch._C"]
