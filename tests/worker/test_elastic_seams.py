"""The elastic loop's modules reach each other only through public names: no module of
worker/elastic/ (or the join routine it shares with the torchrun backend) reads or writes
another object's private attribute (``round_._ended``), imports a private name, or reaches
into torch's private modules (those go through worker/torch_compat.py)."""

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
