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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..version import BASELINE_RECORD_VERSION
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
from .shapes import Placement, admits_waiters, place
from .versions import HOLD_DOMAINS_VERSION, HOLD_OVER_VERSION


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
    # Cache, not state: {domain: participants of the job in it}, "" left out (a shaped
    # job's rules, shapes.py). Invariant: equal to the count over `participants`; kept by
    # `add` and `drop`, rebuilt by `recount` after a restore.
    _domain_counts: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    # Cache, not state: the placement of the JOINING round (shapes.place) and what it was
    # computed from: (members tuple, previous tuple, drained domains, config, placement).
    # Valid while the tuples are the round's (by identity) and the rest compare equal.
    _placement: (
        tuple[tuple[Seat, ...], tuple[Seat, ...], tuple[str, ...], JobConfig, Placement] | None
    ) = field(default=None, compare=False, repr=False)

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

    def add(self, participant: Participant) -> None:
        """Enter ``participant`` (its id unused) in ``participants``, ``names`` and the
        domain counts."""
        self.participants[participant.participant_id] = participant
        self.names[participant.name] = participant.participant_id
        if participant.domain:
            counts = self._domain_counts
            counts[participant.domain] = counts.get(participant.domain, 0) + 1

    def drop(self, participant_id: int) -> Participant:
        """Remove a participant from ``participants``, ``names`` and the domain counts."""
        participant = self.participants.pop(participant_id)
        del self.names[participant.name]
        domain = participant.domain
        if domain:
            left = self._domain_counts[domain] - 1
            if left:
                self._domain_counts[domain] = left
            else:
                del self._domain_counts[domain]
        return participant

    def recount(self) -> None:
        """Rebuild the domain counts from ``participants`` (after a restore)."""
        self._domain_counts = {}
        for pid in sorted(self.participants):
            domain = self.participants[pid].domain
            if domain:
                self._domain_counts[domain] = self._domain_counts.get(domain, 0) + 1

    def in_domain(self, domain: str) -> int:
        """How many participants of the job declared ``domain`` (not "")."""
        return self._domain_counts.get(domain, 0)

    @property
    def domain_counts(self) -> Mapping[str, int]:
        return self._domain_counts

    @property
    def shaped(self) -> bool:
        """Whether the job's rounds follow the shaped rules (:mod:`.shapes`): units above 1,
        a participant with a domain, or a JOINING round that holds more than max_nodes
        (left by such rules when the last domain went)."""
        return (
            self.config.unit_size > 1
            or bool(self._domain_counts)
            or len(self.round.members) > self.config.max_nodes
        )

    def placement(self, drained: Mapping[str, object]) -> Placement:
        """Where the JOINING round's close would seat its members (:func:`.shapes.place`),
        computed once per members tuple, previous tuple, drained set and config."""
        r, config = self.round, self.config
        names = tuple(sorted(drained))
        cached = self._placement
        if (
            cached is not None
            and cached[0] is r.members
            and cached[1] is r.previous
            and cached[2] == names
            and cached[3] == config
        ):
            return cached[4]
        placement = place(config, self.participants, r.member_ids, r.previous, drained)
        self._placement = (r.members, r.previous, names, config, placement)
        return placement

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
        clone._domain_counts = dict(self._domain_counts)
        return clone

    def close_due(self, now_ms: int, drained: Mapping[str, object]) -> bool:
        """The current round is JOINING and may close at leader time ``now_ms``, with
        ``drained`` the drained domains: not before its hold; a flat job's when max_nodes
        are present or the last call is over; a shaped job's when its placement is full or,
        the last call over, at least min_nodes (:mod:`.shapes`, "Closing")."""
        r, config = self.round, self.config
        if r.state is not RoundState.JOINING or now_ms < r.hold_until_ms:
            return False
        present = len(r.members)
        call_over = (
            r.min_reached_ms is not None and now_ms - r.min_reached_ms >= config.last_call_ms
        )
        if not self.shaped:
            return present >= config.max_nodes or call_over
        # A placement seats at most the members present: below min_nodes, or not full and
        # the last call not over, it cannot close, and the O(N) placement is not computed.
        if present < config.min_nodes or not (call_over or present >= config.max_nodes):
            return False
        seated = self.placement(drained).units * config.unit_size
        return seated == config.max_nodes or (call_over and seated >= config.min_nodes)


# Job's fields, as Job.copy copies them: the immutable ones (and frozen records) by
# reference, the containers by a copy.
_JOB_FIELDS = frozenset(
    {
        "job_id", "config", "round", "revision", "closed", "participants", "names", "waiting",
        "history", "store", "checkpoints", "outcome", "ended_ms", "end_detail", "failure",
        "_ranked", "_ranks", "_ended_store", "_domain_counts", "_placement",
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
        # The cluster version (version.py), as the state machine applied it: the rules a
        # record version brought apply from it on, on every member alike. Invariant: the
        # machine's ``cluster_version``.
        self.cluster_version = BASELINE_RECORD_VERSION

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
        leave it in one step, with the same state as one by one.

        A shaped job's participants of the ended session leave together: they fail together
        (one process, one host), so they end at most one round (``_remove_together``)."""
        if job.shaped:
            self._remove_together(index, now_ms, job, pids)
            self._end_if_failed(index, now_ms, job)
            return
        for position, pid in enumerate(pids):
            r = job.round
            if r.state is RoundState.JOINING and not self._closes_on_removal(job, now_ms):
                self._leave_joining(index, now_ms, job, pids[position:])
                break
            session_id = job.participants[pid].session_id
            cause = f"session {session_id} ended"
            self._remove(index, now_ms, job, pid, EndReason.MEMBER_FAILED, cause)
            self._end_if_failed(index, now_ms, job)
        self._end_if_failed(index, now_ms, job)

    def _remove_together(self, index: int, now_ms: int, job: Job, pids: list[int]) -> None:
        """Remove ``pids`` (id order, one session's) from a shaped job as failed, at once: an
        ACTIVE round with one of them as a member ends once (ended by the first, in id
        order), and the next opens without any of them; a JOINING round loses them with no
        round change. Domains of theirs with participants left are held for (``_hold``).
        O(N + removed)."""
        r = job.round
        gone = set(pids)
        first = next((s.participant_id for s in r.members if s.participant_id in gone), 0)
        ended = r.state is RoundState.ACTIVE and first != 0
        if ended:
            cause = f"session {job.participants[first].session_id} ended"
            self._end_round(index, now_ms, job, EndReason.MEMBER_FAILED, first, cause)
        if job.waiting:
            job.waiting = [pid for pid in job.waiting if pid not in gone]
        domains = sorted({job.drop(pid).domain for pid in pids})
        members = tuple(seat for seat in r.members if seat.participant_id not in gone)
        if ended:
            self._open_next(index, now_ms, job, members, domains)
            return
        if r.state is RoundState.JOINING:
            job.round = replace(r, members=members)
            for domain in domains:
                self._hold(now_ms, job, domain)
        self._after_change(index, now_ms, job)

    def _closes_on_removal(self, job: Job, now_ms: int) -> bool:
        """Whether removing one member of the JOINING round would close it (``_after_change``
        after ``_remove``): still at least min_nodes, with the last call over; not while the
        round is held. A shaped job's only if it may close now: a removal never adds a unit
        to its placement, nor turns its last call on."""
        r, config = job.round, job.config
        if now_ms < r.hold_until_ms:
            return False
        if job.shaped:
            return job.close_due(now_ms, self.drained)
        return (
            len(r.members) - 1 >= config.min_nodes
            and r.min_reached_ms is not None
            and now_ms - r.min_reached_ms >= config.last_call_ms
        )

    def _leave_joining(self, index: int, now_ms: int, job: Job, pids: list[int]) -> None:
        """Remove members of the JOINING round at once (see ``_remove_failed``)."""
        gone = set(pids)
        r = job.round
        members = tuple(seat for seat in r.members if seat.participant_id not in gone)
        if len(members) != len(r.members) - len(gone):
            raise AssertionError(f"job {job.job_id!r}: removing non-members of a JOINING round")
        min_reached_ms = r.min_reached_ms if len(members) >= job.config.min_nodes else None
        job.round = replace(r, members=members, min_reached_ms=min_reached_ms)
        domains = [job.drop(pid).domain for pid in pids]
        for domain in sorted(set(domains)):
            self._hold(now_ms, job, domain)
        self._touch(index, job)

    def _close_job(self, index: int, now_ms: int, job: Job) -> Result:
        if job.closed:
            return CloseJobResult(job.job_id, 0)
        ended = job.round.number
        self._end_round(index, now_ms, job, EndReason.JOB_CLOSED, 0, "")
        job.round = replace(job.round, state=RoundState.ENDED)
        job.participants.clear()
        job.names.clear()
        job.recount()
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
            if job.close_due(now_ms, self.drained):
                self._close(index, now_ms, job)
        elif self._scales_up(job):
            self._end_round(index, now_ms, job, EndReason.SCALE_UP, 0, "")
            self._open_next(index, now_ms, job, survivors=r.members)
        self._touch(index, job)

    def _scales_up(self, job: Job) -> bool:
        """Whether the ACTIVE round ends for a scale-up: a waiter and room for it; in a
        shaped job, room for a unit and eligible waiters that make one (``shapes.py``)."""
        config, members = job.config, len(job.round.members)
        if not (config.scale_up and job.waiting):
            return False
        if not job.shaped:
            return members < config.max_nodes
        return members + config.unit_size <= config.max_nodes and admits_waiters(
            config, job.participants, job.waiting, self.drained, job.domain_counts
        )

    def _hold(self, now_ms: int, job: Job, domain: str) -> None:
        """A participant of ``domain`` ("" for none, or not removed as failed) left the
        JOINING round, or the one its removal opened. While other participants of a failed
        member's domain remain, the round does not close for two heartbeat intervals, so
        that their fate (dead too, or alive) is known before it does (rendezvous.py,
        "Failure domains"). From cluster version 3 the round records the domains holding
        it, and the hold ends once none of their participants remains: nobody is left to
        wait for (a host lost whole closes its round at the last removal)."""
        r = job.round
        if r.state is not RoundState.JOINING:
            return
        if domain and job.in_domain(domain):
            until_ms = now_ms + 2 * job.config.heartbeat_interval_ms
            running = now_ms < r.hold_until_ms
            domains: tuple[str, ...] = ()
            # A hold set below version 3 names no domain: it runs its time, so the domains
            # of one it is extended by are not recorded either.
            if self.cluster_version >= HOLD_DOMAINS_VERSION and (r.hold_domains or not running):
                held = r.hold_domains if running else ()
                domains = tuple(sorted({*held, domain}))
            until_ms = max(until_ms, r.hold_until_ms)
            if until_ms != r.hold_until_ms or domains != r.hold_domains:
                job.round = replace(r, hold_until_ms=until_ms, hold_domains=domains)
            return
        if r.hold_domains:
            left = tuple(held for held in r.hold_domains if job.in_domain(held))
            if left != r.hold_domains:
                job.round = replace(
                    r, hold_until_ms=r.hold_until_ms if left else 0, hold_domains=left
                )

    def _end_hold(self, index: int, now_ms: int, job: Job) -> None:
        """The leader's word that every remaining participant of the domains holding the
        JOINING round was heard from since the failure that held it (``CloseRound.hold_over``):
        the hold ends, nothing is left to wait for. From cluster version 4; below it, or
        once the hold is over, nothing changes."""
        r = job.round
        if (
            self.cluster_version < HOLD_OVER_VERSION
            or r.state is not RoundState.JOINING
            or now_ms >= r.hold_until_ms
        ):
            return
        job.round = replace(r, hold_until_ms=0, hold_domains=())
        self._touch(index, job)

    def _close(self, index: int, now_ms: int, job: Job) -> None:
        r = job.round
        if job.shaped:
            placement = job.placement(self.drained)
            job.round = replace(
                r,
                state=RoundState.ACTIVE,
                members=placement.seats,
                closed_ms=now_ms,
                fencing_token=index,
                hold_until_ms=0,
                hold_domains=(),
            )
            job.waiting = list(placement.waiting)
            job.store = RoundStore()
            self._touch(index, job)
            return
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

    def _open_next(
        self,
        index: int,
        now_ms: int,
        job: Job,
        survivors: tuple[Seat, ...],
        failed_domains: Sequence[str] = (),
    ) -> None:
        """Open the next round, JOINING, with the survivors (their ranks kept as its
        ``previous``) and waiters up to max_nodes; a shaped job's with every participant
        (its close places them, ``shapes.py``), held if members of ``failed_domains`` were
        removed as failed and others of those domains remain."""
        if job.shaped:
            members = list(job.participants)
            job.waiting = []
        else:
            room = job.config.max_nodes - len(survivors)
            newcomers, job.waiting = job.waiting[:room], job.waiting[room:]
            members = [seat.participant_id for seat in survivors] + newcomers
        job.round = joining_round(job.round.number + 1, members, survivors, now_ms)
        for domain in failed_domains:
            self._hold(now_ms, job, domain)
        self._after_change(index, now_ms, job)

    def _remove(
        self,
        index: int,
        now_ms: int,
        job: Job,
        pid: int,
        reason: EndReason,
        detail: str,
    ) -> Result:
        """Remove participant ``pid``: a waiter leaves the wait list, a member of a JOINING
        round the round, a member of an ACTIVE round ends it. Removed as failed, a
        participant of a failure domain holds the JOINING round for the domain's others
        (``_hold``)."""
        ended_round = 0
        r = job.round
        if pid in job.waiting:
            job.waiting.remove(pid)
        elif r.state is RoundState.JOINING:
            job.round = replace(r, members=tuple(s for s in r.members if s.participant_id != pid))
        else:
            ended_round = r.number
            self._end_round(index, now_ms, job, reason, pid, detail)
        participant = job.drop(pid)
        # A failure domain fails as one (a host): its other participants are held for.
        failed_domain = participant.domain if reason is EndReason.MEMBER_FAILED else ""
        if ended_round:
            survivors = tuple(s for s in r.members if s.participant_id != pid)
            self._open_next(index, now_ms, job, survivors, (failed_domain,))
        else:
            if r.state is RoundState.JOINING:
                self._hold(now_ms, job, failed_domain)
            self._after_change(index, now_ms, job)
        return RemoveResult(job.job_id, pid, True, ended_round)
