"""The peers benchmark's replacement starting on a CPU of its own (bench/peers_bench.py):
on a 2-core machine the only way to give a replacement what its own host would give it."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence


def set_cpus(pid: int, cpus: set[int]) -> None:
    """Let every thread of process ``pid`` run only on ``cpus`` (threads it starts later
    inherit their creator's set). A thread or process that has just exited is skipped."""
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, FileNotFoundError):
            continue


class ReplacementCpu:
    """A replacement's start on a CPU of its own, as it would have on its own host: from
    before it is started until it has made its model and optimizer (its imports and torch's
    start-up), the survivors run on the other CPUs and the replacement on ``cpu``; then
    every one of them may run anywhere again, for the join, the formation and the steps.

    Without it, on this 2-core machine, the replacement's start competes with whichever
    survivors are training: a system whose survivors are still stalled by the kill (torchft
    waits out a 5 s gloo timeout) gives its replacement the machine, one whose survivors
    train again at once (rallypoint) does not, and the rejoin figure measures that instead
    of the replacement's own path. The same for every system."""

    def __init__(self, cpu: int | None) -> None:
        available = os.sched_getaffinity(0)
        self.cpu = cpu if cpu is not None and cpu in available and len(available) > 1 else None
        self.all = available
        self.pinned: list[int] = []
        self.released_t: float | None = None

    def before_start(self, survivors: Sequence[int]) -> None:
        """Before the replacement starts: the survivors' processes off its CPU."""
        if self.cpu is None:
            return
        for pid in survivors:
            set_cpus(pid, self.all - {self.cpu})
            self.pinned.append(pid)

    def started(self, replacement: int) -> None:
        """The replacement's process, just started, on its CPU alone."""
        if self.cpu is None:
            return
        set_cpus(replacement, {self.cpu})
        self.pinned.append(replacement)

    def release(self) -> None:
        """Every process pinned may run on every CPU again (once; later calls: nothing)."""
        if self.cpu is None or self.released_t is not None:
            return
        for pid in self.pinned:
            set_cpus(pid, self.all)
        self.released_t = time.time()
