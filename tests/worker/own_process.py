"""Run a test scenario in a process of its own (it may make a process group: torch.distributed
state is per process), and fail with its stderr if it does not end by printing ``ok``.

A scenario that returned leaves with ``os._exit(0)``, skipping the interpreter's teardown: a
gloo worker thread that drops its last finished work (whose tensors hold Python references)
while the interpreter finalizes aborts the process ("terminate called without an active
exception"), a race torch documents by asking for ``destroy_process_group`` at exit. The
scenario's result is what it printed; a failure still raises and exits non-zero."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]


def run_scenario(module: str, function: str, tmp: Path, timeout_s: float = 180) -> None:
    """Call ``module.function(tmp)`` in a new interpreter."""
    code = (
        "import importlib, sys; from pathlib import Path;"
        f" getattr(importlib.import_module({module!r}), {function!r})(Path(sys.argv[1]));"
        " import os; sys.stdout.flush(); sys.stderr.flush(); os._exit(0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp)],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
