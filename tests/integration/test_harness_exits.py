"""The harness tells a member's own exit (a crash: the fault-injection runs' ``members``
checker fails on it) from an exit it caused or expects: a stop or kill, and a refusal to
start on a log it damaged, even when the refusal is seen before the harness looked for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.integration.harness import ProcessCluster


def exiting(code: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    proc.wait()
    return proc


def test_an_expected_refusal_is_not_an_exit_of_its_own(tmp_path: Path) -> None:
    cluster = ProcessCluster(tmp_path, size=3)
    crashed, refusing, stopped = cluster.members[1], cluster.members[2], cluster.members[3]
    crashed.proc = exiting(70)
    refusing.proc, refusing.expected_exit_code = exiting(2), 2
    stopped.proc, stopped.stopped = exiting(1), True
    assert cluster.exited_on_their_own() == {1: 70}
    # Any other code from a member expected to refuse is its own doing.
    refusing.proc = exiting(70)
    assert cluster.exited_on_their_own() == {1: 70, 2: 70}
