"""``rallypoint cluster up`` with a member killed under it, then stopped with Ctrl-C: the
exit is said once (it was said every 0.2 s until the cluster stopped, 152 lines in 50 s), and
stopping logs neither a never-retrieved future nor "member N is starting" for a member that
is shutting down."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .harness import free_port_block, kill_processes_mentioning, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CLUSTER_UP = [sys.executable, "-m", "rallypoint.coordinator", "cluster", "up", "--nodes", "3"]
# The line that says member 2 ended (today's words, and those of the code before).
EXIT_SAID = re.compile(r"^rallypoint: member 2 (?:was killed|exited)", re.MULTILINE)


def _member_pid(base_port: int, member_id: int) -> int | None:
    """The pid of the ``serve`` process of ``member_id`` in the cluster on ``base_port``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        client = f"--client-address=127.0.0.1:{base_port + 2 * (member_id - 1)}".encode()
        if b"serve" in argv and client in argv:
            return int(entry)
    return None


def test_a_killed_member_is_said_once_and_stopping_is_quiet(tmp_path: Path) -> None:
    base_port = free_port_block(6)
    output = tmp_path / "cluster-up.log"
    with open(output, "w") as out:
        up = subprocess.Popen(
            [*CLUSTER_UP, "--base-port", str(base_port), "--tick-ms", "50"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TMPDIR": tempfile.mkdtemp(dir=tmp_path)},
        )
    try:
        wait_until(lambda: "members up" in output.read_text(), 60, "the cluster up")
        victim = _member_pid(base_port, 2)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: EXIT_SAID.search(output.read_text()), 20, "the exit said")
        # The loop polls every 0.2 s: a second of it would have said the exit five times
        # more. (Not a race being hidden: nothing is awaited, a repetition is looked for.)
        time.sleep(1.0)
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        kill_processes_mentioning(f"--client-address=127.0.0.1:{base_port}")
    text = output.read_text()
    assert len(EXIT_SAID.findall(text)) == 1, text
    assert "rallypoint: member 2 was killed (SIGKILL); the others go on without it" in text
    assert "Future exception was never retrieved" not in text, text
    stopping = text[text.index("shutting down") :] if "shutting down" in text else ""
    assert "is starting" not in stopping, text
