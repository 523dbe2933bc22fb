"""The peers benchmark's replacement starting on a CPU of its own (bench/peers_bench.py):
on a 2-core machine the only way to give a replacement what its own host would give it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


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


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process descended from it (gone ones left out), parents first."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        children: set[int] = set()
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                text = Path(f"/proc/{current}/task/{task}/children").read_text()
                children.update(int(part) for part in text.split())
        except OSError:
            continue  # exited meanwhile
        found.append(current)
        queue.extend(sorted(children))
    return found


def set_nice(pid: int, nice: int) -> bool:
    """Give every thread of process ``pid`` the nice value ``nice`` (Linux keeps it per
    thread; threads started later inherit their creator's). False if not permitted."""
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return True
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            continue
        except PermissionError:
            return False
    return True


def set_group_nice(pid: int, nice: int) -> bool | None:
    """Give the scheduler's autogroup of ``pid`` (its session's) the nice value ``nice``:
    with autogroups on, CPU time is shared between sessions first, so a thread's own nice
    counts only inside its session. None if the kernel has no autogroups (or they are off),
    False if not permitted."""
    try:
        if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() != "1":
            return None
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except FileNotFoundError:
        return None
    except (PermissionError, OSError):
        return False
    return True


def allowed_cpus(pid: int) -> set[int]:
    """The CPUs any thread of ``pid`` may run on (empty once it has exited)."""
    cpus: set[int] = set()
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return cpus
    for tid in threads:
        try:
            cpus |= os.sched_getaffinity(int(tid))
        except (ProcessLookupError, FileNotFoundError):
            continue
    return cpus


def command_name(pid: int) -> str:
    """What a process is, for the record: its program and first arguments, shortened."""
    try:
        parts = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [Path(parts[0].decode(errors="replace")).name]
    words += [p.decode(errors="replace") for p in parts[1:4] if p]
    return " ".join(words)[:80]


def run_and_wait_s(pid: int) -> tuple[float, float] | None:
    """CPU time and run-queue wait (seconds) of every live thread of ``pid`` so far, from
    /proc/PID/task/TID/schedstat (None if the kernel does not keep it)."""
    ran = waited = 0.0
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return None
    for tid in threads:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except OSError:
            continue
        ran, waited = ran + int(fields[0]) / 1e9, waited + int(fields[1]) / 1e9
    return ran, waited


class ReplacementCpu:
    """A replacement's start on a CPU of its own, as it would have on its own host: from
    before it is started until it has made its model and optimizer (its imports and torch's
    start-up), it runs on ``cpu`` and every other process the benchmark started (the
    survivors, the coordinator's members or torchft's lighthouse, which stand for other
    hosts, and the benchmark itself) on the other CPUs; then every one of them may run
    anywhere again, for the join, the formation and the steps.

    Without it, on this 2-core machine, the replacement's start competes with whichever
    survivors are training: a system whose survivors are still stalled by the kill (torchft
    waits out a 5 s gloo timeout) gives its replacement the machine, one whose survivors
    train again at once (rallypoint) does not, and the rejoin figure measures that instead
    of the replacement's own path. The same for every system.

    Processes the benchmark did not start (anything else on the machine) cannot be moved,
    and the kernel's balancing moves them onto the replacement's CPU precisely when the
    survivors keep the other one busy: measured, a replacement whose survivors trained waited
    1-5 s for its CPU at load 6-12, one whose survivors were stalled 0.1-0.6 s. So until the
    release the replacement also runs at nice -20 (``NICE``: ahead of any ordinary process on
    its CPU, as alone on a host of its own), its threads and its session's autogroup (the
    kernel shares CPU time between sessions before it looks at a thread's nice, and every
    process here starts a session of its own), put back at the release; ``placement()``
    reports what it waited all the same. Without the permission to raise a priority the
    replacement keeps the benchmark's, and the record says so."""

    NICE = -20

    def __init__(self, cpu: int | None) -> None:
        available = os.sched_getaffinity(0)
        self.cpu = cpu if cpu is not None and cpu in available and len(available) > 1 else None
        self.all = available
        self.elsewhere: list[int] = []  # roots of the process trees kept off the CPU
        self.replacement: int | None = None
        self.released_t: float | None = None
        self.moved: dict[int, str] = {}
        self.sharing: list[str] | None = None
        self.used: tuple[float, float] | None = None
        self.nice = os.getpriority(os.PRIO_PROCESS, 0)  # the benchmark's, to go back to
        self.boosted: bool | None = None  # the replacement ran at NICE (None: not tried)
        self.group_boosted: bool | None = None  # its session's autogroup too (None: none)

    @property
    def others(self) -> set[int]:
        assert self.cpu is not None
        return self.all - {self.cpu}

    def _keep_off(self) -> None:
        """Every process in the trees of ``elsewhere`` but the replacement's, off the CPU."""
        mine = set(process_tree(self.replacement)) if self.replacement is not None else set()
        for root in self.elsewhere:
            for pid in process_tree(root):
                if pid not in mine:
                    set_cpus(pid, self.others)
                    self.moved.setdefault(pid, command_name(pid))

    def before_start(self, elsewhere: Sequence[int]) -> None:
        """Before the replacement starts: each process in the trees rooted at ``elsewhere``
        (the benchmark passes its own pid: everything it started) off the replacement's
        CPU."""
        if self.cpu is None:
            return
        self.elsewhere = list(elsewhere)
        self._keep_off()

    @contextmanager
    def starting(self) -> Iterator[None]:
        """Around starting the replacement: the calling thread is on the replacement's CPU,
        so the process it starts runs there from its first instruction (a child inherits
        the set of the thread that made it)."""
        if self.cpu is None:
            yield
            return
        tid = threading.get_native_id()
        os.sched_setaffinity(0, {self.cpu})
        self.boosted = set_nice(tid, self.NICE)  # the child inherits the thread's priority
        try:
            yield
        finally:
            os.sched_setaffinity(0, self.others)
            set_nice(tid, self.nice)

    def started(self, replacement: int) -> None:
        """The replacement's process (and any it started already) on its CPU alone, and the
        rest off it again (threads the benchmark started meanwhile, e.g. its reader)."""
        if self.cpu is None:
            return
        self.replacement = replacement
        self.group_boosted = set_group_nice(replacement, self.NICE)
        for pid in process_tree(replacement):
            set_cpus(pid, {self.cpu})
            if self.boosted is not False:
                self.boosted = set_nice(pid, self.NICE)
        self._keep_off()

    def release(self) -> None:
        """Every process may run on every CPU again (once; later calls: nothing). Notes
        first which of the benchmark's other processes could run on the replacement's CPU
        (none, unless one started meanwhile) and the replacement's CPU time and wait."""
        if self.cpu is None or self.released_t is not None:
            return
        mine = set(process_tree(self.replacement)) if self.replacement is not None else set()
        self.sharing = [
            command_name(pid)
            for root in self.elsewhere
            for pid in process_tree(root)
            if pid not in mine and self.cpu in allowed_cpus(pid)
        ]
        if self.replacement is not None:
            self.used = run_and_wait_s(self.replacement)
        for root in [*self.elsewhere, *([self.replacement] if self.replacement else [])]:
            for pid in process_tree(root):
                set_cpus(pid, self.all)
        if self.replacement is not None and self.boosted:
            for pid in process_tree(self.replacement):
                set_nice(pid, self.nice)
        if self.replacement is not None and self.group_boosted:
            set_group_nice(self.replacement, 0)  # a new session's autogroup starts at 0
        self.released_t = time.time()

    def placement(self) -> dict[str, Any]:
        """For the trial's record: where everything ran while the replacement started."""
        if self.cpu is None:
            return {"replacement_cpu": None}
        return {
            "replacement_cpu": self.cpu,
            "others_cpus": sorted(self.others),
            # Every process the benchmark had started (and its threads), off the CPU.
            "moved_off": sorted(self.moved.values()),
            # Any of them still allowed on the replacement's CPU when it was released.
            "sharing_replacement_cpu": self.sharing,
            # The replacement's nice value until release (None: not permitted to raise it).
            "replacement_nice": self.NICE if self.boosted else None,
            # Its session's autogroup's too (None: no autogroups, or not permitted).
            "replacement_autogroup_nice": self.NICE if self.group_boosted else None,
            # The replacement's threads until release: on a CPU, and runnable but waiting
            # for one (processes the benchmark did not start, e.g. other users', are not
            # moved; this says how much they took).
            "replacement_cpu_s": None if self.used is None else self.used[0],
            "replacement_wait_s": None if self.used is None else self.used[1],
        }
