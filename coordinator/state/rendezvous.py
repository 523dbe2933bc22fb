"""Rendezvous: jobs, rounds, stable ranks, the wait list, and the fencing of round-scoped
writes. Part of the deterministic state machine: time is the machine's ``now_ms``.

Theory of operation. A job has one current round. A round is JOINING while it collects
participants, then ACTIVE once closed (membership and ranks fixed, fencing token = the raft
index of the close), then ENDED. Every participant of an open job is exactly one of: a
member of the current round, or waiting (the wait list is non-empty only while the round is
ACTIVE: a JOINING round takes joiners directly).

Closing. A JOINING round closes, in the same apply, as soon as max_nodes are present, or
when min_nodes are present and ``last_call_ms`` has passed since the minimum was reached
(``min_reached_ms``, cleared if the count drops below min again). With a last call of 0 that
is at once. Otherwise the leader proposes ``CloseRound`` when its clock says the last call
is over (``closes_due``); the apply re-checks the condition against the machine's time, so
followers never decide from their own clocks and a stale proposal changes nothing.

Ending. An ACTIVE round ends when a member fails (``MemberFailed`` from the leader's
detector, or its session ends), leaves, or is evicted; for a scale-up (``scale_up`` set, a
participant waiting, fewer than max_nodes members); or when the job closes. The ended round
goes to the bounded history; its store is dropped and its pending checkpoints with it. The
next round opens at once, JOINING, with the surviving members carried over (they are alive
by the detector's account; they need not join again) plus waiting participants in join
order, up to max_nodes; it may close in the same apply. A member removed from a JOINING
round simply leaves it (no round change); a waiter removed leaves the wait list.

Ranks (``jobs.assign_ranks``): at the close, a survivor keeps its previous rank if it is
below the new world size; freed ranks are filled by displaced survivors, then newcomers in
join order.

Jobs are created by ``Configure`` or the first ``Join`` carrying a config. A Join's config
must equal the job's; ``Configure`` may change anything as long as max_nodes stays at least
the current round's size (a new min or max applies at once). ``CloseJob`` ends the round
and removes every participant; the job stays (closed, its history kept) until ``Configure``
reopens it with a higher round number, or retention drops it.

Job lifecycle (``JobState``). A job is OPEN until it ends: CLOSED by ``CloseJob``, or
FINISHED or FAILED by the leave of its last participant (``Leave.outcome``). A leave that
says FAILED while others remain is remembered (``failure``, the first one): the job then
ends FAILED when its last participant goes, however it goes (a worker that failed first
makes the run a failure even if the others then finish or die). A last participant that
leaves without an outcome, or is removed as failed with no failure remembered, leaves the
job OPEN: a restarted worker may come back. An ended job keeps its current round (JOINING,
empty) and its history; a Join or a Configure starts it again (OPEN; a Join's config
replaces the old run's).

Retention. Ended jobs (finished, failed, closed) are dropped, oldest ``ended_ms`` first,
beyond ``max_ended_jobs`` and once ``ended_job_retention_ms`` has passed since they ended,
both judged at the machine's time when a job command applies (so every replica drops the
same jobs at the same index), and by ``PruneJobs``, an operator's command. When the job
table is full, a new job takes the place of the oldest ended one.

Training again. The leader proposes ``RoundTrained`` when a worker of an ACTIVE round
reports its first step done (``supervisor.py``); the round's ``trained_ms`` records that time
(kept in its history record), so a recovery reads as: detected (the failed round's
``ended_ms``), re-formed (the next round's ``closed_ms``), training again (its
``trained_ms``). The same command carries where the round's state came from (``restore``:
keep, broadcast, disk, fresh, as the workers reported it; "" when they did not say), kept
beside ``trained_ms``: set once, by the first ``RoundTrained`` applied.

``join_timeout_ms`` is enforced by the client (how long a worker waits for its round to
close); ``reason`` reports how long a round has been joining.

Watching: every change to a job sets its ``revision`` to the raft index of the change (and
``Rendezvous.revision`` to the same), so a watcher compares revisions instead of states.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from . import codec
from .checkpoints import CheckpointRegistry
from .commands import (
    CloseJob,
    CloseRound,
    Configure,
    Evict,
    JobCommand,
    Join,
    Leave,
    MemberFailed,
    PruneJobs,
    RoundTrained,
)
from .errors import (
    ConfigConflict,
    Failure,
    InvalidCommand,
    JobClosed,
    JobNotFound,
    LimitExceeded,
    NameTaken,
    ParticipantNotFound,
    StaleRound,
    StaleToken,
)
from .jobs import (
    EndReason,
    JobConfig,
    JobState,
    LeaveOutcome,
    MemberRecord,
    Participant,
    RendezvousLimits,
    Round,
    RoundRecord,
    RoundState,
    Seat,
    assign_ranks,
    job_id_problem,
)
from .results import (
    CloseJobResult,
    CloseRoundResult,
    ConfigureResult,
    JoinResult,
    PruneJobsResult,
    RemoveResult,
    Result,
    RoundTrainedResult,
)
from .roundstore import RoundStore
from .view import JobView


@dataclass(slots=True)
class Job:
    job_id: str
    config: JobConfig
    round: Round
    # The raft index of the last change. Invariant: <= the machine's applied_index.
    revision: int
    closed: bool = False
    # Invariant: the members of `round` and `waiting` together, when the job is open; empty
    # when closed. `names` maps each participant's name to its id.
    participants: dict[int, Participant] = field(default_factory=dict)
    names: dict[str, int] = field(default_factory=dict)
    # Participant ids in join order. Invariant: empty unless the round is ACTIVE.
    waiting: list[int] = field(default_factory=list)
    # Ended rounds, oldest first. Invariant: at most max_round_history entries.
    history: list[RoundRecord] = field(default_factory=list)
    # Invariant: set exactly while the round is ACTIVE.
    store: RoundStore | None = None
    checkpoints: CheckpointRegistry = field(default_factory=CheckpointRegistry)
    # FINISHED or FAILED once the last participant left saying so; OPEN otherwise (CLOSED is
    # `closed`). Invariant: not OPEN only while the job has no participant.
    outcome: JobState = JobState.OPEN
    # When the job ended (finished, failed or closed) and, for the first two, what the leaves
    # said. Invariant: 0 and "" while the job is open.
    ended_ms: int = 0
    end_detail: str = ""
    # The first failure a leaving participant reported since the job opened ("": none).
    failure: str = ""

    @property
    def state(self) -> JobState:
        return JobState.CLOSED if self.closed else self.outcome

    @property
    def ended(self) -> bool:
        return self.state is not JobState.OPEN

    def reopen(self) -> None:
        """An ended job starts again: a new run under the same id."""
        self.closed, self.outcome = False, JobState.OPEN
        self.ended_ms, self.end_detail, self.failure = 0, "", ""

    def close_due(self, now_ms: int) -> bool:
        """The current round is JOINING and may close at leader time ``now_ms``."""
        r = self.round
        if r.state is not RoundState.JOINING:
            return False
        if len(r.members) >= self.config.max_nodes:
            return True
        return (
            r.min_reached_ms is not None and now_ms - r.min_reached_ms >= self.config.last_call_ms
        )


def _joining(number: int, members: list[int], previous: tuple[Seat, ...], now_ms: int) -> Round:
    seats = tuple(Seat(pid, -1) for pid in sorted(members))
    return Round(number, RoundState.JOINING, seats, previous, now_ms, None, 0, 0)


class Rendezvous:
    def __init__(self, limits: RendezvousLimits) -> None:
        self.limits = limits
        # Iterated only through sorted() (str hash with the process's seed).
        self.jobs: dict[str, Job] = {}
        # The raft index of the last change to any job.
        self.revision = 0

    # ----------------------------------------------------------------- commands

    def execute(self, index: int, session_id: int, now_ms: int, command: JobCommand) -> Result:
        problem = job_id_problem(command.job)
        if problem:
            return InvalidCommand(problem)
        self._retain_ended(index, now_ms)
        if isinstance(command, Configure):
            return self._configure(index, now_ms, command)
        if isinstance(command, Join):
            return self._join(index, session_id, now_ms, command)
        job = self.jobs.get(command.job)
        if job is None:
            return JobNotFound(command.job)
        if isinstance(command, CloseJob):
            return self._close_job(index, now_ms, job)
        if isinstance(command, Leave):
            if command.participant_id not in job.participants:
                return ParticipantNotFound(job.job_id, command.participant_id)
            limit = self.limits.max_leave_detail_chars
            if len(command.detail) > limit:
                return InvalidCommand(f"a leave's detail must be at most {limit} characters")
            pid = command.participant_id
            if command.outcome is LeaveOutcome.FAILED and not job.failure:
                name = job.participants[pid].name
                job.failure = command.detail or f"{name} left saying the job failed"
            result = self._remove(index, now_ms, job, pid, EndReason.MEMBER_LEFT, "")
            if not job.participants and command.outcome is not LeaveOutcome.UNSPECIFIED:
                self._end_job(index, now_ms, job, command.detail)
            self._end_if_failed(index, now_ms, job)
            return result
        if isinstance(command, Evict):
            if command.participant_id not in job.participants:
                return ParticipantNotFound(job.job_id, command.participant_id)
            reason = EndReason.MEMBER_EVICTED
            result = self._remove(index, now_ms, job, command.participant_id, reason, "")
            self._end_if_failed(index, now_ms, job)
            return result
        raise AssertionError(f"no rule to execute {command!r}")

    def round_trained(self, index: int, now_ms: int, command: RoundTrained) -> Result:
        job = self.jobs.get(command.job)
        r = job.round if job is not None else None
        if (
            job is None
            or r is None
            or r.number != command.round
            or r.state is not RoundState.ACTIVE
            or r.trained_ms
        ):
            return RoundTrainedResult(command.job, command.round, False)
        job.round = replace(r, trained_ms=now_ms, restore=command.restore)
        self._touch(index, job)
        return RoundTrainedResult(command.job, command.round, True)

    def prune(self, index: int, now_ms: int, command: PruneJobs) -> Result:
        """Remove ended jobs as ``command`` says (see :class:`PruneJobs`)."""
        if command.older_than_ms < 0 or command.keep < 0:
            return InvalidCommand("older_than_ms and keep must be >= 0")
        for job_id in command.jobs:
            problem = job_id_problem(job_id)
            if problem:
                return InvalidCommand(problem)
        named = set(command.jobs)
        ended = sorted(
            (job.ended_ms, job.job_id)
            for job in self.jobs.values()
            if job.ended and (not named or job.job_id in named)
        )
        candidates = ended[: max(0, len(ended) - command.keep)]
        pruned = sorted(
            job_id for ended_ms, job_id in candidates if now_ms - ended_ms >= command.older_than_ms
        )
        for job_id in pruned:
            del self.jobs[job_id]
        if pruned:
            self.revision = index
        return PruneJobsResult(tuple(pruned))

    def close_round(self, index: int, now_ms: int, command: CloseRound) -> Result:
        job = self.jobs.get(command.job)
        if job is None or job.round.number != command.round or not job.close_due(now_ms):
            return CloseRoundResult(command.job, command.round, False)
        self._close(index, now_ms, job)
        return CloseRoundResult(command.job, command.round, True)

    def member_failed(self, index: int, now_ms: int, command: MemberFailed) -> Result:
        job = self.jobs.get(command.job)
        pid = command.participant_id
        if job is None or job.round.number != command.round or pid not in job.participants:
            return RemoveResult(command.job, pid, False, 0)
        reason = (
            command.reason
            if command.reason in (EndReason.MEMBER_FAILED, EndReason.STRAGGLER)
            else EndReason.MEMBER_FAILED
        )
        result = self._remove(index, now_ms, job, pid, reason, command.cause)
        self._end_if_failed(index, now_ms, job)
        return result

    def sessions_ended(self, index: int, now_ms: int, session_ids: list[int]) -> None:
        """Participants of ended sessions are removed as failed, in (job, id) order."""
        ended = set(session_ids)
        for job_id in sorted(self.jobs):
            job = self.jobs[job_id]
            for pid in sorted(job.participants):
                session_id = job.participants[pid].session_id
                if session_id in ended:
                    cause = f"session {session_id} ended"
                    self._remove(index, now_ms, job, pid, EndReason.MEMBER_FAILED, cause)
                    self._end_if_failed(index, now_ms, job)

    # ----------------------------------------------------------------- jobs

    def _new_job(self, index: int, now_ms: int, job_id: str, config: JobConfig) -> Failure | Job:
        if len(self.jobs) >= self.limits.max_jobs:
            ended = sorted((j.ended_ms, j.job_id) for j in self.jobs.values() if j.ended)
            if not ended:
                return LimitExceeded("jobs", self.limits.max_jobs)
            del self.jobs[ended[0][1]]
        job = Job(job_id, config, _joining(1, [], (), now_ms), index)
        self.jobs[job_id] = job
        return job

    def _configure(self, index: int, now_ms: int, command: Configure) -> Result:
        problem = command.config.problem(self.limits)
        if problem:
            return InvalidCommand(f"job {command.job!r}: {problem}")
        job = self.jobs.get(command.job)
        if job is None:
            created = self._new_job(index, now_ms, command.job, command.config)
            if isinstance(created, Failure):
                return created
            self._touch(index, created)
            return ConfigureResult(command.job, True)
        if job.closed:
            job.config = command.config
            job.reopen()
            job.round = _joining(job.round.number + 1, [], (), now_ms)
            self._touch(index, job)
            return ConfigureResult(command.job, True)
        if job.ended:
            # Finished or failed: a new run; its round (JOINING, empty) takes joins again.
            job.reopen()
            self._touch(index, job)
        present = len(job.round.members)
        if command.config.max_nodes < present:
            detail = f"max_nodes {command.config.max_nodes} is below the round's {present} members"
            return ConfigConflict(command.job, detail)
        if command.config != job.config:
            job.config = command.config
            self._after_change(index, now_ms, job)
        return ConfigureResult(command.job, False)

    def _join(self, index: int, session_id: int, now_ms: int, command: Join) -> Result:
        if not 1 <= len(command.name) <= self.limits.max_name_chars:
            return InvalidCommand(f"name must be 1..{self.limits.max_name_chars} characters")
        if len(command.metadata) > self.limits.max_metadata_bytes:
            return LimitExceeded("participant metadata bytes", self.limits.max_metadata_bytes)
        job = self.jobs.get(command.job)
        if job is None:
            if command.config is None:
                return JobNotFound(command.job)
            problem = command.config.problem(self.limits)
            if problem:
                return InvalidCommand(f"job {command.job!r}: {problem}")
            created = self._new_job(index, now_ms, command.job, command.config)
            if isinstance(created, Failure):
                return created
            job = created
        elif job.closed:
            return JobClosed(job.job_id)
        elif job.ended:
            # A new run of a finished or failed job: it takes the new run's config.
            if command.config is not None and command.config != job.config:
                problem = command.config.problem(self.limits)
                if problem:
                    return InvalidCommand(f"job {command.job!r}: {problem}")
                job.config = command.config
            job.reopen()
        elif command.config is not None and command.config != job.config:
            return ConfigConflict(job.job_id, command.config.differences(job.config))
        existing = job.names.get(command.name)
        if existing is not None:
            if job.participants[existing].session_id != session_id:
                return NameTaken(job.job_id, command.name, existing)
            return JoinResult(job.job_id, existing, job.round.number, existing in job.waiting)
        if job.round.state is RoundState.ACTIVE and len(job.waiting) >= self.limits.max_waiting:
            return LimitExceeded("waiting participants per job", self.limits.max_waiting)
        job.participants[index] = Participant(index, command.name, command.metadata, session_id)
        job.names[command.name] = index
        if job.round.state is RoundState.JOINING:
            members = (*job.round.members, Seat(index, -1))
            job.round = replace(job.round, members=members)
        else:
            job.waiting.append(index)
        self._after_change(index, now_ms, job)
        # The round may have closed or ended (scale-up) and its successor taken the joiner.
        return JoinResult(job.job_id, index, job.round.number, index in job.waiting)

    def _close_job(self, index: int, now_ms: int, job: Job) -> Result:
        if job.closed:
            return CloseJobResult(job.job_id, 0)
        ended = job.round.number
        self._end_round(index, now_ms, job, EndReason.JOB_CLOSED, 0, "")
        job.round = replace(job.round, state=RoundState.ENDED)
        job.participants.clear()
        job.names.clear()
        job.waiting.clear()
        job.reopen()
        job.closed, job.ended_ms = True, now_ms
        self._touch(index, job)
        self._retain_ended(index, now_ms)
        return CloseJobResult(job.job_id, ended)

    # ----------------------------------------------------------------- lifecycle

    def _end_job(self, index: int, now_ms: int, job: Job, detail: str) -> None:
        """The last participant left saying how the job went: FAILED if any leave said so
        since the job opened, else FINISHED."""
        failed = bool(job.failure)
        job.outcome = JobState.FAILED if failed else JobState.FINISHED
        job.ended_ms = now_ms
        job.end_detail = job.failure if failed else (detail or "the last participant finished")
        self._touch(index, job)
        self._retain_ended(index, now_ms)

    def _end_if_failed(self, index: int, now_ms: int, job: Job) -> None:
        """The last participant was removed as failed after a leave reported a failure."""
        if not job.participants and job.failure and not job.ended:
            self._end_job(index, now_ms, job, "")

    def _retain_ended(self, index: int, now_ms: int) -> None:
        """Drop ended jobs past the retention age, then the oldest beyond the count."""
        limits = self.limits
        ended = sorted((j.ended_ms, j.job_id) for j in self.jobs.values() if j.ended)
        expired = {
            job_id
            for ended_ms, job_id in ended
            if limits.ended_job_retention_ms and now_ms - ended_ms >= limits.ended_job_retention_ms
        }
        kept = [job_id for _, job_id in ended if job_id not in expired]
        expired.update(kept[: max(0, len(kept) - limits.max_ended_jobs)])
        for job_id in sorted(expired):
            del self.jobs[job_id]
        if expired:
            self.revision = index

    # ----------------------------------------------------------------- rounds

    def _touch(self, index: int, job: Job) -> None:
        job.revision = self.revision = index

    def _after_change(self, index: int, now_ms: int, job: Job) -> None:
        """Bring the round up to date after its members or the config changed: track
        ``min_reached_ms``, close a round that may close, end one for a scale-up."""
        r = job.round
        if r.state is RoundState.JOINING:
            reached = len(r.members) >= job.config.min_nodes
            if reached != (r.min_reached_ms is not None):
                job.round = replace(r, min_reached_ms=now_ms if reached else None)
            if job.close_due(now_ms):
                self._close(index, now_ms, job)
        elif job.config.scale_up and job.waiting and len(r.members) < job.config.max_nodes:
            self._end_round(index, now_ms, job, EndReason.SCALE_UP, 0, "")
            self._open_next(index, now_ms, job, survivors=r.members)
        self._touch(index, job)

    def _close(self, index: int, now_ms: int, job: Job) -> None:
        r = job.round
        previous = {seat.participant_id: seat.rank for seat in r.previous}
        ranks = assign_ranks(previous, r.member_ids)
        members = tuple(Seat(pid, ranks[pid]) for pid in r.member_ids)
        job.round = replace(
            r, state=RoundState.ACTIVE, members=members, closed_ms=now_ms, fencing_token=index
        )
        job.store = RoundStore()
        self._touch(index, job)

    def _end_round(
        self, index: int, now_ms: int, job: Job, reason: EndReason, ended_by: int, detail: str
    ) -> None:
        """Record the current round in the history and drop what was scoped to it."""
        r = job.round
        members = tuple(
            MemberRecord(seat.participant_id, job.participants[seat.participant_id].name, seat.rank)
            for seat in r.members
        )
        job.history.append(
            RoundRecord(
                r.number, members, r.fencing_token, r.opened_ms, r.closed_ms, now_ms,
                reason, ended_by, detail, r.trained_ms, r.restore,
            )
        )  # fmt: skip
        del job.history[: max(0, len(job.history) - self.limits.max_round_history)]
        job.store = None
        job.checkpoints.drop_pending()
        self._touch(index, job)

    def _open_next(self, index: int, now_ms: int, job: Job, survivors: tuple[Seat, ...]) -> None:
        room = job.config.max_nodes - len(survivors)
        newcomers, job.waiting = job.waiting[:room], job.waiting[room:]
        members = [seat.participant_id for seat in survivors] + newcomers
        job.round = _joining(job.round.number + 1, members, survivors, now_ms)
        self._after_change(index, now_ms, job)

    def _remove(
        self, index: int, now_ms: int, job: Job, pid: int, reason: EndReason, detail: str
    ) -> Result:
        ended_round = 0
        r = job.round
        if pid in job.waiting:
            job.waiting.remove(pid)
        elif r.state is RoundState.JOINING:
            job.round = replace(r, members=tuple(s for s in r.members if s.participant_id != pid))
        else:
            ended_round = r.number
            self._end_round(index, now_ms, job, reason, pid, detail)
        participant = job.participants.pop(pid)
        del job.names[participant.name]
        if ended_round:
            survivors = tuple(s for s in r.members if s.participant_id != pid)
            self._open_next(index, now_ms, job, survivors)
        else:
            self._after_change(index, now_ms, job)
        return RemoveResult(job.job_id, pid, True, ended_round)

    # ----------------------------------------------------------------- fencing

    def member_store(self, job_id: str, round_number: int, pid: int) -> RoundStore | Failure:
        """The store of (job, round) if ``pid`` may use it now (see :mod:`.roundstore`)."""
        job = self.jobs.get(job_id)
        if job is None:
            return JobNotFound(job_id)
        failure = _stale(job, round_number)
        if failure is not None:
            return failure
        if job.round.rank_of(pid) is None:
            detail = f"participant {pid} is not a member of round {round_number}"
            return StaleRound(job_id, round_number, job.round.number, detail)
        assert job.store is not None
        return job.store

    def fenced_job(self, job_id: str, round_number: int, token: int) -> Job | Failure:
        """The job if (round, token) are its current ACTIVE round's (checkpoint commands)."""
        job = self.jobs.get(job_id)
        if job is None:
            return JobNotFound(job_id)
        failure = _stale(job, round_number)
        if failure is not None:
            return failure
        if token != job.round.fencing_token:
            return StaleToken(job_id, round_number, token, job.round.fencing_token)
        return job

    # ----------------------------------------------------------------- queries

    def closes_due(self, now_ms: int) -> list[tuple[str, int]]:
        """(job, round) of every JOINING round the leader should propose to close now."""
        return [
            (job_id, self.jobs[job_id].round.number)
            for job_id in sorted(self.jobs)
            if self.jobs[job_id].close_due(now_ms)
        ]

    def participant_keys(self) -> list[tuple[str, int]]:
        """(job, participant id) of every participant, for the leader's failure detector."""
        return [
            (job_id, pid)
            for job_id in sorted(self.jobs)
            for pid in sorted(self.jobs[job_id].participants)
        ]

    def job_changed_since(self, job_id: str, revision: int) -> bool | None:
        """Whether the job changed after ``revision``; None if it does not exist."""
        job = self.jobs.get(job_id)
        return None if job is None else job.revision > revision

    def reason(self, job_id: str, now_ms: int) -> str | None:
        job = self.jobs.get(job_id)
        return None if job is None else round_reason(job, now_ms)

    # ----------------------------------------------------------------- snapshots

    def to_obj(self) -> list[Any]:
        jobs = []
        for job_id in sorted(self.jobs):
            job = self.jobs[job_id]
            jobs.append(
                [
                    job.job_id,
                    codec.to_obj(job.config),
                    codec.to_obj(job.round),
                    job.revision,
                    job.closed,
                    [codec.to_obj(job.participants[pid]) for pid in sorted(job.participants)],
                    list(job.waiting),
                    [codec.to_obj(record) for record in job.history],
                    None if job.store is None else job.store.to_obj(),
                    job.checkpoints.to_obj(),
                    job.outcome.value,
                    job.ended_ms,
                    job.end_detail,
                    job.failure,
                ]
            )
        return [self.revision, jobs]

    def restore(self, obj: Any, *, lifecycle: bool = True) -> None:
        """Restore from :meth:`to_obj`'s form; ``lifecycle`` False reads a snapshot written
        before jobs had a lifecycle (10 fields per job: a closed job ended when its last
        round did)."""
        if not (isinstance(obj, list) and len(obj) == 2 and isinstance(obj[1], list)):
            raise codec.StateCodecError(f"malformed rendezvous state: {obj!r}"[:200])
        jobs: dict[str, Job] = {}
        fields = 14 if lifecycle else 10
        for item in obj[1]:
            if not (isinstance(item, list) and len(item) == fields):
                raise codec.StateCodecError(f"malformed job: {item!r}"[:200])
            job = Job(
                codec.from_obj(item[0], str),
                codec.from_obj(item[1], JobConfig),
                codec.from_obj(item[2], Round),
                codec.from_obj(item[3], int),
                codec.from_obj(item[4], bool),
            )
            for participant in codec.from_obj(item[5], tuple[Participant, ...]):
                job.participants[participant.participant_id] = participant
                job.names[participant.name] = participant.participant_id
            job.waiting = list(codec.from_obj(item[6], tuple[int, ...]))
            job.history = list(codec.from_obj(item[7], tuple[RoundRecord, ...]))
            job.store = None if item[8] is None else RoundStore.from_obj(item[8])
            job.checkpoints = CheckpointRegistry.from_obj(item[9])
            if lifecycle:
                job.outcome = codec.from_obj(item[10], JobState)
                job.ended_ms = codec.from_obj(item[11], int)
                job.end_detail = codec.from_obj(item[12], str)
                job.failure = codec.from_obj(item[13], str)
                if job.outcome is JobState.CLOSED or (job.ended and job.participants):
                    raise codec.StateCodecError(f"job {job.job_id!r}: inconsistent lifecycle")
            elif job.closed:
                job.ended_ms = job.history[-1].ended_ms if job.history else 0
            jobs[job.job_id] = job
        self.revision = codec.from_obj(obj[0], int)
        self.jobs = jobs


def _stale(job: Job, round_number: int) -> StaleRound | None:
    r = job.round
    if r.number == round_number and r.state is RoundState.ACTIVE:
        return None
    if job.closed:
        detail = "the job is closed"
    elif r.number == round_number:
        detail = f"round {round_number} is still joining"
    elif round_number < r.number:
        detail = f"round {round_number} has ended"
    else:
        detail = f"round {round_number} does not exist yet"
    return StaleRound(job.job_id, round_number, r.number, detail)


def round_reason(job: JobView, now_ms: int) -> str:
    """Why the job's round is not closing (JOINING), or since when it is active: a pure
    function of the state and the caller's clock (the servicer passes the leader's)."""
    r, config = job.round, job.config
    if job.closed:
        closed_ms = job.ended_ms or (job.history[-1].ended_ms if job.history else job.revision)
        return f"job closed at leader time {closed_ms} ms"
    if job.ended:
        state = job.outcome.name.lower()
        return f"job {state} at leader time {job.ended_ms} ms: {job.end_detail}"
    waiting = f"; {len(job.waiting)} waiting for the next round" if job.waiting else ""
    if r.state is RoundState.ACTIVE:
        return (
            f"active since leader time {r.closed_ms} ms with {len(r.members)} members "
            f"(fencing token {r.fencing_token}){waiting}"
        )
    present = len(r.members)
    joining_s = max(0, now_ms - r.opened_ms) / 1000
    timeout_s = config.join_timeout_ms / 1000
    head = f"{present} of min {config.min_nodes} joined"
    tail = (
        f"waiting for max {config.max_nodes} or the last call; "
        f"joining for {joining_s:.1f} s of the {timeout_s:g} s join timeout"
    )
    if r.min_reached_ms is None:
        return f"{head}; last call not started; {tail}"
    ends_ms = r.min_reached_ms + config.last_call_ms
    if now_ms >= ends_ms:
        return f"{head}; last call ended at leader time {ends_ms} ms; the round closes next"
    remaining_s = (ends_ms - now_ms) / 1000
    return f"{head}; last call ends in {remaining_s:.1f} s (at leader time {ends_ms} ms); {tail}"
