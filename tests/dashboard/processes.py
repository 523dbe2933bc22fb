"""The processes the dashboard tests run: ``rallypoint dashboard`` and elastic workers.

The dashboard is started as users start it (``python -m rallypoint.coordinator dashboard``,
on port 0) and its address read from the line it prints. Workers are the demo's
(``rallypoint.worker.demo_train``): real training processes with gloo process groups that
join, heartbeat and re-form in place.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from tests.integration.harness import wait_until

DASHBOARD_START_S = 30.0


@contextlib.contextmanager
def dashboard(endpoints: list[str], log_dir: Path, poll_s: float = 0.5) -> Iterator[str]:
    """A running dashboard of the cluster at ``endpoints``; yields its base URL."""
    log_path = log_dir / "dashboard.err"
    with open(log_path, "w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rallypoint.coordinator",
                "dashboard",
                f"--endpoints={','.join(endpoints)}",
                "--listen=127.0.0.1:0",
                f"--poll={poll_s}",
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        first = wait_until(
            lambda: lines[:1] or proc.poll() is not None,
            DASHBOARD_START_S,
            "the dashboard's address",
        )
        assert first is not True and proc.poll() is None, log_path.read_text()[-3000:]
        line = lines[0].strip()
        assert line.startswith("rallypoint dashboard: http://"), line
        yield line.split(": ", 1)[1].rstrip("/")
    finally:
        proc.kill()
        proc.wait()
        reader.join(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


class Workers:
    """Demo training processes of one job; each one's stdout (JSON events) in a file."""

    def __init__(self, endpoints: list[str], job: str, root: Path) -> None:
        self.endpoints = endpoints
        self.job = job
        self.root = root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        with (
            open(self.root / f"{name}.out", "wb") as stdout,
            open(self.root / f"{name}.err", "wb") as stderr,
        ):
            self.procs[name] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rallypoint.worker.demo_train",
                    f"--endpoints={','.join(self.endpoints)}",
                    f"--job={self.job}",
                    f"--name={name}",
                    f"--checkpoint-dir={self.root / 'checkpoints'}",
                    "--checkpoint-every=20",
                    "--step-sleep-s=0.05",
                ],
                stdout=stdout,
                stderr=stderr,
                env=env,
            )

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.kill()
        proc.wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait()

    def stderr_tails(self) -> str:
        return "\n".join(
            f"--- {name} ---\n" + (self.root / f"{name}.err").read_text(errors="replace")[-2000:]
            for name in self.procs
        )
