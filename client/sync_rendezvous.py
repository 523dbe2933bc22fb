"""Blocking views of a participant, a round store and a checkpoint registry, for threads.

Each runs the async object on the :class:`SyncClient`'s private loop and blocks the calling
thread (any thread but the client's own: torch's c10d store adapter calls the round store
from worker threads). Round-change callbacks run on the client's thread and must not call
back into the SyncClient; iterate ``rounds()`` or wait on ``lost`` from another thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterator

from .blocking import Blocking, Runner, blocking
from .checkpoints import CheckpointRegistry
from .rendezvous import Participant
from .rendezvous_values import LeaveOutcome, RoundInfo, TrainingProgress
from .roundstore import RoundStore


class SyncRoundStore(Blocking[RoundStore]):
    """A :class:`RoundStore` seen from threads."""

    set = blocking(RoundStore.set)
    get = blocking(RoundStore.get)
    add = blocking(RoundStore.add)
    compare_set = blocking(RoundStore.compare_set)
    append = blocking(RoundStore.append)
    wait = blocking(RoundStore.wait)
    delete = blocking(RoundStore.delete)
    num_keys = blocking(RoundStore.num_keys)
    check = blocking(RoundStore.check)
    multi_get = blocking(RoundStore.multi_get)
    multi_set = blocking(RoundStore.multi_set)
    read_groups = blocking(RoundStore.read_groups)
    read_leased = blocking(RoundStore.read_leased)

    @property
    def store(self) -> RoundStore:
        return self._target

    @property
    def namespace(self) -> str:
        return self._target.namespace

    @property
    def round(self) -> int:
        return self._target.round


class SyncCheckpointRegistry(Blocking[CheckpointRegistry]):
    """A :class:`CheckpointRegistry` seen from threads."""

    begin = blocking(CheckpointRegistry.begin)
    shard_done = blocking(CheckpointRegistry.shard_done)
    commit = blocking(CheckpointRegistry.commit)
    abort = blocking(CheckpointRegistry.abort)
    latest = blocking(CheckpointRegistry.latest)
    commit_memory_snapshot = blocking(CheckpointRegistry.commit_memory_snapshot)
    latest_memory_snapshot = blocking(CheckpointRegistry.latest_memory_snapshot)

    @property
    def registry(self) -> CheckpointRegistry:
        return self._target


class SyncParticipant(Blocking[Participant]):
    """A :class:`Participant` seen from threads. ``lost`` is a ``threading.Event``."""

    def __init__(self, participant: Participant, runner: Runner) -> None:
        super().__init__(participant, runner)
        self.lost = threading.Event()
        if participant.lost.is_set():
            self.lost.set()
        else:
            # Mirrors the participant's event until it is set or the participant is closed.
            self._mirror = asyncio.run_coroutine_threadsafe(self._mirror_lost(), runner.loop)

    async def _mirror_lost(self) -> None:
        await self._target.lost.wait()
        self.lost.set()

    wait_for_round = blocking(Participant.wait_for_round)
    _leave = blocking(Participant.leave)
    _close = blocking(Participant.close)

    def leave(
        self,
        *,
        timeout_s: float | None = None,
        outcome: LeaveOutcome | None = None,
        detail: str = "",
    ) -> None:
        """See :meth:`Participant.leave`."""
        try:
            self._leave(timeout_s=timeout_s, outcome=outcome, detail=detail)
        finally:
            self._stop_mirror()

    def close(self) -> None:
        try:
            self._close()
        finally:
            self._stop_mirror()

    def _stop_mirror(self) -> None:
        mirror = getattr(self, "_mirror", None)
        if mirror is not None:
            mirror.cancel()

    @property
    def participant(self) -> Participant:
        return self._target

    def expect_replacement(self, expected: bool = True) -> None:
        """See :meth:`Participant.expect_replacement` (a flag: no loop hop)."""
        self._target.expect_replacement(expected)

    def report_progress(self, progress: TrainingProgress) -> None:
        """See :meth:`Participant.report_progress` (a reference swap: no loop hop)."""
        self._target.report_progress(progress)

    def report_collective_failure(
        self, round_number: int, detail: str, *, timeout_s: float = 2.0
    ) -> concurrent.futures.Future[list[int]]:
        """See :meth:`Participant.report_collective_failure`. Returns at once, so a training
        thread leaving a broken collective is not held: the future has the answer."""
        return asyncio.run_coroutine_threadsafe(
            self._target.report_collective_failure(round_number, detail, timeout_s=timeout_s),
            self._runner.loop,
        )

    @property
    def participant_id(self) -> int:
        return self._target.participant_id

    @property
    def job(self) -> str:
        return self._target.job

    @property
    def name(self) -> str:
        return self._target.name

    @property
    def round(self) -> RoundInfo:
        # One attribute read of an immutable value: safe from any thread.
        return self._target.round

    @property
    def rank(self) -> int | None:
        return self._target.round.rank_of(self._target.participant_id)

    @property
    def lost_reason(self) -> str | None:
        return self._target.lost_reason

    def on_round_change(self, callback: Callable[[RoundInfo], object]) -> None:
        """Call ``callback(round_info)`` on the client's thread for each new (round, state)."""
        self._runner.loop.call_soon_threadsafe(self._target.on_round_change, callback)

    def rounds(self) -> Iterator[RoundInfo]:
        """The current round, then each new one; ends when the participant leaves or is
        lost."""
        rounds = self._target.rounds()

        async def next_round() -> RoundInfo:
            return await anext(rounds)

        while True:
            try:
                yield self._runner.run(next_round())
            except StopAsyncIteration:
                return

    def store(self) -> SyncRoundStore:
        return SyncRoundStore(self._target.store(), self._runner)

    def checkpoints(self) -> SyncCheckpointRegistry:
        return SyncCheckpointRegistry(self._target.checkpoints(), self._runner)
