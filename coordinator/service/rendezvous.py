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
(``coordinator/liveness``, reached through ``liveness.port.LivenessPort``): GetJob reports
each member's phi as the answering member's detectors see it, and 0 (as rendezvous.proto
documents) for a participant whose stream another member serves. A suspicion that is
certain (a closed stream confirmed) is +inf.

Heartbeat and HeartbeatBatch are served by ``heartbeats.HeartbeatStreams``, one path for
both (see there).

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
import contextlib
from collections.abc import AsyncIterator

from rallypoint.proto.v1 import rendezvous_pb2, rendezvous_pb2_grpc

from ..leader.supervisor import monotonic_ms
from ..node.api import ServerNode
from ..state.commands import CloseJob, Configure, Evict, Join, JoinBatch, Leave, PruneJobs
from ..state.errors import Failure, JobNotFound, LimitExceeded
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
    DrainResult,
    JoinBatchResult,
    JoinResult,
    PruneJobsResult,
    RemoveResult,
)
from ..state.view import JobView
from . import domains, validate
from .checkpoint import checkpoint_pb, memory_snapshot_pb
from .common import ROUND_STATES, Context, header_pb, job_view, propose, read_barrier
from .errors import InvalidArgument, RequestFailed
from .heartbeats import WATCH_RECHECK_S, HeartbeatStreams, job_position

# The least time between two WatchJob messages about the same round in the same state.
WATCH_COALESCE_S = 0.2
# ListMembers' page size when the request says 0, and the most a request may ask for.
LIST_MEMBERS_DEFAULT = 1_000
LIST_MEMBERS_MAX = 10_000

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
    EndReason.DRAINED: rendezvous_pb2.ROUND_END_REASON_DRAINED,
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
        unit_size=config.unit_size,
        domain_size=config.domain_size,
        units_within_domains=config.units_within_domains,
        straggler_hold_windows=config.straggler_hold_windows,
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
        # Keyed by the drained domains too: a drain can change a job's spares without a
        # change to the job.
        self._pushed: dict[str, tuple[int, tuple[str, ...], rendezvous_pb2.RoundInfo]] = {}
        self.liveness = node.liveness
        self._heartbeats = HeartbeatStreams(node, node.liveness)

    # ----------------------------------------------------------------- reading jobs

    def _job(self, job_id: str) -> JobView:
        return job_view(self.node, job_id)

    def _member_pb(
        self, job: JobView, pid: int, rank: int, with_phi: bool, names: dict[int, str]
    ) -> rendezvous_pb2.RoundMember:
        """``names``: ``_ended_names(job)``, built once per answer, not per member."""
        member = rendezvous_pb2.RoundMember(participant_id=pid, rank=rank)
        participant = job.participants.get(pid)
        if participant is not None:
            member.name, member.metadata = participant.name, participant.metadata
            member.domain = participant.domain
        else:
            member.name = names.get(pid, "")
        if with_phi:
            phi = self.liveness.phi(job.job_id, pid)
            member.phi = 0.0 if phi is None else phi
            member.heartbeat_age_ms = self.liveness.heartbeat_age_ms(job.job_id, pid) or 0
            progress = self.liveness.progress_of(job.job_id, pid)
            if progress is not None:
                member.step, member.step_ms, member.step_ratio = progress
        return member

    def round_info(self, job: JobView, with_phi: bool = False) -> rendezvous_pb2.RoundInfo:
        r = job.round
        names = _ended_names(job)
        return rendezvous_pb2.RoundInfo(
            job=job.job_id,
            round=r.number,
            state=ROUND_STATES[r.state],
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
            spares=self._spares_of(job),
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
            state=ROUND_STATES[r.state],
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
            revision, position = job.revision, job_position(job)
            drained = self._drained_names()
            pushed = self._round_info_to_push(job, drained)
            yield rendezvous_pb2.WatchJobResponse(
                header=header_pb(self.node.header()), round=pushed
            )
            hold_until = loop.time() + WATCH_COALESCE_S
            # No await between a check and the wait that follows it: no apply is missed.
            while not self._changed_since(job_id, revision):
                # A drain or undrain may change the job's spares without changing the job
                # (only its waiters are in the domain): counted once per drained-set change.
                if (now := self._drained_names()) != drained:
                    drained = now
                    if self._spares_of(self._job(job_id)) != pushed.spares:
                        break
                await self.node.wait_for_apply(WATCH_RECHECK_S)
            # Changed. Within the same round and state, gather more changes for a moment.
            while (remaining := hold_until - loop.time()) > 0 and (
                job_position(self._job(job_id)) == position
            ):
                await self.node.wait_for_apply(remaining)

    def _round_info_to_push(
        self, job: JobView, drained: tuple[str, ...]
    ) -> rendezvous_pb2.RoundInfo:
        pushed = self._pushed.get(job.job_id)
        if pushed is not None and pushed[:2] == (job.revision, drained):
            return pushed[2]
        info = self.round_info(job)
        if len(self._pushed) > 1024:
            self._pushed.clear()
        self._pushed[job.job_id] = (job.revision, drained, info)
        return info

    def _drained_names(self) -> tuple[str, ...]:
        return tuple(d.domain for d in self.node.state.rendezvous.drained_domains())

    def _spares_of(self, job: JobView) -> int:
        waiting = [_domain_of(job, pid) for pid in job.waiting]
        return domains.spares(self.node.state.rendezvous, waiting)

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
        # aclosing: the stream's end (and its evidence) runs when gRPC closes this handler.
        async with contextlib.aclosing(self._heartbeats.per_participant(request_iterator)) as it:
            async for response in it:
                yield response

    async def HeartbeatBatch(
        self,
        request_iterator: AsyncIterator[rendezvous_pb2.HeartbeatBatchRequest],
        context: Context,
    ) -> AsyncIterator[rendezvous_pb2.HeartbeatBatchResponse]:
        async with contextlib.aclosing(self._heartbeats.batch(request_iterator)) as it:
            async for response in it:
                yield response

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
            domain=domains.domain(request.domain, limits),
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
        hosts = domains.join_domains(list(request.domains), len(names), limits)
        if batch_bytes(names, metadata) > limits.max_batch_bytes:
            what = "bytes of names and metadata in one batch"
            raise RequestFailed(LimitExceeded(what, limits.max_batch_bytes))
        command = JoinBatch(
            job=job_id,
            names=tuple(names),
            metadata=tuple(metadata),
            config=config,
            resume=request.resume,
            domains=hosts,
        )
        result = await propose(self.node, command, context, JoinBatchResult, header)
        return rendezvous_pb2.JoinBatchResponse(
            header=header_pb(self.node.header()),
            participant_ids=list(result.participant_ids),
            waiting=list(result.waiting),
            round=result.round,
            state=ROUND_STATES[result.state],
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

    async def ReportCollectiveFailure(
        self, request: rendezvous_pb2.ReportCollectiveFailureRequest, context: Context
    ) -> rendezvous_pb2.ReportCollectiveFailureResponse:
        """A survivor's word that its collective failed: hastens the verdict on the round's
        members whose heartbeat stream closed on this member (rendezvous.proto). Fenced as a
        round-store write is (``member_store``): only a member of the job's current ACTIVE
        round, for that round, so a confused or stale rank is refused and confirms nothing.
        Read from this member's applied state, with no barrier: a member behind refuses a
        report for a round it has not applied yet, and the verdict it hastens is re-checked
        when MemberFailed applies (same round, still a participant)."""
        job_id = validate.job_id(request.job)
        pid = validate.positive(request.participant_id, "participant_id")
        round_number = validate.positive(request.round, "round")
        limit = self.node.state.limits.rendezvous.max_leave_detail_chars
        if len(request.detail) > limit:
            raise InvalidArgument("detail", f"at most {limit} characters")
        fenced = self.node.state.rendezvous.member_store(job_id, round_number, pid)
        if isinstance(fenced, Failure):
            raise RequestFailed(fenced)
        job = self._job(job_id)
        rank = job.rank_of(pid)
        peers = [seat.participant_id for seat in job.round.members if seat.participant_id != pid]
        detail = request.detail.splitlines()[0][:200] if request.detail else "no detail"
        report = (
            f"rank {rank} (participant {pid}) reported a failed collective in round "
            f"{round_number}: {detail}"
        )
        confirmed = self.liveness.collective_failed(
            job_id, round_number, peers, report, monotonic_ms()
        )
        return rendezvous_pb2.ReportCollectiveFailureResponse(
            header=header_pb(self.node.header()), confirmed=confirmed
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

    # ----------------------------------------------------------------- failure domains

    async def Drain(
        self, request: rendezvous_pb2.DrainRequest, context: Context
    ) -> rendezvous_pb2.DrainResponse:
        limits = self.node.state.limits.rendezvous
        header = validate.session_header(request.HasField("header"), request.header)
        command = domains.drain_command(request, limits, limits.max_leave_detail_chars)
        if domains.checks_participants():
            # The worker's own join may not have reached this member yet: read it.
            await read_barrier(self.node, context, serializable=False)
            domains.check_may_drain(self.node.state.rendezvous, header, command.domain)
        result = await propose(self.node, command, context, DrainResult, header)
        return domains.drain_pb(result, header_pb(self.node.header()))

    async def Undrain(
        self, request: rendezvous_pb2.UndrainRequest, context: Context
    ) -> rendezvous_pb2.UndrainResponse:
        limits = self.node.state.limits.rendezvous
        header = validate.session_header(request.HasField("header"), request.header)
        command = domains.drain_command(request, limits, limits.max_leave_detail_chars)
        result = await propose(self.node, command, context, DrainResult, header)
        return rendezvous_pb2.UndrainResponse(
            header=header_pb(self.node.header()), changed=result.changed
        )

    async def ListDrained(
        self, request: rendezvous_pb2.ListDrainedRequest, context: Context
    ) -> rendezvous_pb2.ListDrainedResponse:
        await read_barrier(self.node, context, request.serializable)
        return domains.drained_pb(self.node.state.rendezvous, header_pb(self.node.header()))

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


def _domain_of(job: JobView, pid: int) -> str:
    participant = job.participants.get(pid)
    return participant.domain if participant is not None else ""


def _participant_id(seat: Seat) -> int:
    return seat.participant_id
