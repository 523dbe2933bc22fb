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
goes to the bounded history; its store is dropped and its pending checkpoints with it (the
store stays readable, frozen, by the round's members until the next round ends: see
``roundstore.py``, "Ended, read-only"; a cache beside the state, never in it). The
next round opens at once, JOINING, with the surviving members carried over (they are alive
by the detector's account; they need not join again) plus waiting participants in join
order, up to max_nodes; it may close in the same apply. A member removed from a JOINING
round simply leaves it (no round change); a waiter removed leaves the wait list.

Ranks (``jobs.assign_ranks``): at the close, a survivor keeps its previous rank if it is
below the new world size; freed ranks are filled by displaced survivors, then newcomers in
join order.

Participant ids. A participant's id is unique in the cluster and strictly increasing in join
order, and at least the raft index of the command that joined it: a ``Join`` at index I takes
max(I, ``next_participant_id``); a ``JoinBatch`` at I takes consecutive ids from that same
value, one per new participant, in request order. ``next_participant_id`` is the replicated
high-water mark that keeps a later join from reusing an id a batch handed out above its own
index; it is 0 whenever no id was handed out beyond the log (every id <= the applied index),
so a cluster that never ran a batch ahead of its log writes the snapshots it always wrote.
Id order is join order, which is why a round's members (in id order) and the wait list (in
join order) need no sorting when joiners are appended.

Replacing. A ``Join`` that names a participant of its own session in ``replaces`` (a torchrun
agent restarting its workers under a new name) takes that participant's place in the same
apply: a waiter's place in the wait list, a member's seat in a JOINING round (no round
change), or, in an ACTIVE round, the round ends once (``MEMBER_LEFT`` by the old participant,
detail "rejoined as participant N") and the next opens with the survivors and the new
participant ahead of any waiter. Joining first and leaving after would cost two round changes
whenever the job scales up (the new name ends the round as a waiter, then the old name's
leave ends the round that held both). A ``replaces`` that is no longer in the job (failed,
evicted) makes a plain join; one of another session is refused.

Batches. A ``JoinBatch`` is checked whole before anything changes: one entry that a Join
would refuse (a name taken by another session, a name or metadata out of bounds, a full wait
list, a config conflict, a closed job) refuses the batch. A name the same session already
joined answers with its existing participant, as a repeated Join does. The new participants
enter at once, as if they had arrived at the same instant (they did: one entry, one time): a
JOINING round takes them up to max_nodes (and closes when full; the rest wait), an ACTIVE
round's wait list takes them all; then the close and scale-up rules run once. The wait
list's bound applies to who still waits once the batch is in (a scale-up seats joiners up to
max_nodes, as one-by-one joins would have). So a batch of M joiners into a round of N
members costs O(M + N), not M rebuilds of the member tuple.

Assignments. ``assignment(job, pid)`` answers one participant's round, state, rank, world
size and token in O(1), from a {participant: rank} index each job builds once per round
(keyed on the identity of the round's member tuple, which only a membership change
replaces). The index is a cache: not replicated, not in snapshots, rebuilt after a restore.

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

Runs. A job id used again after the job ended is a new run. The first Join (or JoinBatch)
that starts it again says whether the new run sees the old run's state: without ``resume``
the job's checkpoint registry is emptied (committed checkpoints and the memory snapshot; no
checkpoint is pending in an ended job), so the new run starts fresh however many times the
id was used; with ``resume`` it keeps them and the new run restores the old run's latest.
Round numbers go on increasing across runs, so a new run's checkpoints never take an old
one's name. A job that never ended (its workers were killed) is the same run when they come
back: its checkpoints are its own. A Configure that starts an ended job again keeps them
(an operator's command, as before runs existed).

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

import copy
import dataclasses
from collections.abc import Mapping, Sequence
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
    JoinBatch,
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
    ParticipantAssignment,
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
    JoinBatchResult,
    JoinResult,
    PruneJobsResult,
    RemoveResult,
    Result,
    RoundTrainedResult,
)
from .roundstore import EndedRoundStore, RoundStore
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
    # Cache, not state: {participant id: rank} of the members of `_ranked` (the round's
    # member tuple it was built from). Invariant: equal to that tuple's seats whenever
    # `_ranked is round.members`; rebuilt on the first query after the tuple is replaced.
    _ranked: tuple[Seat, ...] | None = field(default=None, compare=False, repr=False)
    _ranks: dict[int, int] = field(default_factory=dict, compare=False, repr=False)
    # Cache, not state (roundstore.py, "Ended, read-only"): the store of the last round that
    # ended ACTIVE, with that round's number and members, kept read-only until the next
    # round ends or the job ends. Never written (nothing but `store` is), so copies share it.
    _ended_store: tuple[int, frozenset[int], RoundStore] | None = field(
        default=None, compare=False, repr=False
    )

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

    def ranks(self) -> Mapping[int, int]:
        """{participant id: rank} of the current round's members (-1 while JOINING): built
        once per member tuple, so each lookup after the first is O(1)."""
        members = self.round.members
        if self._ranked is not members:
            self._ranks = {seat.participant_id: seat.rank for seat in members}
            self._ranked = members
        return self._ranks

    def rank_of(self, participant_id: int) -> int | None:
        """The participant's rank in the current round (-1 while JOINING); None if it is not
        a member of it. O(1) (see :meth:`ranks`)."""
        return self.ranks().get(participant_id)

    def copy(self) -> Job:
        """A copy that later changes to this job do not reach: the containers are copied,
        the frozen records in them shared (they never change), the store and checkpoint
        registry copied deeply (they are mutable and small)."""
        if {f.name for f in dataclasses.fields(self)} != _JOB_FIELDS:
            # A new field must be copied here too, or a snapshot could see later applies.
            raise AssertionError("Job.copy does not know every field of Job")
        clone = copy.copy(self)
        clone.participants = dict(self.participants)
        clone.names = dict(self.names)
        clone.waiting = list(self.waiting)
        clone.history = list(self.history)
        clone.store = copy.deepcopy(self.store)
        clone.checkpoints = copy.deepcopy(self.checkpoints)
        clone._ranks = dict(self._ranks)
        return clone

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


# Job's fields, as Job.copy copies them: the immutable ones (and frozen records) by
# reference, the containers by a copy.
_JOB_FIELDS = frozenset(
    {
        "job_id", "config", "round", "revision", "closed", "participants", "names", "waiting",
        "history", "store", "checkpoints", "outcome", "ended_ms", "end_detail", "failure",
        "_ranked", "_ranks", "_ended_store",
    }
)  # fmt: skip


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
        # The least participant id a join may take, when a JoinBatch handed out ids beyond
        # the log; 0 otherwise ("Participant ids" above). Invariant: every participant id
        # ever handed out is below max(next_participant_id, applied index + 1).
        self.next_participant_id = 0

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
        if isinstance(command, JoinBatch):
            return self._join_batch(index, session_id, now_ms, command)
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
            pids = [
                pid for pid in sorted(job.participants) if job.participants[pid].session_id in ended
            ]
            if pids:
                self._remove_failed(index, now_ms, job, pids)

    def _remove_failed(self, index: int, now_ms: int, job: Job, pids: list[int]) -> None:
        """Remove ``pids`` (in id order) as failed, each as ``_remove`` would one after the
        other, in O(N + removed) rather than O(N) per removal where the outcome allows.

        One at a time, a member of an ACTIVE round ends it (its successor opens with the
        survivors) and a member of a JOINING round leaves it, the round closing only if its
        last call has run out. A session that joined a batch of 100,000 and ended would
        rebuild the round's member tuple once per participant: O(N^2), minutes of apply on
        every member. So once the round is JOINING (waiting is empty then: every remaining
        participant is a member) and the next removal would not close it, none of the rest
        would either (the count only falls; while it stays at least min_nodes,
        ``min_reached_ms`` does not move, and below min_nodes nothing closes), and they all
        leave it in one step, with the same state as one by one."""
        for position, pid in enumerate(pids):
            r = job.round
            if r.state is RoundState.JOINING and not self._closes_on_removal(job, now_ms):
                self._leave_joining(index, job, pids[position:])
                break
            session_id = job.participants[pid].session_id
            cause = f"session {session_id} ended"
            self._remove(index, now_ms, job, pid, EndReason.MEMBER_FAILED, cause)
            self._end_if_failed(index, now_ms, job)
        self._end_if_failed(index, now_ms, job)

    def _closes_on_removal(self, job: Job, now_ms: int) -> bool:
        """Whether removing one member of the JOINING round would close it (``_after_change``
        after ``_remove``): still at least min_nodes, with the last call over."""
        r, config = job.round, job.config
        return (
            len(r.members) - 1 >= config.min_nodes
            and r.min_reached_ms is not None
            and now_ms - r.min_reached_ms >= config.last_call_ms
        )

    def _leave_joining(self, index: int, job: Job, pids: list[int]) -> None:
        """Remove members of the JOINING round at once (see ``_remove_failed``)."""
        gone = set(pids)
        r = job.round
        members = tuple(seat for seat in r.members if seat.participant_id not in gone)
        if len(members) != len(r.members) - len(gone):
            raise AssertionError(f"job {job.job_id!r}: removing non-members of a JOINING round")
        min_reached_ms = r.min_reached_ms if len(members) >= job.config.min_nodes else None
        job.round = replace(r, members=members, min_reached_ms=min_reached_ms)
        for pid in pids:
            del job.names[job.participants.pop(pid).name]
        self._touch(index, job)

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

    def _join_refusal(self, job_id: str, config: JobConfig | None) -> Failure | None:
        """Why a join (or batch) to ``job_id`` with ``config`` is refused before its names are
        looked at, or None; changes nothing (see :meth:`_join_job`)."""
        job = self.jobs.get(job_id)
        if job is None:
            if config is None:
                return JobNotFound(job_id)
            problem = config.problem(self.limits)
            if problem:
                return InvalidCommand(f"job {job_id!r}: {problem}")
            full = len(self.jobs) >= self.limits.max_jobs
            if full and not any(j.ended for j in self.jobs.values()):
                return LimitExceeded("jobs", self.limits.max_jobs)
            return None
        if job.closed:
            return JobClosed(job.job_id)
        if job.ended:
            if config is not None and config != job.config:
                problem = config.problem(self.limits)
                if problem:
                    return InvalidCommand(f"job {job_id!r}: {problem}")
            return None
        if config is not None and config != job.config:
            return ConfigConflict(job.job_id, config.differences(job.config))
        return None

    def _join_job(
        self, index: int, now_ms: int, job_id: str, config: JobConfig | None, resume: bool
    ) -> Job:
        """The job a join goes to, once :meth:`_join_refusal` said None: created with
        ``config`` if absent, or, finished or failed, started again (a new run takes the new
        run's config, and the old run's checkpoints only if ``resume``)."""
        job = self.jobs.get(job_id)
        if job is None:
            assert config is not None
            created = self._new_job(index, now_ms, job_id, config)
            if isinstance(created, Failure):
                raise AssertionError(f"job {job_id!r} not created after the check: {created}")
            return created
        if job.ended:
            if config is not None:
                job.config = config
            job.reopen()
            if not resume:
                job.checkpoints.forget()
        return job

    def _take_ids(self, index: int, count: int) -> int:
        """Hand out ``count`` consecutive participant ids for a join at ``index``: the first."""
        first = max(index, self.next_participant_id)
        last = first + count - 1
        self.next_participant_id = last + 1 if last > index else 0
        return first

    def _join(self, index: int, session_id: int, now_ms: int, command: Join) -> Result:
        if not 1 <= len(command.name) <= self.limits.max_name_chars:
            return InvalidCommand(f"name must be 1..{self.limits.max_name_chars} characters")
        if len(command.metadata) > self.limits.max_metadata_bytes:
            return LimitExceeded("participant metadata bytes", self.limits.max_metadata_bytes)
        refusal = self._join_refusal(command.job, command.config)
        if refusal is not None:
            return refusal
        if command.replaces < 0:
            return InvalidCommand(f"replaces must be a participant id or 0, not {command.replaces}")
        job = self._join_job(index, now_ms, command.job, command.config, command.resume)
        existing = job.names.get(command.name)
        if existing is not None:
            if job.participants[existing].session_id != session_id:
                return NameTaken(job.job_id, command.name, existing)
            return JoinResult(job.job_id, existing, job.round.number, existing in job.waiting)
        replaced = job.participants.get(command.replaces)
        if replaced is not None and replaced.session_id != session_id:
            return InvalidCommand(
                f"participant {command.replaces} of job {job.job_id!r} belongs to another "
                "session: a join replaces only a participant of its own session"
            )
        if replaced is not None:
            return self._replace(index, now_ms, job, replaced, command, session_id)
        if job.round.state is RoundState.ACTIVE and len(job.waiting) >= self.limits.max_waiting:
            return LimitExceeded("waiting participants per job", self.limits.max_waiting)
        pid = self._take_ids(index, 1)
        job.participants[pid] = Participant(pid, command.name, command.metadata, session_id)
        job.names[command.name] = pid
        if job.round.state is RoundState.JOINING:
            members = (*job.round.members, Seat(pid, -1))
            job.round = replace(job.round, members=members)
        else:
            job.waiting.append(pid)
        self._after_change(index, now_ms, job)
        # The round may have closed or ended (scale-up) and its successor taken the joiner.
        return JoinResult(job.job_id, pid, job.round.number, pid in job.waiting)

    def _replace(
        self, index: int, now_ms: int, job: Job, old: Participant, command: Join, session_id: int
    ) -> Result:
        """Join ``command``'s participant in ``old``'s place, in one apply (see "Replacing")."""
        pid = self._take_ids(index, 1)
        r = job.round
        old_id = old.participant_id
        if old_id not in job.waiting and r.state is RoundState.ACTIVE:
            # Recorded while the old participant is still there to be named.
            detail = f"rejoined as participant {pid}"
            self._end_round(index, now_ms, job, EndReason.MEMBER_LEFT, old_id, detail)
        del job.names[job.participants.pop(old_id).name]
        job.participants[pid] = Participant(pid, command.name, command.metadata, session_id)
        job.names[command.name] = pid
        if old_id in job.waiting:
            job.waiting[job.waiting.index(old_id)] = pid
            self._after_change(index, now_ms, job)
        elif r.state is RoundState.JOINING:
            seats = tuple(s for s in r.members if s.participant_id != old_id)
            # Ids grow in join order, so appending keeps the seats in id order.
            job.round = replace(r, members=(*seats, Seat(pid, -1)))
            self._after_change(index, now_ms, job)
        else:
            # The new participant takes the old one's place ahead of any waiter: the round
            # that opens is the one the old participant's departure alone would have opened,
            # with the same process back in it.
            job.waiting.insert(0, pid)
            survivors = tuple(s for s in r.members if s.participant_id != old_id)
            self._open_next(index, now_ms, job, survivors)
        return JoinResult(job.job_id, pid, job.round.number, pid in job.waiting)

    def _batch_problem(self, command: JoinBatch) -> Failure | None:
        """What is wrong with the batch's entries themselves, naming the first bad one."""
        limits = self.limits
        names, metadata = command.names, command.metadata
        if not 1 <= len(names) <= limits.max_batch_joins:
            return InvalidCommand(
                f"a batch joins 1..{limits.max_batch_joins} participants, got {len(names)}"
            )
        if metadata and len(metadata) != len(names):
            return InvalidCommand(
                f"metadata must be empty or one per name: {len(metadata)} for {len(names)} names"
            )
        first: dict[str, int] = {}
        for entry, name in enumerate(names):
            if not 1 <= len(name) <= limits.max_name_chars:
                return InvalidCommand(
                    f"entry {entry}: name must be 1..{limits.max_name_chars} characters"
                )
            if first.setdefault(name, entry) != entry:
                return InvalidCommand(f"entry {entry}: name {name!r} repeats entry {first[name]}")
        for entry, data in enumerate(metadata):
            if len(data) > limits.max_metadata_bytes:
                what = f"participant metadata bytes (entry {entry})"
                return LimitExceeded(what, limits.max_metadata_bytes)
        if batch_bytes(names, metadata) > limits.max_batch_bytes:
            return LimitExceeded("bytes of names and metadata in one batch", limits.max_batch_bytes)
        return None

    def _join_batch(self, index: int, session_id: int, now_ms: int, command: JoinBatch) -> Result:
        """Join every entry, or none (see "Batches" above)."""
        refusal = self._batch_problem(command) or self._join_refusal(command.job, command.config)
        if refusal is not None:
            return refusal
        job = self.jobs.get(command.job)
        fresh = job is None or job.ended  # no participants; its round JOINING and empty
        new: list[int] = []  # entries that add a participant, in request order
        for entry, name in enumerate(command.names):
            existing = None if fresh or job is None else job.names.get(name)
            if existing is None:
                new.append(entry)
            elif job is not None and job.participants[existing].session_id != session_id:
                return NameTaken(job.job_id, name, existing)
        if fresh or job is None:
            config = command.config or (job.config if job is not None else None)
            assert config is not None  # _join_refusal: a new job needs a config
            present, joining, waiting = 0, True, 0
        else:
            config, present = job.config, len(job.round.members)
            joining, waiting = job.round.state is RoundState.JOINING, len(job.waiting)
        # Who waits once the batch is in: a JOINING round (or a scale-up's next round) seats
        # joiners up to max_nodes; an ACTIVE round that does not scale up seats none.
        places = config.max_nodes - present if joining or config.scale_up else 0
        left_waiting = max(0, waiting + len(new) - places)
        if left_waiting > self.limits.max_waiting:
            return LimitExceeded("waiting participants per job", self.limits.max_waiting)
        # Checked: from here on nothing refuses.
        job = self._join_job(index, now_ms, command.job, command.config, command.resume)
        if new:
            first = self._take_ids(index, len(new))
            pids = range(first, first + len(new))
            metadata = command.metadata
            for pid, entry in zip(pids, new, strict=True):
                name = command.names[entry]
                data = metadata[entry] if metadata else b""
                job.participants[pid] = Participant(pid, name, data, session_id)
                job.names[name] = pid
            r = job.round
            if r.state is RoundState.JOINING:
                room = job.config.max_nodes - len(r.members)
                seats = tuple(Seat(pid, -1) for pid in pids[:room])
                job.round = replace(r, members=r.members + seats)
                if len(new) > room:
                    self._after_change(index, now_ms, job)  # full: the round closes
                    assert job.round.state is RoundState.ACTIVE, job.round
                    job.waiting.extend(pids[room:])
            else:
                job.waiting.extend(pids)
            self._after_change(index, now_ms, job)
        in_waiting = set(job.waiting)
        ids = tuple(job.names[name] for name in command.names)
        return JoinBatchResult(
            job.job_id,
            ids,
            tuple(pid in in_waiting for pid in ids),
            job.round.number,
            job.round.state,
        )

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
        job._ended_store = None  # nobody is left to read it
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
        job._ended_store = None  # nobody is left to read it
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
        job._ended_store = (
            None
            if job.store is None
            else (r.number, frozenset(seat.participant_id for seat in r.members), job.store)
        )
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
        if job.rank_of(pid) is None:
            detail = f"participant {pid} is not a member of round {round_number}"
            return StaleRound(job_id, round_number, job.round.number, detail)
        assert job.store is not None
        return job.store

    def readable_store(
        self, job_id: str, round_number: int, pid: int
    ) -> RoundStore | EndedRoundStore | Failure:
        """The store ``pid`` may read for (job, round): the round's store if ``member_store``
        allows it; else, if that round is the one that ended last and ``pid`` was one of its
        members and is still a participant, its store read-only (roundstore.py, "Ended,
        read-only"); else the fencing failure."""
        store = self.member_store(job_id, round_number, pid)
        if not isinstance(store, StaleRound):
            return store
        job = self.jobs[job_id]
        ended = job._ended_store
        if ended is None or ended[0] != round_number:
            return store
        number, members, frozen = ended
        if pid not in members or pid not in job.participants:
            return store
        detail = (
            f"round {number} has ended; its store is read-only and lacks the key "
            "(nothing can be written to it any more)"
        )
        return EndedRoundStore(frozen, replace(store, detail=detail))

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

    def assignment(self, job_id: str, pid: int) -> ParticipantAssignment | None:
        """Participant ``pid``'s place in its job's current round, in O(1); None when the job
        is gone or ``pid`` is not a participant of it."""
        job = self.jobs.get(job_id)
        if job is None or pid not in job.participants:
            return None
        r = job.round
        if r.state is RoundState.JOINING:
            # A JOINING round takes joiners directly: every participant is a member.
            return ParticipantAssignment(r.number, r.state, -1, 0, r.fencing_token, False)
        rank = job.rank_of(pid)
        world_size = len(r.members)
        if rank is None:
            return ParticipantAssignment(r.number, r.state, -1, world_size, r.fencing_token, True)
        return ParticipantAssignment(r.number, r.state, rank, world_size, r.fencing_token, False)

    def participant_id_known(self, pid: int, applied_index: int) -> bool:
        """Whether ``pid`` was handed out by an entry at or below ``applied_index`` (or will
        never be: an id below the applied index that no join took). A member that has not
        yet applied a participant's join answers False until it has."""
        return pid <= applied_index or pid < self.next_participant_id

    def job_changed_since(self, job_id: str, revision: int) -> bool | None:
        """Whether the job changed after ``revision``; None if it does not exist."""
        job = self.jobs.get(job_id)
        return None if job is None else job.revision > revision

    def reason(self, job_id: str, now_ms: int) -> str | None:
        job = self.jobs.get(job_id)
        return None if job is None else round_reason(job, now_ms)

    # ----------------------------------------------------------------- snapshots

    def snapshot_format(self) -> int:
        """The oldest machine snapshot format that can hold this state (``machine.py``):
        6 while a job holds a memory snapshot, else 5 while ``next_participant_id`` is set,
        else 4. So a cluster that uses neither writes the bytes it always wrote, and an
        older member refuses only a snapshot it cannot read."""
        if any(job.checkpoints.memory is not None for job in self.jobs.values()):
            return 6
        return 5 if self.next_participant_id else 4

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
        # next_participant_id only in formats 5 and later (see snapshot_format): without
        # batches or memory snapshots the bytes are those of format 4.
        return [
            self.revision,
            jobs,
            *([self.next_participant_id] if self.snapshot_format() >= 5 else []),
        ]

    def copy(self) -> Rendezvous:
        """A copy that later applies do not change (``StateMachine.frozen_copy``): O(N) with
        a C-speed step per participant, not a deep copy of every record."""
        clone = Rendezvous(self.limits)
        clone.jobs = {job_id: job.copy() for job_id, job in self.jobs.items()}
        clone.revision, clone.next_participant_id = self.revision, self.next_participant_id
        return clone

    def restore(
        self,
        obj: Any,
        *,
        lifecycle: bool = True,
        high_water: bool = False,
        memory_snapshots: bool = False,
    ) -> None:
        """Restore from :meth:`to_obj`'s form; ``lifecycle`` False reads a snapshot written
        before jobs had a lifecycle (10 fields per job: a closed job ended when its last
        round did); ``high_water`` True one that carries ``next_participant_id``;
        ``memory_snapshots`` True one whose checkpoint registries may carry a memory
        snapshot (format 6)."""
        length = 3 if high_water else 2
        if not (isinstance(obj, list) and len(obj) == length and isinstance(obj[1], list)):
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
            job.checkpoints = CheckpointRegistry.from_obj(item[9], memory=memory_snapshots)
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
        self.next_participant_id = codec.from_obj(obj[2], int) if high_water else 0
        self.jobs = jobs


def batch_bytes(names: Sequence[str], metadata: Sequence[bytes]) -> int:
    """What a JoinBatch's entries weigh against ``max_batch_bytes``: the UTF-8 bytes of its
    names and the bytes of its metadata."""
    return sum(len(name.encode()) for name in names) + sum(len(data) for data in metadata)


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
