"""Teardown: leaving a round's process group without blocking on work stuck in gloo.

Theory of operation. ``destroy_process_group`` does not wait for pending gloo work
(measured: it returns in microseconds with an all-reduce stuck on a stopped peer), but the
C++ process group's destructor would: it joins gloo's worker threads. So the run moves the
group, its store, its checkpointer and its in-flight work from the round to
:class:`Abandoned` and drops them as soon as nothing of theirs can be inside gloo (every work
completed, no checkpoint being written), or once the group's own timeout
(``collective_timeout_s``) has surely ended that work. The package docstring ("Teardown")
gives the leak bound and why ``abort()`` and ``shutdown()`` do not help.

Dropping is off the way to the next round. A quiet group's destructor does not block on a
peer, but it is not free: it joins gloo's threads and closes its pairs (12-34 ms for a
4-rank group on 2 loaded cores, measured in bench-peers), time in which the rank would
otherwise be arriving in the next round, whose peers wait for it (a survivor of a killed
peer, or of a newcomer's join). So the run's teardown hands the drop to a thread
("rallypoint-drop"; torch's process-group and work destructors release the GIL while they
wait for gloo), and leaving the run waits for it before dropping what is left.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .round import ElasticRound


class Abandoned:
    """Groups of past rounds (and what came with them) that may still have work in gloo,
    each with the time it was abandoned."""

    def __init__(self) -> None:
        self._held: list[tuple[float, list[object]]] = []
        # Guards _held: the training thread adds and counts, drop threads take.
        self._lock = threading.Lock()
        # Drops handed to threads (drop_in_background) and not known finished.
        self._dropping: list[threading.Thread] = []

    def add(self, at: float, held: list[object]) -> None:
        with self._lock:
            self._held.append((at, held))

    def drop(self, *, expired_after_s: float) -> None:
        """Let go of the held items that are quiet, or whose group's timeout has surely
        ended their work (abandoned over ``expired_after_s`` ago; 0: only the quiet ones).
        Their destructors run here, on the caller's thread: none can block."""
        now = time.monotonic()
        with self._lock:
            kept: list[tuple[float, list[object]]] = []
            gone: list[tuple[float, list[object]]] = []
            for entry in self._held:
                at, held = entry
                if _quiet(held) or (expired_after_s and now - at >= expired_after_s):
                    gone.append(entry)
                else:
                    kept.append(entry)
            self._held = kept
        # ``gone`` holds the last references to the dropped items: their destructors run
        # as this returns, on this thread.

    def drop_in_background(self, *, expired_after_s: float) -> None:
        """``drop`` on a thread of its own (module docstring: off the way to the next
        round). Not a daemon: the interpreter never exits in the middle of a destructor."""
        self._dropping = [thread for thread in self._dropping if thread.is_alive()]
        thread = threading.Thread(
            target=self.drop,
            kwargs={"expired_after_s": expired_after_s},
            name="rallypoint-drop",
        )
        self._dropping.append(thread)
        thread.start()

    def wait_dropped(self) -> None:
        """Wait until every drop handed to a thread has finished."""
        dropping, self._dropping = self._dropping, []
        for thread in dropping:
            thread.join()

    def groups(self) -> int:
        """How many process groups are still held."""
        with self._lock:
            return sum(
                isinstance(item, dist.ProcessGroup) for _, held in self._held for item in held
            )


def leave_round(
    round_: ElasticRound, abandoned: Abandoned, *, finished: bool, collective_timeout_s: float
) -> None:
    """Leave the round's group. A finished round first lets its checkpoint commit (and
    waits for every rank's, so nobody leaves the job before rank 0 committed)."""
    if finished and not round_.ended:
        round_.wait_for_commits(collective_timeout_s)
        if dist.is_initialized():
            round_.all_reduce(torch.zeros(1))
    round_.commits.shutdown()
    now = time.monotonic()
    if not round_.ended:
        round_.end("finished" if finished else "left")
    if dist.is_initialized():
        round_.collectives.hold(dist.group.WORLD)
        dist.destroy_process_group()
        if not finished and round_.run.state.build is not None:
            round_.release_mesh_groups()
    # The run holds them from now on, not the round (the user's loop variable may keep
    # the round object alive for as long as the program runs).
    abandoned.add(now, [round_.commits.release_checkpointer(), *round_.collectives.release()])
    abandoned.drop_in_background(expired_after_s=collective_timeout_s + 5)


def _quiet(held: Sequence[object]) -> bool:
    """Nothing in ``held`` (a round's group, store, checkpointer, works) can be inside gloo:
    every work completed and no checkpoint being written, so destroying them cannot block."""
    from ..checkpoint import Checkpointer  # loaded by the formation's restore

    for item in held:
        if isinstance(item, dist.Work) and not item.is_completed():
            return False
        if isinstance(item, Checkpointer) and item.busy:
            return False
    return True
