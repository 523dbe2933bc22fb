"""Leave no process behind: a program's whole process tree ends with it, however it ends.

Theory of operation. The demo, the benchmarks and the fault-injection runs start many
processes: coordinator members, etcd, workers, torchrun agents and, through the agents,
torchrun's workers. Each program stops what it started in ``finally`` blocks, which is not
enough: a process that died leaves its children to init (torchrun's workers run in sessions
of their own, so killing an agent's group misses them), and SIGTERM, Python's default for
which is to die at once, runs no ``finally`` at all. One make run of the recovery benchmark
once left ten torchrun workers running. So every such program runs its main function
through :func:`run_reaped`:

- the program becomes a *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``): a process
  orphaned anywhere below it is re-parented to it rather than to init, so it stays a
  descendant, found by walking ``/proc`` parent links;
- SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does, so the program's own
  ``finally`` blocks stop what they started, in order. Inside a running asyncio loop they
  are raised from a callback the loop runs next, not wherever the signal lands: an
  exception raised at an arbitrary bytecode can land inside a C extension's constructor,
  and grpc.aio's channel setup crashes the interpreter (SIGSEGV, no cleanup at all) when
  that happens; raised between callbacks it leaves the loop, and ``asyncio.run`` cancels
  every task, whose ``finally`` blocks run at their awaits;
- when the main function has returned or raised, every descendant still alive is killed
  (SIGKILL, until none is left, since a dying parent may hand over orphans at that very
  moment), with further signals ignored so a second Ctrl-C cannot cut the sweep short.

A SIGKILL of the program itself is beyond this (nothing runs); its direct children outlive
it. Zombies (dead, not yet reaped) are not running and are left to whoever reaps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

# prctl(2): the calling process adopts orphaned descendants.
_PR_SET_CHILD_SUBREAPER = 36
# Exit status for a run ended by a signal: 128 + its number, as shells report it.
_SIGNAL_EXIT_BASE = 128
# The sweep gives up (and says so) after this long: a process in uninterruptible sleep
# (stuck on a dead NFS mount, say) cannot be killed by anyone.
SWEEP_TIMEOUT_S = 10.0


def set_child_subreaper(enabled: bool = True) -> bool:
    """Make this process a child subreaper (or stop being one); False where Linux's prctl
    is not available."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0)) == 0


def _parents() -> dict[int, tuple[int, str]]:
    """Every process's parent and state letter, from /proc (processes that vanish while
    being read are skipped)."""
    found: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after the last ")".
        state, parent = stat[stat.rindex(")") + 2 :].split()[:2]
        found[int(entry.name)] = (int(parent), state)
    return found


def descendants(root: int | None = None) -> list[int]:
    """The live (not zombie) descendants of ``root`` (default: this process), parents
    before their children."""
    root = os.getpid() if root is None else root
    table = _parents()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    order: list[int] = []
    pending = sorted(children.get(root, []))
    while pending:
        pid = pending.pop(0)
        order.append(pid)
        pending.extend(sorted(children.get(pid, [])))
    return [pid for pid in order if table[pid][1] not in ("Z", "X")]


def _reap_children() -> None:
    """Collect the exit status of this process's dead children (orphans it adopted)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_descendants(timeout_s: float = SWEEP_TIMEOUT_S) -> list[int]:
    """SIGKILL every live descendant of this process until none is left (or ``timeout_s``
    passed: the survivors are reported on stderr); the pids killed."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        alive = descendants()
        if not alive:
            return killed
        if time.monotonic() >= deadline:
            print(
                f"{Path(sys.argv[0]).name}: processes {alive} survived SIGKILL for "
                f"{timeout_s:g} s (uninterruptible sleep?)",
                file=sys.stderr,
            )
            return killed
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                # SIGCONT first: a stopped process dies on SIGKILL too, but this also
                # lets a stopped parent's pending work (reaping) go on.
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        _reap_children()
        time.sleep(0.01)


class _Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C so that ``finally`` blocks run."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_in_loop(signum: int) -> None:
    raise _Interrupted(signum)


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise _Interrupted(signum) from None
    # Raised from a callback of the loop's own, between callbacks: it leaves run_forever
    # (asyncio and uvloop re-raise KeyboardInterrupt from callbacks), and asyncio.run then
    # cancels every task, whose cleanup runs at its awaits.
    loop.call_soon_threadsafe(_raise_in_loop, signum)


@contextlib.contextmanager
def reaped() -> Iterator[None]:
    """The body runs as a subreaper with SIGTERM/SIGHUP raising KeyboardInterrupt; on the
    way out, however it leaves, no descendant is left running. See the module docstring."""
    set_child_subreaper(True)
    previous = {
        sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)
    }
    try:
        yield
    finally:
        ignored = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in ignored}
        try:
            kill_descendants()
        finally:
            for sig, handler in {**before, **previous}.items():
                signal.signal(sig, handler)


def run_reaped(main: Callable[[], int]) -> int:
    """``main()``'s exit status, run under :func:`reaped`; a run ended by Ctrl-C, SIGTERM
    or SIGHUP exits 128 + the signal's number, after cleaning up."""
    try:
        with reaped():
            return main()
    except _Interrupted as interrupted:
        return _SIGNAL_EXIT_BASE + interrupted.signum
    except KeyboardInterrupt:
        return _SIGNAL_EXIT_BASE + signal.SIGINT
