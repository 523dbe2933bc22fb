"""The import-layer contracts (pyproject.toml, [tool.importlinter]) hold for the tree, and each
one catches the violation it exists for.

``make lint`` runs ``lint-imports`` on the tree; a contract that is mistyped (a module name
that matches nothing, an ignore that hides too much) would pass there forever. So each case
here copies the package folders, adds one forbidden import to one module, and expects that
contract, by id, to break and to name the module.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .layout import ROOT, pyproject

# `lint-imports`, as the interpreter running the tests has it (import-linter is in the dev extra).
LINT = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"

# (contract id, file to change, import added, module the report must name)
VIOLATIONS = [
    ("raft-core", "raft/log.py", "import time", "rallypoint.raft.log"),
    ("raft-core", "raft/quorum/majority.py", "import asyncio", "rallypoint.raft.quorum.majority"),
    ("raft-core", "raft/storage/wal.py", "import grpc", "rallypoint.raft.storage.wal"),
    (
        "raft-storage",
        "raft/raft.py",
        "from rallypoint.raft.storage import wal",
        "rallypoint.raft.raft",
    ),
    ("client", "client/values.py", "import torch", "rallypoint.client.values"),
    ("client", "client/backoff.py", "import uvloop", "rallypoint.client.backoff"),
    ("layers", "client/aio.py", "from rallypoint.raft import types", "rallypoint.client.aio"),
    ("layers", "proto/v1/__init__.py", "from rallypoint import client", "rallypoint.proto.v1"),
    ("state-machine", "coordinator/state/kv.py", "import time", "rallypoint.coordinator.state.kv"),
    (
        "state-machine",
        "coordinator/state/sessions.py",
        "import os",
        "rallypoint.coordinator.state.sessions",
    ),
    (
        "state-machine",
        "coordinator/state/machine.py",
        "from rallypoint.coordinator.leader import lessor",
        "rallypoint.coordinator.state.machine",
    ),
    (
        "cli-client-commands",
        "coordinator/cli/jobs.py",
        "from rallypoint.coordinator import daemon",
        "rallypoint.coordinator.cli.jobs",
    ),
    (
        "cli",
        "coordinator/cli/main.py",
        "from rallypoint.coordinator.state import machine",
        "rallypoint.coordinator.cli.main",
    ),
    (
        "worker",
        "worker/sampler.py",
        "from rallypoint.raft import types",
        "rallypoint.worker.sampler",
    ),
    (
        "worker",
        "worker/elastic/run.py",
        "from rich.console import Console",
        "rallypoint.worker.elastic.run",
    ),
    # acyclic: the report names the package whose children import each other in a circle.
    (
        "acyclic",
        "raft/log.py",
        "from rallypoint.raft import raft",
        "No cycles are allowed in rallypoint.raft.",
    ),
    (
        "acyclic",
        "client/backoff.py",
        "from rallypoint.client import aio",
        "No cycles are allowed in rallypoint.client.",
    ),
    (
        "acyclic",
        "coordinator/state/view.py",
        "from rallypoint.coordinator.state import machine",
        "No cycles are allowed in rallypoint.coordinator.state.",
    ),
    (
        "acyclic",
        "coordinator/node/peer_face.py",
        "from rallypoint.coordinator.node import driver",
        "No cycles are allowed in rallypoint.coordinator.node.",
    ),
    (
        "acyclic",
        "worker/snapshots/restore.py",
        "from rallypoint.worker import checkpoint",
        "No cycles are allowed in rallypoint.worker.",
    ),
]


def lint_imports(tree: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    # Only the copy's view of the package on the path: never this checkout's nor an install's.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tree / ".pkgview")
    command = [sys.executable, "-c", LINT, "--no-cache"]
    for contract in contracts:
        command += ["--contract", contract]
    return subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A copy of pyproject.toml and the package folders, with its own .pkgview/."""
    if importlib.util.find_spec("importlinter") is None:
        pytest.fail("import-linter is not installed: it is in the dev extra (make setup)")
    copy = tmp_path_factory.mktemp("layers")
    shutil.copy2(ROOT / "pyproject.toml", copy / "pyproject.toml")
    view = copy / ".pkgview" / "rallypoint"
    view.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__")
    for package, folder in pyproject()["tool"]["setuptools"]["package-dir"].items():
        if package.count(".") == 1:
            shutil.copytree(ROOT / folder, copy / folder, ignore=ignore)
            os.symlink(copy / folder, view / package.partition(".")[2])
    yield copy


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    result = lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    declared = {contract["id"] for contract in pyproject()["tool"]["importlinter"]["contracts"]}
    assert {violation[0] for violation in VIOLATIONS} == declared, "a contract without a case"


@pytest.mark.parametrize(("contract", "path", "statement", "module"), VIOLATIONS)
def test_a_forbidden_import_breaks_its_contract(
    tree: Path, contract: str, path: str, statement: str, module: str
) -> None:
    source = tree / path
    original = source.read_text()
    source.write_text(original + f"\n{statement}  # added by the test\n")
    try:
        result = lint_imports(tree, contract)
    finally:
        source.write_text(original)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    assert module in result.stdout
