"""One job's rendezvous state (:class:`Job`) and how its rounds change (:class:`RoundRules`):
close, end, open the next, remove a participant, end or drop a job. Part of the
deterministic state machine; the rules themselves are told in :mod:`.rendezvous`'s theory of
operation ("Closing", "Ending", "Job lifecycle", "Retention").

Layers. ``RoundRules`` holds the rendezvous's replicated state (the jobs, the revision, the
participant id high-water mark) and the round transitions; ``joins.JoinRules`` adds who
enters a job; ``rendezvous.Rendezvous`` routes commands to both and answers queries. The
underscored methods are the layers' own: called by the layers above, never from outside.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .checkpoints import CheckpointRegistry
from .jobs import (
    DrainedDomain,
    EndReason,
    JobConfig,
    JobState,
    MemberRecord,
    Participant,
    RendezvousLimits,
    Round,
    RoundRecord,
    RoundState,
    Seat,
    assign_ranks,
)
from .results import CloseJobResult, RemoveResult, Result
from .roundstore import RoundStore


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

    def ended_round_store(self, round_number: int, pid: int) -> RoundStore | None:
        """The store of round ``round_number`` if it is the round that ended last (ACTIVE),
        ``pid`` was one of its members and is still a participant, for reading only
        (roundstore.py, "Ended, read-only"); else None."""
        ended = self._ended_store
        if ended is None or ended[0] != round_number:
            return None
        _, members, frozen = ended
        if pid not in members or pid not in self.participants:
            return None
        return frozen

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


def joining_round(
    number: int, members: list[int], previous: tuple[Seat, ...], now_ms: int
) -> Round:
    """A JOINING round numbered ``number`` of ``members`` (ids), opened at ``now_ms``."""
    seats = tuple(Seat(pid, -1) for pid in sorted(members))
    return Round(number, RoundState.JOINING, seats, previous, now_ms, None, 0, 0)


class RoundRules:
    """The rendezvous's replicated state and the transitions of its jobs' rounds."""

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
        # Drained failure domains by name (rendezvous.py, "Drain"). Iterated only through
        # sorted(), like `jobs`.
        self.drained: dict[str, DrainedDomain] = {}

    # ----------------------------------------------------------------- removals

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
        job.round = joining_round(job.round.number + 1, members, survivors, now_ms)
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
