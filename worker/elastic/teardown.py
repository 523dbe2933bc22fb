"""Teardown: leaving a round's process group without blocking on work stuck in gloo.

Theory of operation. ``destroy_process_group`` does not wait for pending gloo work
(measured: it returns in microseconds with an all-reduce stuck on a stopped peer), but the
C++ process group's destructor would: it joins gloo's worker threads. So the run moves the
group, its store, its checkpointer and its in-flight work from the round to
:class:`Abandoned` and drops them as soon as nothing of theirs can be inside gloo (every work
completed, no checkpoint being written), or once the group's own timeout
(``collective_timeout_s``) has surely ended that work. The package docstring ("Teardown")
gives the leak bound and why ``abort()`` and ``shutdown()`` do not help.
"""

from __future__ import annotations

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

    def add(self, at: float, held: list[object]) -> None:
        self._held.append((at, held))

    def drop(self, *, expired_after_s: float) -> None:
        """Let go of the held items that are quiet, or whose group's timeout has surely
        ended their work (abandoned over ``expired_after_s`` ago; 0: only the quiet ones).
        Their destructors run here: none can block."""
        now = time.monotonic()
        self._held = [
            (at, held)
            for at, held in self._held
            if not _quiet(held) and not (expired_after_s and now - at >= expired_after_s)
        ]

    def groups(self) -> int:
        """How many process groups are still held."""
        return sum(isinstance(item, dist.ProcessGroup) for _, held in self._held for item in held)


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
    abandoned.drop(expired_after_s=collective_timeout_s + 5)


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
