"""The peers benchmark's warm rallypoint variant (bench/peers_bench.py, ``rallypoint_warm``):
the process that is killed is the child of a warm launcher (``python -m
rallypoint.worker.warm``, worker/warm.py) started with the trial, and its replacement is the
launcher's restart, forked ``--rejoin-after-s`` after the death from a process that has
imported torch, torch._dynamo and rallypoint's worker already.

The replacement is timed from its fork (``RALLYPOINT_WARM_FORKED_AT``, printed by
bench/peers_worker.py as ``forked``), as the cold one is from the bench starting its process;
its phases are the cold one's names, ``interpreter`` (fork to the script's first line),
``torch`` and ``library`` (imports found done) and ``model`` included. Its CPU is placed as
the cold replacement's (bench/replacement_cpu.py): the launcher is put on the replacement's
CPU at nice -20 before the fork, so the child starts there, and once the child is seen it is
the replacement ``ReplacementCpu`` keeps alone there (its session's autogroup boosted from
then: the child starts a session of its own at the fork, a few milliseconds earlier).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from bench.replacement_cpu import ReplacementCpu, process_tree, set_cpus, set_nice

if TYPE_CHECKING:
    from bench.peers_bench import Worker

WARM_SYSTEM = "rallypoint_warm"
Event = dict[str, Any]


def launcher_command(restart_delay_s: float) -> list[str]:
    """The warm launcher's command line up to the script: one restart, after the delay."""
    return [
        sys.executable,
        "-m",
        "rallypoint.worker.warm",
        "--restarts=1",
        f"--restart-delay={restart_delay_s:g}",
        "--",
    ]


def child_of(launcher: Worker, not_pid: int | None = None) -> int | None:
    """The launcher's running child (other than ``not_pid``), None while it has none."""
    children = [pid for pid in process_tree(launcher.proc.pid)[1:] if pid != not_pid]
    return children[0] if children else None


def crash(launcher: Worker, timeout_s: float) -> int:
    """SIGKILL the launcher's child (the training process, not the launcher); its pid."""
    deadline = time.monotonic() + timeout_s
    while (child := child_of(launcher)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm launcher of {launcher.name} has no child")
        time.sleep(0.01)
    os.kill(child, signal.SIGKILL)
    return child


class WarmChild:
    """The launcher's restarted child, read as a worker of its own: the events its launcher's
    output carried after ``after_t`` (the kill; every earlier one is its predecessor's)."""

    def __init__(self, launcher: Worker, after_t: float) -> None:
        self.launcher, self.after_t = launcher, after_t
        self.index, self.name, self.proc = launcher.index, launcher.name, launcher.proc

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.launcher.of(kind) if e["t"] > self.after_t]

    def first(self, kind: str) -> Event | None:
        found = self.of(kind)
        return found[0] if found else None

    @property
    def started_t(self) -> float:
        """The fork's wall clock, as the child printed it."""
        forked = self.first("forked")
        if forked is None:
            raise RuntimeError(f"{self.name}'s restarted child printed no fork time")
        return float(forked["t"])


# How long before the launcher's fork the processes are placed: walking the process trees
# takes milliseconds; the launcher cannot fork before its delay has passed since the kill.
PLACE_AHEAD_S = 0.25


def warm_restart(
    launcher: Worker,
    crashed: int,
    killed_t: float,
    rejoin_after_s: float,
    own_cpu: ReplacementCpu,
    timeout_s: float,
) -> WarmChild:
    """Place the launcher so that its next fork starts on the replacement's CPU, wait for
    the fork, and hand the child to ``own_cpu`` as the replacement (module docstring). The
    placement is made just before the fork, as the cold replacement's is just before its
    start: the survivors share every CPU until then in both."""
    time.sleep(max(0.0, killed_t + rejoin_after_s - PLACE_AHEAD_S - time.time()))
    own_cpu.before_start([os.getpid()])
    if own_cpu.cpu is not None:
        set_cpus(launcher.proc.pid, {own_cpu.cpu})
        own_cpu.boosted = set_nice(launcher.proc.pid, own_cpu.NICE)
    deadline = time.monotonic() + timeout_s
    while (child := child_of(launcher, not_pid=crashed)) is None:
        if launcher.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the warm launcher of {launcher.name} made no new child")
        time.sleep(0.001)
    own_cpu.started(child)
    if own_cpu.cpu is not None:
        set_nice(launcher.proc.pid, own_cpu.nice)  # inherited by the child already
    return WarmChild(launcher, killed_t)
