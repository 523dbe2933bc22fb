"""Heartbeat streams: the Rendezvous service's Heartbeat and HeartbeatBatch, on one path.

Theory of operation. Both streams are served by every member. The member that serves a
stream runs its participants' detectors and tells the leader (``coordinator/liveness``); it
reaches them only through ``liveness.port.LivenessPort``. Both streams go through the same
detector API: a stream opens a *group* detector per job it carries participants of, beats
it once per request, and closes it when the stream ends (a HeartbeatBatch stream carries
many participants in one group; the older per-participant Heartbeat stream opens a group of
one for each participant it names). A member cut off from the leader (none of its reports
taken lately) ends its streams with UNAVAILABLE, so workers move to another member; the
participants it carried are released, not suspected.

Heartbeat is a bidirectional stream of one participant per message, kept for older clients.
Each request beats its (job, participant)'s group. The stream answers when the job's current
round (number or state) differs from what the worker said or from what this stream last
told it, and every ``HEARTBEAT_ANSWER_EVERY`` heartbeats otherwise, so a worker learns of a
change without a watch and knows the stream is alive.

HeartbeatBatch: each request beats for many participants of one job and is answered (same
``seq``) with an ``Assignment`` for each participant whose round changed since this stream
last told it, and ``gone`` for one no longer in the job; a round change is also pushed at
once, unasked (``seq`` 0; ``RoundSignals``: one watcher per job on this member). Each
assignment is the state machine's O(1) ``rendezvous.assignment``, so a round change costs
each participant its own few dozen bytes. ``released`` participants are let go without
suspicion.

A request's ``sent_ms`` (either stream) measures this member's intake lag
(``liveness/local.py``). When a stream ends, every participant it carried that is still in
its job is evidence (``close_group(closed=True)``): a dead process's stream closing is
immediate evidence, confirmed unless a new stream arrives within two heartbeat intervals. A
worker that leaves does so before closing its stream, so it is no longer a participant when
the stream ends and nothing is reported. The end itself cannot tell the two apart: gRPC
hands the handler a client's cancellation (or a broken connection) as the same end of
requests as a clean half-close, and only sometimes cancels the handler afterwards.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any

from rallypoint.proto.v1 import rendezvous_pb2

from ..leader.supervisor import monotonic_ms
from ..liveness.local import StreamClock
from ..liveness.port import LivenessPort
from ..liveness.progress import ProgressReport
from ..node.api import CutOffError, NotLeaderError, ServerNode
from ..state.errors import ParticipantNotFound
from ..state.jobs import JobState, RoundState
from ..state.view import JobView
from . import validate
from .common import ROUND_STATES, header_pb, job_view
from .errors import InvalidArgument, RequestFailed

__all__ = [
    "HEARTBEAT_ANSWER_EVERY",
    "MAX_BATCH_PARTICIPANTS",
    "WATCH_RECHECK_S",
    "HeartbeatStreams",
    "job_position",
]

# A HeartbeatBatch request names at most this many participants.
MAX_BATCH_PARTICIPANTS = 100_000
_ABSENT: object = object()
# A per-participant heartbeat stream answers at least once per this many heartbeats.
HEARTBEAT_ANSWER_EVERY = 10
# How long a job watcher waits for an apply before re-checking anyway (a bound, not a poll:
# an apply wakes it at once).
WATCH_RECHECK_S = 5.0
# A heartbeat's restore source is a word ("broadcast"); it ends up in the replicated round
# record, so a longer one is cut here rather than refused (a heartbeat must not fail on it).
MAX_RESTORE_CHARS = 32


class HeartbeatStreams:
    """The two heartbeat streams of this member, over ``liveness``."""

    def __init__(self, node: ServerNode, liveness: LivenessPort) -> None:
        self.node = node
        self.liveness = liveness
        # Round-change signals for batch heartbeat streams (one watcher per job).
        self._signals = RoundSignals()

    async def _applied_through(self, pid: int, timeout_s: float = 2.0) -> None:
        """Wait (bounded) until this member has applied the join that handed out participant
        id ``pid``: until its applied index reaches ``pid``, or a batch it applied handed out
        ids beyond it. A participant id is at least, not exactly, its join's raft index: a
        JoinBatch hands out ids above its own, which a quiet cluster may never reach."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        state = self.node.state
        while not state.rendezvous.participant_id_known(pid, state.applied_index):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            await self.node.wait_for_apply(remaining)

    async def per_participant(
        self, request_iterator: AsyncIterator[rendezvous_pb2.HeartbeatRequest]
    ) -> AsyncGenerator[rendezvous_pb2.HeartbeatResponse, None]:
        """A ``Heartbeat`` stream: a group of one per participant it names."""
        liveness = self.liveness
        # Per participant this stream has fed: its group, and the (round, state) it last
        # told it.
        groups: dict[tuple[str, int], int] = {}
        told: dict[tuple[str, int], tuple[int, RoundState] | None] = {}
        heartbeats = 0
        clock = StreamClock()
        try:
            async for request in request_iterator:
                if request.sent_ms:
                    liveness.request_lag(clock, monotonic_ms(), request.sent_ms)
                job_id = validate.job_id(request.job)
                pid = validate.positive(request.participant_id, "participant_id")
                # The participant id is the raft index of its Join. A member that answered the
                # Join may have applied it before this one did (its own write can finish after
                # a quorum of followers acknowledged): wait for the apply rather than call a
                # live participant unknown.
                await self._applied_through(pid)
                job = job_view(self.node, job_id)
                if pid not in job.participants:
                    raise RequestFailed(ParticipantNotFound(job_id, pid))
                if not liveness.serves_heartbeats():
                    raise CutOffError(self.node.member_id)
                key = (job_id, pid)
                now_ms = monotonic_ms()
                group = groups.get(key)
                if group is None:
                    group = groups[key] = liveness.open_group(job_id, now_ms, readings=True)
                    liveness.group_update(group, {key}, now_ms)
                    told[key] = None
                liveness.group_beat(group, now_ms)
                if request.round:
                    liveness.rounds_named(job_id, [(pid, request.round)])
                if request.reports_progress:
                    liveness.report_progress(job_id, pid, progress_report(request), now_ms)
                heartbeats += 1
                r = job.round
                current = (r.number, r.state)
                if (
                    request.round != r.number
                    or told[key] != current
                    or (heartbeats % HEARTBEAT_ANSWER_EVERY == 0)
                ):
                    told[key] = current
                    yield rendezvous_pb2.HeartbeatResponse(
                        header=header_pb(self.node.header()),
                        current_round=r.number,
                        state=ROUND_STATES[r.state],
                    )
        except NotLeaderError:
            # This member is cut off from the leader: the worker moves to another member,
            # which watches it afresh; this member's silence about it is no evidence.
            now_ms = monotonic_ms()
            for _, group in sorted(groups.items()):
                liveness.close_group(group, now_ms, closed=False)
            groups.clear()
            raise
        finally:
            jobs = self.node.state.rendezvous.jobs
            now_ms = monotonic_ms()
            for (job_id, pid), group in sorted(groups.items()):
                found = jobs.get(job_id)
                closed = found is not None and pid in found.participants
                liveness.close_group(group, now_ms, closed=closed)

    async def batch(
        self, request_iterator: AsyncIterator[rendezvous_pb2.HeartbeatBatchRequest]
    ) -> AsyncGenerator[rendezvous_pb2.HeartbeatBatchResponse, None]:
        """A ``HeartbeatBatch`` stream: one group per job it carries participants of."""
        # Per job this stream carries participants of: their group detector and what the
        # stream last told each.
        stream_jobs: dict[str, _StreamJob] = {}
        clock = StreamClock()
        liveness = self.liveness
        requests = aiter(request_iterator)
        next_request: asyncio.Future[rendezvous_pb2.HeartbeatBatchRequest] = asyncio.ensure_future(
            anext(requests)
        )
        # The jobs this stream carries participants of, each with its round-change signal.
        signals: dict[str, _JobSignal] = {}
        changed: asyncio.Task[bool] | None = None
        try:
            while True:
                if changed is None and signals:
                    changed = asyncio.ensure_future(_first_set(signals.values()))
                waiting: set[asyncio.Future[Any]] = {next_request}
                if changed is not None:
                    waiting.add(changed)
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if changed is not None and changed in done:
                    changed = None
                    for job_id, signal in list(signals.items()):
                        if signal.fired():
                            signals[job_id] = self._signals.renew(job_id, signal)
                            push = self._push(job_id, stream_jobs[job_id])
                            if push is not None:
                                yield push
                if next_request not in done:
                    continue
                try:
                    request = next_request.result()
                except StopAsyncIteration:
                    break
                next_request = asyncio.ensure_future(anext(requests))
                now_ms = monotonic_ms()
                job_id = validate.job_id(request.job)
                pids = list(request.participant_ids)
                if len(pids) > MAX_BATCH_PARTICIPANTS:
                    raise InvalidArgument(
                        "participant_ids",
                        f"a heartbeat batch names at most {MAX_BATCH_PARTICIPANTS} "
                        f"participants, this one {len(pids)}",
                    )
                if len(request.rounds) not in (0, len(pids)):
                    raise InvalidArgument(
                        "rounds",
                        f"{len(request.rounds)} entries for {len(pids)} participant_ids: give "
                        "one per participant, or none",
                    )
                liveness.request_lag(clock, now_ms, request.sent_ms)
                if not liveness.serves_heartbeats():
                    raise CutOffError(self.node.member_id)
                if request.known_index > self.node.state.applied_index:
                    await self._applied_through(request.known_index)
                answer = self._beat(job_id, pids, request, stream_jobs, now_ms)
                if job_id not in signals:
                    signals[job_id] = self._signals.subscribe(job_id, self.node)
                    if changed is not None:
                        changed.cancel()
                        changed = None
                yield answer
        finally:
            next_request.cancel()
            if changed is not None:
                changed.cancel()
            for job_id in signals:
                self._signals.unsubscribe(job_id)
            now_ms = monotonic_ms()
            for carried in stream_jobs.values():
                liveness.close_group(carried.group, now_ms, closed=True)

    def _push(
        self, job_id: str, carried: _StreamJob
    ) -> rendezvous_pb2.HeartbeatBatchResponse | None:
        """An unsolicited answer (seq 0): the assignments of this stream's participants of
        ``job_id`` whose round moved since the stream last told them; None if none did."""
        job = self.node.state.rendezvous.jobs.get(job_id)
        answer = rendezvous_pb2.HeartbeatBatchResponse(header=header_pb(self.node.header()))
        told = carried.told
        participants = job.participants if job is not None else {}
        current = (job.round.number, job.round.state) if job is not None else None
        stale = []
        for pid in list(told):
            if pid not in participants:
                del told[pid]
                self.liveness.group_release(carried.group, job_id, pid)
                answer.assignments.add(participant_id=pid, gone=True)
            elif told[pid] != current:
                told[pid] = current
                stale.append(pid)
        if job is not None:
            self._assign(job, stale, answer)
        return answer if answer.assignments else None

    def _assign(
        self, job: JobView, pids: list[int], answer: rendezvous_pb2.HeartbeatBatchResponse
    ) -> None:
        """Add the assignment of each of ``pids`` (participants of ``job``) to ``answer``."""
        if not pids:
            return
        namespace = f"{job.job_id}/{job.round.number}"
        assignment = self.node.state.rendezvous.assignment
        add = answer.assignments.add
        for pid in pids:
            seat = assignment(job.job_id, pid)
            if seat is None:
                add(participant_id=pid, gone=True)
                continue
            add(
                participant_id=pid,
                round=seat.round,
                state=ROUND_STATES[seat.state],
                rank=seat.rank,
                world_size=seat.world_size,
                fencing_token=seat.fencing_token,
                store_namespace=namespace,
                waiting=seat.waiting,
            )

    def _beat(
        self,
        job_id: str,
        pids: list[int],
        request: rendezvous_pb2.HeartbeatBatchRequest,
        stream_jobs: dict[str, _StreamJob],
        now_ms: int,
    ) -> rendezvous_pb2.HeartbeatBatchResponse:
        """Feed the detectors for one batch request and answer it. A request that names
        the same participants as the last one, with the job unchanged since, costs one
        detector update whatever its size (the fast path: a stream's steady state)."""
        job = job_view(self.node, job_id)
        carried = stream_jobs.get(job_id)
        if carried is None:
            carried = stream_jobs[job_id] = _StreamJob(self.liveness.open_group(job_id, now_ms))
        answer = rendezvous_pb2.HeartbeatBatchResponse(
            header=header_pb(self.node.header()), seq=request.seq
        )
        told = carried.told
        for pid in request.released:
            if told.pop(pid, _ABSENT) is not _ABSENT:
                self.liveness.group_release(carried.group, job_id, pid)
                carried.last_pids = None
        if pids != carried.last_pids or job.revision != carried.revision:
            r = job.round
            current = (r.number, r.state)
            participants = job.participants
            members: set[tuple[str, int]] = set()
            stale: list[int] = []
            for pid in pids:
                if pid not in participants:
                    if told.pop(pid, _ABSENT) is not _ABSENT:
                        self.liveness.group_release(carried.group, job_id, pid)
                    answer.assignments.add(participant_id=pid, gone=True)
                    continue
                members.add((job_id, pid))
                if told.get(pid) != current:
                    told[pid] = current
                    stale.append(pid)
            if len(told) > len(members):
                named = {pid for _, pid in members}
                for pid in [p for p in told if p not in named]:
                    del told[pid]  # no longer named: silent from now (group_update)
            self.liveness.group_update(carried.group, members, now_ms)
            self._assign(job, stale, answer)
            carried.last_pids = pids
            carried.revision = job.revision
            carried.last_rounds = []
        self.liveness.group_beat(carried.group, now_ms)
        # The rounds named, when they change (a round change reached the sender): the
        # detection takes one naming a round a failure opened as word of life after it.
        rounds = list(request.rounds)
        if rounds != carried.last_rounds:
            carried.last_rounds = rounds
            self.liveness.rounds_named(
                job_id, [(pid, n) for pid, n in zip(pids, rounds, strict=True) if n and pid in told]
            )
        for entry in request.progress:
            if entry.participant_id not in told:
                continue
            self.liveness.report_progress(
                job_id,
                entry.participant_id,
                progress_report(entry),
                now_ms,
            )
        return answer


def progress_report(
    message: rendezvous_pb2.HeartbeatRequest | rendezvous_pb2.ProgressReport,
) -> ProgressReport:
    """The progress fields a heartbeat (of either stream) reports, as the leader keeps them."""
    return ProgressReport(
        round=message.round,
        step=message.step,
        step_age_ms=message.step_age_ms,
        step_ms=message.step_ms if math.isfinite(message.step_ms) else 0.0,
        collectives_entered=message.collectives_entered,
        waiting_in=message.waiting_in,
        waiting_ms=message.waiting_ms,
        restore=message.restore[:MAX_RESTORE_CHARS],
    )


def job_position(job: JobView) -> tuple[int, RoundState, JobState]:
    """What a watcher is told at once when it changes: round number, round state, job state."""
    return job.round.number, job.round.state, job.state


class _StreamJob:
    """What one batch stream keeps for one job: its participants' group detector, what it
    last told each (round, state), and the request and job revision last seen in full."""

    __slots__ = ("group", "last_pids", "last_rounds", "revision", "told")

    def __init__(self, group: int) -> None:
        self.group = group
        self.told: dict[int, tuple[int, RoundState] | None] = {}
        self.last_pids: list[int] | None = None
        # The rounds the last request named, parallel to last_pids.
        self.last_rounds: list[int] = []
        self.revision = -1


class _JobSignal:
    """Fires (its event is set) when a job's round number or state, or the job's state,
    moves; ``RoundSignals.renew`` gives the next one."""

    def __init__(self, position: tuple[int, RoundState, JobState] | None) -> None:
        self.position = position
        self.event = asyncio.Event()
        self.users = 0
        self.task: asyncio.Task[None] | None = None

    def fired(self) -> bool:
        return self.event.is_set()


class RoundSignals:
    """One watcher per job with batch heartbeat streams on this member (not one per stream):
    it wakes on every apply, and fires the job's signal when its position moves."""

    def __init__(self) -> None:
        self._jobs: dict[str, _JobSignal] = {}

    def subscribe(self, job_id: str, node: ServerNode) -> _JobSignal:
        signal = self._jobs.get(job_id)
        if signal is None:
            job = node.state.rendezvous.jobs.get(job_id)
            signal = self._jobs[job_id] = _JobSignal(None if job is None else job_position(job))
            signal.task = asyncio.get_running_loop().create_task(self._watch(job_id, node))
        signal.users += 1
        return signal

    def renew(self, job_id: str, fired: _JobSignal) -> _JobSignal:
        """The job's current signal (a fired one is replaced once, for every stream)."""
        current = self._jobs.get(job_id)
        return current if current is not None and current is not fired else fired

    def unsubscribe(self, job_id: str) -> None:
        signal = self._jobs.get(job_id)
        if signal is None:
            return
        signal.users -= 1
        if signal.users <= 0:
            del self._jobs[job_id]
            if signal.task is not None:
                signal.task.cancel()

    async def _watch(self, job_id: str, node: ServerNode) -> None:
        while True:
            await node.wait_for_apply(WATCH_RECHECK_S)
            signal = self._jobs.get(job_id)
            if signal is None:
                return
            job = node.state.rendezvous.jobs.get(job_id)
            position = None if job is None else job_position(job)
            if position != signal.position:
                fresh = _JobSignal(position)
                fresh.users, fresh.task = signal.users, signal.task
                self._jobs[job_id] = fresh
                signal.event.set()


async def _first_set(signals: Iterable[_JobSignal]) -> bool:
    """Wait until one of ``signals`` fires."""
    waits = [asyncio.ensure_future(s.event.wait()) for s in signals]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    return True
