"""worker/snapshots/ and worker/checkpoint.py share the state's layout through worker/state_io.py
and import each other in one direction only (checkpoint -> snapshots -> state_io): no import
cycle, not even through an import hidden inside a function, at any depth of worker/.

The cycle check reads the import graph as import-linter does (grimp: every import statement,
function-local ones included); the fresh interpreters show that either module can be the
first one imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

# Every sibling package of worker/ whose children must not import each other in a circle.
CYCLES = """
import sys
import grimp

graph = grimp.build_graph("rallypoint", cache_dir=None)
found = []
for package in sorted(m for m in graph.modules if m.startswith("rallypoint.worker")):
    if graph.find_children(package):
        for importer, imported in sorted(graph.nominate_cycle_breakers(package)):
            found.append(f"{package}: {importer} -> {imported}")
print("\\n".join(found))
sys.exit(1 if found else 0)
"""


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_worker_has_no_import_cycle() -> None:
    # grimp reads the source through the package view `make setup` builds (.pkgview/), the
    # one lint-imports reads (rallypoint is a namespace package mapped from the folders).
    view = ROOT / ".pkgview"
    if not (view / "rallypoint" / "worker").exists():
        pytest.fail(f"{view} is missing: run `make setup`")
    result = _python(CYCLES, PYTHONPATH=str(view))
    assert result.returncode == 0, f"import cycles in worker/:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize(
    "first, second",
    [
        ("rallypoint.worker.snapshots", "rallypoint.worker.checkpoint"),
        ("rallypoint.worker.checkpoint", "rallypoint.worker.snapshots"),
        ("rallypoint.worker.snapshots.restore", "rallypoint.worker.checkpoint"),
        ("rallypoint.worker.state_io", "rallypoint.worker.snapshots.lifecycle"),
    ],
)
def test_snapshots_and_checkpoint_import_in_either_order(first: str, second: str) -> None:
    code = (
        f"import importlib; a = importlib.import_module({first!r}); "
        f"b = importlib.import_module({second!r}); "
        "from rallypoint.worker.checkpoint import restore_state; "
        "from rallypoint.worker.snapshots import MemorySnapshots, restore_from_memory; "
        "print('ok')"
    )
    result = _python(code)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
