"""The Rendezvous service: jobs, joins, heartbeats, round watches and job status.

Theory of operation. Configure, Join, JoinBatch, Leave, Evict and CloseJob are replicated
commands; their answers carry the job's RoundInfo as this member has applied it once the
command applied (JoinBatch's only the round's number and state: a batch is how a round of
100,000 is joined, and each answer carrying every member would cost O(N) per batch). GetJob,
ListJobs and ListMembers read the applied state after a read barrier (unless the client
asked for a serializable read); ListMembers pages through a round's members (or the wait
list) in participant-id order, so reading a round of N costs O(N) in total, not per page.
The reason string is computed here, from the state and ``node.leader_clock_ms()``: the state
machine holds no clock, and the reason is only a description, never a decision.

Phi is soft state of the member that serves a participant's heartbeat stream
(``coordinator/liveness``): GetJob reports each member's phi as the answering member's
detectors see it, and 0 (as rendezvous.proto documents) for a participant whose stream
another member serves. A suspicion that is certain (a closed stream confirmed) is +inf.

Heartbeat is a bidirectional stream of one participant per message, served by every member
(as HeartbeatBatch is): the member that serves it runs the participant's detector and tells
the leader (``coordinator/liveness``). A member cut off from the leader (none of its reports
taken lately) ends the stream with UNAVAILABLE, so the worker moves to another member; the
participants it had carried are released, not suspected. Each request feeds the detector of
its (job, participant). The stream answers when the job's current round (number or state)
differs from what the worker said or from what this stream last told it, and every
``HEARTBEAT_ANSWER_EVERY`` heartbeats otherwise, so a worker learns of a change without a
watch and knows the stream is alive.

HeartbeatBatch is served by every member: each request beats for many participants of one
job and is answered (same ``seq``) with an ``Assignment`` for each participant whose round
changed since this stream last told it, and ``gone`` for one no longer in the job; a round
change is also pushed at once, unasked (``seq`` 0; ``RoundSignals``: one watcher per job on
this member). Each assignment is the state machine's O(1) ``rendezvous.assignment``, so a
round change costs each participant its own few dozen bytes. A request's ``sent_ms``
measures this member's intake lag (``liveness/local.py``); ``released`` participants are let
go without suspicion.

When a stream ends, every participant it carried that is still in its job is reported
(``node.heartbeat_stream_closed``): a dead process's stream closing is immediate evidence,
confirmed unless a new stream arrives within two heartbeat intervals. A worker that leaves
does so before closing its stream, so it is no longer a participant when the stream ends
and nothing is reported. The end itself cannot tell the two apart: gRPC hands the handler
a client's cancellation (or a broken connection) as the same end of requests as a clean
half-close, and only sometimes cancels the handler afterwards.

WatchJob sends the job's current RoundInfo after a read barrier, then a fresh one whenever
the job's revision moves (intermediate states may be coalesced; the latest never is),
re-checking after every batch of applied entries; it ends with NOT_FOUND when the job is
gone. A change of round, round state or job state is sent at once; a change within them
(joins, leaves, the wait list) waits until ``WATCH_COALESCE_S`` after the previous message,
and everything that happened meanwhile goes as one. Without that, N workers joining one by
one cost each of the N watchers N messages of up to N members: cubic work, which at 1024
workers buried the workers' own event loops.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections.abc import AsyncIterator, Iterable
from typing import Any

from rallypoint.proto.v1 import rendezvous_pb2, rendezvous_pb2_grpc

from ..leader.progress import ProgressReport
from ..leader.supervisor import monotonic_ms
from ..liveness.local import StreamClock
from ..node_api import NotLeaderError, ServerNode
from ..state.commands import CloseJob, Configure, Evict, Join, JoinBatch, Leave, PruneJobs
from ..state.errors import JobNotFound, LimitExceeded, ParticipantNotFound
from ..state.jobs import (
    EndReason,
    JobConfig,
    JobState,
    LeaveOutcome,
    RoundRecord,
    RoundState,
    Seat,
)
from ..state.rendezvous import batch_bytes, round_reason
from ..state.results import (
    CloseJobResult,
    ConfigureResult,
    JoinBatchResult,
    JoinResult,
    PruneJobsResult,
    RemoveResult,
)
from ..state.view import JobView
from . import validate
from .checkpoint import checkpoint_pb, memory_snapshot_pb
from .common import Context, header_pb, propose, read_barrier
from .errors import InvalidArgument, RequestFailed

# A HeartbeatBatch request names at most this many participants.
MAX_BATCH_PARTICIPANTS = 100_000
_ABSENT: object = object()
# A heartbeat stream answers at least once per this many heartbeats.
HEARTBEAT_ANSWER_EVERY = 10
# How long WatchJob waits for an apply before re-checking anyway (a bound, not a poll: an
# apply wakes it at once).
WATCH_RECHECK_S = 5.0
# The least time between two WatchJob messages about the same round in the same state.
WATCH_COALESCE_S = 0.2
# ListMembers' page size when the request says 0, and the most a request may ask for.
LIST_MEMBERS_DEFAULT = 1_000
LIST_MEMBERS_MAX = 10_000
# A heartbeat's restore source is a word ("broadcast"); it ends up in the replicated round
# record, so a longer one is cut here rather than refused (a heartbeat must not fail on it).
MAX_RESTORE_CHARS = 32


_ROUND_STATES = {
    RoundState.JOINING: rendezvous_pb2.ROUND_STATE_JOINING,
    RoundState.ACTIVE: rendezvous_pb2.ROUND_STATE_ACTIVE,
    RoundState.ENDED: rendezvous_pb2.ROUND_STATE_ENDED,
}
_JOB_STATES = {
    JobState.OPEN: rendezvous_pb2.JOB_STATE_OPEN,
    JobState.FINISHED: rendezvous_pb2.JOB_STATE_FINISHED,
    JobState.FAILED: rendezvous_pb2.JOB_STATE_FAILED,
    JobState.CLOSED: rendezvous_pb2.JOB_STATE_CLOSED,
}
_LEAVE_OUTCOMES = {
    rendezvous_pb2.LEAVE_OUTCOME_UNSPECIFIED: LeaveOutcome.UNSPECIFIED,
    rendezvous_pb2.LEAVE_OUTCOME_FINISHED: LeaveOutcome.FINISHED,
    rendezvous_pb2.LEAVE_OUTCOME_FAILED: LeaveOutcome.FAILED,
}
_END_REASONS = {
    EndReason.MEMBER_FAILED: rendezvous_pb2.ROUND_END_REASON_MEMBER_FAILED,
    EndReason.MEMBER_LEFT: rendezvous_pb2.ROUND_END_REASON_MEMBER_LEFT,
    EndReason.MEMBER_EVICTED: rendezvous_pb2.ROUND_END_REASON_MEMBER_EVICTED,
    EndReason.SCALE_UP: rendezvous_pb2.ROUND_END_REASON_SCALE_UP,
    EndReason.JOB_CLOSED: rendezvous_pb2.ROUND_END_REASON_JOB_CLOSED,
    EndReason.STRAGGLER: rendezvous_pb2.ROUND_END_REASON_STRAGGLER,
}


def config_pb(config: JobConfig) -> rendezvous_pb2.JobConfig:
    return rendezvous_pb2.JobConfig(
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        last_call_ms=config.last_call_ms,
        join_timeout_ms=config.join_timeout_ms,
        heartbeat_interval_ms=config.heartbeat_interval_ms,
        phi_threshold=config.phi_threshold_milli / 1000,
        phi_window=config.phi_window,
        min_std_ms=config.min_std_ms,
        acceptable_pause_ms=config.acceptable_pause_ms,
        scale_up=config.scale_up,
        keep_checkpoints=config.keep_checkpoints,
        hang_factor=config.hang_factor_milli / 1000,
        hang_floor_ms=config.hang_floor_ms,
        startup_timeout_ms=config.startup_timeout_ms,
        straggler_factor=config.straggler_factor_milli / 1000,
        straggler_windows=config.straggler_windows,
        straggler_window_ms=config.straggler_window_ms,
    )


def record_pb(record: RoundRecord) -> rendezvous_pb2.RoundRecord:
    return rendezvous_pb2.RoundRecord(
        round=record.number,
        members=[
            rendezvous_pb2.RoundMember(participant_id=m.participant_id, name=m.name, rank=m.rank)
            for m in record.members
        ],
        fencing_token=record.fencing_token,
        opened_ms=record.opened_ms,
        closed_ms=record.closed_ms,
        ended_ms=record.ended_ms,
        end_reason=_END_REASONS[record.end_reason],
        ended_by=record.ended_by,
        detail=record.detail,
        trained_ms=record.trained_ms,
        restore=record.restore,
    )


class RendezvousServicer(rendezvous_pb2_grpc.RendezvousServicer):
    def __init__(self, node: ServerNode) -> None:
        self.node = node
        # Per job, the RoundInfo last pushed to watchers and the job revision it shows: every
        # watcher of a job gets the same message, built once per change (a round of N workers
        # has N watchers, so building it per watcher costs N^2).
        self._pushed: dict[str, tuple[int, rendezvous_pb2.RoundInfo]] = {}
        # Round-change signals for batch heartbeat streams (one watcher per job).
        self._signals = RoundSignals()

    # ----------------------------------------------------------------- reading jobs

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

    def _job(self, job_id: str) -> JobView:
        job = self.node.state.rendezvous.jobs.get(job_id)
        if job is None:
            raise RequestFailed(JobNotFound(job_id))
        return job

    def _member_pb(
        self, job: JobView, pid: int, rank: int, with_phi: bool, names: dict[int, str]
    ) -> rendezvous_pb2.RoundMember:
        """``names``: ``_ended_names(job)``, built once per answer, not per member."""
        member = rendezvous_pb2.RoundMember(participant_id=pid, rank=rank)
        participant = job.participants.get(pid)
        if participant is not None:
            member.name, member.metadata = participant.name, participant.metadata
        else:
            member.name = names.get(pid, "")
        if with_phi:
            phi = self.node.phi(job.job_id, pid)
            member.phi = 0.0 if phi is None else phi
            member.heartbeat_age_ms = self.node.heartbeat_age_ms(job.job_id, pid) or 0
            progress = self.node.progress_of(job.job_id, pid)
            if progress is not None:
                member.step, member.step_ms, member.step_ratio = progress
        return member

    def round_info(self, job: JobView, with_phi: bool = False) -> rendezvous_pb2.RoundInfo:
        r = job.round
        names = _ended_names(job)
        return rendezvous_pb2.RoundInfo(
            job=job.job_id,
            round=r.number,
            state=_ROUND_STATES[r.state],
            members=[
                self._member_pb(job, s.participant_id, s.rank, with_phi, names) for s in r.members
            ],
            world_size=len(r.members) if r.state is RoundState.ACTIVE else 0,
            fencing_token=r.fencing_token,
            store_namespace=f"{job.job_id}/{r.number}",
            reason=round_reason(job, self.node.leader_clock_ms()),
            waiting=[self._member_pb(job, pid, -1, with_phi, names) for pid in job.waiting],
            opened_ms=r.opened_ms,
            closed_ms=r.closed_ms,
            job_closed=job.closed,
            job_revision=job.revision,
            job_state=_JOB_STATES[job.state],
            job_ended_ms=job.ended_ms,
            job_end_detail=job.end_detail,
            trained_ms=r.trained_ms,
            restore=r.restore,
        )

    async def GetJob(
        self, request: rendezvous_pb2.GetJobRequest, context: Context
    ) -> rendezvous_pb2.GetJobResponse:
        job_id = validate.job_id(request.job)
        await read_barrier(self.node, context, request.serializable)
        job = self._job(job_id)
        response = rendezvous_pb2.GetJobResponse(
            header=header_pb(self.node.header()),
            config=config_pb(job.config),
            round=self.round_info(job, with_phi=True),
            history=[record_pb(record) for record in job.history],
        )
        latest = job.checkpoints.latest()
        if latest is not None:
            response.latest_checkpoint.CopyFrom(checkpoint_pb(latest))
        memory = job.checkpoints.latest_memory_snapshot()
        if memory is not None:
            response.latest_memory_snapshot.CopyFrom(memory_snapshot_pb(memory))
        return response

    async def ListMembers(
        self, request: rendezvous_pb2.ListMembersRequest, context: Context
    ) -> rendezvous_pb2.ListMembersResponse:
        job_id = validate.job_id(request.job)
        if not 0 <= request.limit <= LIST_MEMBERS_MAX:
            raise InvalidArgument("limit", f"must be 0..{LIST_MEMBERS_MAX}, got {request.limit}")
        limit = request.limit or LIST_MEMBERS_DEFAULT
        await read_barrier(self.node, context, request.serializable)
        job = self._job(job_id)
        r = job.round
        # Both are in participant-id order (ids increase in join order): find the page's
        # start by bisection, then take at most `limit`.
        if request.waiting:
            start = bisect.bisect_right(job.waiting, request.after)
            page = [(pid, -1) for pid in job.waiting[start : start + limit]]
            total = len(job.waiting)
        else:
            key = _participant_id
            start = bisect.bisect_right(r.members, request.after, key=key)
            page = [(s.participant_id, s.rank) for s in r.members[start : start + limit]]
            total = len(r.members)
        names = _ended_names(job)
        return rendezvous_pb2.ListMembersResponse(
            header=header_pb(self.node.header()),
            round=r.number,
            state=_ROUND_STATES[r.state],
            members=[self._member_pb(job, pid, rank, False, names) for pid, rank in page],
            more=start + limit < total,
        )

    async def ListJobs(
        self, request: rendezvous_pb2.ListJobsRequest, context: Context
    ) -> rendezvous_pb2.ListJobsResponse:
        await read_barrier(self.node, context, request.serializable)
        jobs = self.node.state.rendezvous.jobs
        return rendezvous_pb2.ListJobsResponse(
            header=header_pb(self.node.header()),
            jobs=[self.round_info(jobs[job_id]) for job_id in sorted(jobs)],
        )

    async def WatchJob(
        self, request: rendezvous_pb2.WatchJobRequest, context: Context
    ) -> AsyncIterator[rendezvous_pb2.WatchJobResponse]:
        job_id = validate.job_id(request.job)
        await read_barrier(self.node, context, serializable=False)
        loop = asyncio.get_running_loop()
        while True:
            job = self._job(job_id)
            revision, position = job.revision, _position(job)
            yield rendezvous_pb2.WatchJobResponse(
                header=header_pb(self.node.header()), round=self._round_info_to_push(job)
            )
            hold_until = loop.time() + WATCH_COALESCE_S
            # No await between a check and the wait that follows it: no apply is missed.
            while not self._changed_since(job_id, revision):
                await self.node.wait_for_apply(WATCH_RECHECK_S)
            # Changed. Within the same round and state, gather more changes for a moment.
            while (remaining := hold_until - loop.time()) > 0 and (
                _position(self._job(job_id)) == position
            ):
                await self.node.wait_for_apply(remaining)

    def _round_info_to_push(self, job: JobView) -> rendezvous_pb2.RoundInfo:
        pushed = self._pushed.get(job.job_id)
        if pushed is not None and pushed[0] == job.revision:
            return pushed[1]
        info = self.round_info(job)
        if len(self._pushed) > 1024:
            self._pushed.clear()
        self._pushed[job.job_id] = (job.revision, info)
        return info

    def _changed_since(self, job_id: str, revision: int) -> bool:
        changed = self.node.state.rendezvous.job_changed_since(job_id, revision)
        if changed is None:
            raise RequestFailed(JobNotFound(job_id))
        return changed

    # ----------------------------------------------------------------- heartbeats

    async def Heartbeat(
        self,
        request_iterator: AsyncIterator[rendezvous_pb2.HeartbeatRequest],
        context: Context,
    ) -> AsyncIterator[rendezvous_pb2.HeartbeatResponse]:
        # The participants this stream has fed, and the (round, state) it last told each.
        carried: dict[tuple[str, int], tuple[int, RoundState] | None] = {}
        heartbeats = 0
        clock = StreamClock()
        try:
            async for request in request_iterator:
                if request.sent_ms:
                    self.node.request_lag(clock, monotonic_ms(), request.sent_ms)
                job_id = validate.job_id(request.job)
                pid = validate.positive(request.participant_id, "participant_id")
                # The participant id is the raft index of its Join. A member that answered the
                # Join may have applied it before this leader did (the leader's own write can
                # finish after a quorum of followers acknowledged): wait for the apply rather
                # than call a live participant unknown.
                await self._applied_through(pid)
                progress = None
                if request.reports_progress:
                    progress = _progress(request)
                key = (job_id, pid)
                if key not in carried:
                    if not self.node.carry(job_id, pid):
                        self._job(job_id)
                        raise RequestFailed(ParticipantNotFound(job_id, pid))
                    carried[key] = None
                if not self.node.heartbeat(job_id, pid, progress):
                    self._job(job_id)
                    raise RequestFailed(ParticipantNotFound(job_id, pid))
                told = carried[key]
                heartbeats += 1
                r = self._job(job_id).round
                current = (r.number, r.state)
                if (
                    request.round != r.number
                    or told != current
                    or (heartbeats % HEARTBEAT_ANSWER_EVERY == 0)
                ):
                    carried[key] = current
                    yield rendezvous_pb2.HeartbeatResponse(
                        header=header_pb(self.node.header()),
                        current_round=r.number,
                        state=_ROUND_STATES[r.state],
                    )
        except NotLeaderError:
            # This member is cut off from the leader: the worker moves to another member,
            # which watches it afresh; this member's silence about it is no evidence.
            for job_id, pid in sorted(carried):
                self.node.heartbeat_released(job_id, pid)
            carried.clear()
            raise
        finally:
            jobs = self.node.state.rendezvous.jobs
            for job_id, pid in sorted(carried):
                job = jobs.get(job_id)
                if job is not None and pid in job.participants:
                    self.node.heartbeat_stream_closed(job_id, pid)
                else:
                    self.node.heartbeat_released(job_id, pid)

    async def HeartbeatBatch(
        self,
        request_iterator: AsyncIterator[rendezvous_pb2.HeartbeatBatchRequest],
        context: Context,
    ) -> AsyncIterator[rendezvous_pb2.HeartbeatBatchResponse]:
        # Per job this stream carries participants of: their group detector and what the
        # stream last told each.
        stream_jobs: dict[str, _StreamJob] = {}
        clock = StreamClock()
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
                self.node.request_lag(clock, now_ms, request.sent_ms)
                self.node.serves_heartbeats()
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
                self.node.close_group(carried.group, now_ms, closed=True)

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
                self.node.group_release(carried.group, job_id, pid)
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
                state=_ROUND_STATES[seat.state],
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
        job = self._job(job_id)
        carried = stream_jobs.get(job_id)
        if carried is None:
            carried = stream_jobs[job_id] = _StreamJob(self.node.open_group(job_id, now_ms))
        answer = rendezvous_pb2.HeartbeatBatchResponse(
            header=header_pb(self.node.header()), seq=request.seq
        )
        told = carried.told
        for pid in request.released:
            if told.pop(pid, _ABSENT) is not _ABSENT:
                self.node.group_release(carried.group, job_id, pid)
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
                        self.node.group_release(carried.group, job_id, pid)
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
            self.node.group_update(carried.group, members, now_ms)
            self._assign(job, stale, answer)
            carried.last_pids = pids
            carried.revision = job.revision
        self.node.group_beat(carried.group, now_ms)
        for entry in request.progress:
            if entry.participant_id not in told:
                continue
            self.node.report_progress(
                job_id,
                entry.participant_id,
                _progress(entry),
                now_ms,
            )
        return answer

    # ----------------------------------------------------------------- commands

    async def Configure(
        self, request: rendezvous_pb2.ConfigureRequest, context: Context
    ) -> rendezvous_pb2.ConfigureResponse:
        limits = self.node.state.limits.rendezvous
        header = validate.session_header(request.HasField("header"), request.header)
        command = Configure(
            job=validate.job_id(request.job),
            config=validate.job_config(request.HasField("config"), request.config, limits),
        )
        result = await propose(self.node, command, context, ConfigureResult, header)
        return rendezvous_pb2.ConfigureResponse(
            header=header_pb(self.node.header()),
            created=result.created,
            round=self.round_info(self._job(result.job)),
        )

    async def Join(
        self, request: rendezvous_pb2.JoinRequest, context: Context
    ) -> rendezvous_pb2.JoinResponse:
        limits = self.node.state.limits.rendezvous
        header = validate.session_header(request.HasField("header"), request.header)
        config = (
            validate.job_config(True, request.config, limits)
            if request.HasField("config")
            else None
        )
        command = Join(
            job=validate.job_id(request.job),
            name=validate.participant_name(request.name, limits),
            metadata=validate.participant_metadata(request.metadata, limits),
            config=config,
            resume=request.resume,
            replaces=request.replaces,
        )
        result = await propose(self.node, command, context, JoinResult, header)
        return rendezvous_pb2.JoinResponse(
            header=header_pb(self.node.header()),
            participant_id=result.participant_id,
            waiting=result.waiting,
            round=self.round_info(self._job(result.job)),
        )

    async def JoinBatch(
        self, request: rendezvous_pb2.JoinBatchRequest, context: Context
    ) -> rendezvous_pb2.JoinBatchResponse:
        limits = self.node.state.limits.rendezvous
        header = validate.session_header(request.HasField("header"), request.header)
        job_id = validate.job_id(request.job)
        config = (
            validate.job_config(True, request.config, limits)
            if request.HasField("config")
            else None
        )
        names, metadata = list(request.names), list(request.metadata)
        if not 1 <= len(names) <= limits.max_batch_joins:
            raise InvalidArgument(
                "names", f"must hold 1..{limits.max_batch_joins} names, got {len(names)}"
            )
        if metadata and len(metadata) != len(names):
            raise InvalidArgument(
                "metadata",
                f"must be empty or one per name: {len(metadata)} for {len(names)} names",
            )
        first: dict[str, int] = {}
        for entry, name in enumerate(names):
            validate.participant_name(name, limits, f"names[{entry}]")
            if first.setdefault(name, entry) != entry:
                raise InvalidArgument(f"names[{entry}]", f"{name!r} repeats names[{first[name]}]")
        for entry, data in enumerate(metadata):
            if len(data) > limits.max_metadata_bytes:
                what = f"participant metadata bytes (metadata[{entry}])"
                raise RequestFailed(LimitExceeded(what, limits.max_metadata_bytes))
        if batch_bytes(names, metadata) > limits.max_batch_bytes:
            what = "bytes of names and metadata in one batch"
            raise RequestFailed(LimitExceeded(what, limits.max_batch_bytes))
        command = JoinBatch(
            job=job_id,
            names=tuple(names),
            metadata=tuple(metadata),
            config=config,
            resume=request.resume,
        )
        result = await propose(self.node, command, context, JoinBatchResult, header)
        return rendezvous_pb2.JoinBatchResponse(
            header=header_pb(self.node.header()),
            participant_ids=list(result.participant_ids),
            waiting=list(result.waiting),
            round=result.round,
            state=_ROUND_STATES[result.state],
        )

    async def Leave(
        self, request: rendezvous_pb2.LeaveRequest, context: Context
    ) -> rendezvous_pb2.LeaveResponse:
        header = validate.session_header(request.HasField("header"), request.header)
        outcome = _LEAVE_OUTCOMES.get(request.outcome)
        if outcome is None:
            raise InvalidArgument("outcome", f"unknown LeaveOutcome {request.outcome}")
        limit = self.node.state.limits.rendezvous.max_leave_detail_chars
        if len(request.detail) > limit:
            raise InvalidArgument("detail", f"at most {limit} characters")
        command = Leave(
            job=validate.job_id(request.job),
            participant_id=validate.positive(request.participant_id, "participant_id"),
            outcome=outcome,
            detail=request.detail,
        )
        result = await propose(self.node, command, context, RemoveResult, header)
        return rendezvous_pb2.LeaveResponse(
            header=header_pb(self.node.header()), ended_round=result.ended_round
        )

    async def Evict(
        self, request: rendezvous_pb2.EvictRequest, context: Context
    ) -> rendezvous_pb2.EvictResponse:
        header = validate.session_header(request.HasField("header"), request.header)
        command = Evict(
            job=validate.job_id(request.job),
            participant_id=validate.positive(request.participant_id, "participant_id"),
        )
        result = await propose(self.node, command, context, RemoveResult, header)
        return rendezvous_pb2.EvictResponse(
            header=header_pb(self.node.header()), ended_round=result.ended_round
        )

    async def CloseJob(
        self, request: rendezvous_pb2.CloseJobRequest, context: Context
    ) -> rendezvous_pb2.CloseJobResponse:
        header = validate.session_header(request.HasField("header"), request.header)
        command = CloseJob(job=validate.job_id(request.job))
        result = await propose(self.node, command, context, CloseJobResult, header)
        return rendezvous_pb2.CloseJobResponse(
            header=header_pb(self.node.header()), ended_round=result.ended_round
        )

    async def PruneJobs(
        self, request: rendezvous_pb2.PruneJobsRequest, context: Context
    ) -> rendezvous_pb2.PruneJobsResponse:
        header = validate.session_header(request.HasField("header"), request.header)
        command = PruneJobs(
            older_than_ms=validate.non_negative(request.older_than_ms, "older_than_ms"),
            keep=validate.non_negative(request.keep, "keep"),
            jobs=tuple(validate.job_id(job, "jobs") for job in request.jobs),
        )
        result = await propose(self.node, command, context, PruneJobsResult, header)
        return rendezvous_pb2.PruneJobsResponse(
            header=header_pb(self.node.header()), pruned=list(result.pruned)
        )


def _ended_names(job: JobView) -> dict[int, str]:
    """A closed job's participants are gone; its last round's record keeps their names."""
    if job.history and job.history[-1].number == job.round.number:
        return {m.participant_id: m.name for m in job.history[-1].members}
    return {}


def _participant_id(seat: Seat) -> int:
    return seat.participant_id


def _progress(
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


def _position(job: JobView) -> tuple[int, RoundState, JobState]:
    """What a watcher is told at once when it changes: round number, round state, job state."""
    return job.round.number, job.round.state, job.state


class _StreamJob:
    """What one batch stream keeps for one job: its participants' group detector, what it
    last told each (round, state), and the request and job revision last seen in full."""

    __slots__ = ("group", "last_pids", "revision", "told")

    def __init__(self, group: int) -> None:
        self.group = group
        self.told: dict[int, tuple[int, RoundState] | None] = {}
        self.last_pids: list[int] | None = None
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
            signal = self._jobs[job_id] = _JobSignal(None if job is None else _position(job))
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
            position = None if job is None else _position(job)
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
