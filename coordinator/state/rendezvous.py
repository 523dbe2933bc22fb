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
keep, broadcast, replicas, memory, disk, fresh, as the workers reported it; "" when they did
not say), kept beside ``trained_ms``: set once, by the first ``RoundTrained`` applied.

Shaped jobs (the rules in detail: :mod:`.shapes`). A job whose ``unit_size`` is above 1 or
one of whose participants declared a failure domain (``Join.domain``, its host) is shaped;
the rules above hold for it with these differences, and a job with neither keeps exactly
the rules above (and writes the bytes it always wrote).

- Units. Every closed round's world size is a multiple of ``unit_size`` u; ranks
  [k*u, (k+1)*u) are unit k. u must divide min_nodes and max_nodes, and with
  ``units_within_domains`` a declared ``domain_size`` (else Configure or Join is refused,
  one line saying which numbers); a join that would put more than ``domain_size``
  participants in a domain is refused. A shaped job's JOINING round holds every
  participant (it may hold more than max_nodes); its close seats K whole units
  (``shapes.place``: intact units of the previous round keep their index and ranks,
  new units form per domain then, unless ``units_within_domains``, across domains; spare
  hosts first, then the longest waiting) and everyone else waits: the spares. It closes
  when K*u is max_nodes, or when the last call is over and K*u is at least min_nodes.
- A rank dies. Its round ends as any; the next round holds everyone, so its unit is no
  longer intact: the survivors are re-formed into units with the spares, or wait (they
  are alive and hold state other units need). A spare unit takes the free index, so the
  world keeps its size.
- Failure domains. When a member of domain D ("" never counts) is removed as failed and
  other participants of D remain, the JOINING round (the one the removal opens, or the one
  it leaves) gets ``hold_until_ms`` = now + 2 * heartbeat_interval_ms (later removals of
  D's participants push it on) and does not close before then, full or not: a domain-mate
  that died too is removed while the round is JOINING (no round change), one that is alive
  is seated in it. From cluster version 3 the round records the domains holding it
  (``hold_domains``) and the hold ends as soon as none of their participants remains: a
  host lost whole closes the round at its last participant's removal, not two heartbeat
  intervals after it (below version 3 the hold runs its time on every member alike).
  From cluster version 4 the leader also ends a hold once every remaining participant of
  its domains was heard from since the failure (``CloseRound.hold_over``): the host is
  known alive, so nothing is left to wait for (a process lost alone closes its round
  without the two intervals). The decision is the leader's, inside the command.
  ``closes_due`` honours the hold, so the leader proposes the close after it, and waits
  longer while a member of the held round is not known alive since the
  failure (heard on an open stream a heartbeat interval after it, by the carrying member's
  word), for at most two more heartbeat intervals: a host-mate whose stream's end was
  noticed late is removed while the round is JOINING (``supervisor.py``, ``_in_doubt``).
  A detector's verdict on the round a domain failure just ended (``MemberFailed.round``
  one below the current) still lands while the successor is held, for a participant with a
  domain: the verdicts on a host's participants are made together. The participants of an
  ended session leave a shaped job together (one round change, no hold for a domain none
  of whose participants remain). So a host loss ends exactly one round.
- Spares and scale-up. With ``scale_up``, an ACTIVE round with room for one more unit
  ends for the waiters only once the eligible ones make a whole unit, and a domain's
  waiters count only once the domain holds ``domain_size`` participants (when declared):
  a returning host is readmitted together, in one round change.
- Drain. ``Drain(D)`` records D in ``drained`` (machine snapshot format 7 while any is).
  Every job whose ACTIVE round has a member in D ends that round (DRAINED, detail naming D
  and the reason) and opens the next; D's participants are not eligible: they wait while
  D is drained (a JOINING round leaves them out at its close). ``Drain(D, drain=False)``
  forgets D and runs the close and scale-up rules of every job with a participant in D.
  Nobody died: the workers finish the step in flight before re-forming. A sharded model
  is restored from memory in the next world, so its ranks register a snapshot of that
  step first: a ``MemorySnapshotCommit`` with ``planned_end`` is fenced by the job's last
  ended round (round and token, its world size) if that round ended by plan (DRAINED,
  SCALE_UP) and no later round has registered one (``planned_end_job``).

Stragglers. A participant the straggler policy evicted (``MemberFailed`` with reason
STRAGGLER: its round ends, recorded in the history with it as ``ended_by``) is held out of
its job for ``straggler_hold_windows`` x ``straggler_window_ms`` of machine time from that
end: a ``Join`` (or a ``JoinBatch`` entry) that would add a participant of its name is
refused (``HeldOut``, saying when it may join again) and changes nothing. Without the hold
its process would join again at once, end the smaller round as a scale-up and be evicted
again a few windows later, over and over. The name is the identity (a restarted process, or
another session, under it waits just the same); the hold is read from the round history
(its newest STRAGGLER record naming the name), so it is as replicated as the history, kept
across a leader change and a snapshot, and bounded as the history is (``max_round_history``
rounds). It spans runs: a name evicted shortly before its job ended is held out of the next
run for the rest of its hold, and its refused join starts no run (the job stays ended, its
checkpoints kept). After the hold the name joins as any newcomer (a scale-up, if the job
scales up).
From cluster version 5 (``versions.STRAGGLER_HOLD_VERSION``); below it the join is admitted
at once, as before.

``join_timeout_ms`` is enforced by the client (how long a worker waits for its round to
close); ``reason`` reports how long a round has been joining.

Watching: every change to a job sets its ``revision`` to the raft index of the change (and
``Rendezvous.revision`` to the same), so a watcher compares revisions instead of states.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from . import codec
from .checkpoints import CheckpointRegistry
from .commands import (
    CloseJob,
    CloseRound,
    Configure,
    Drain,
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
    Failure,
    InvalidCommand,
    JobNotFound,
    ParticipantNotFound,
    StaleRound,
    StaleToken,
)
from .jobs import (
    DrainedDomain,
    EndReason,
    JobConfig,
    JobState,
    LeaveOutcome,
    Participant,
    ParticipantAssignment,
    Round,
    RoundRecord,
    RoundState,
    job_id_problem,
)
from .joins import JoinRules, batch_bytes
from .results import (
    CloseRoundResult,
    DrainResult,
    PruneJobsResult,
    RemoveResult,
    Result,
    RoundTrainedResult,
)
from .rounds import Job
from .roundstore import EndedRoundStore, RoundStore
from .view import JobView

__all__ = ["Job", "Rendezvous", "batch_bytes", "round_reason"]


class Rendezvous(JoinRules):
    """Every job: commands routed to the rules (:mod:`.joins`, :mod:`.rounds`), fencing of
    round-scoped writes, queries, and the state's snapshot form."""

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

    def drain(self, index: int, now_ms: int, command: Drain) -> Result:
        """Drain or undrain a failure domain (see "Drain" above)."""
        limit = self.limits.max_domain_chars
        if not 1 <= len(command.domain) <= limit:
            return InvalidCommand(f"a drained domain's name must be 1..{limit} characters")
        limit = self.limits.max_leave_detail_chars
        if len(command.reason) > limit:
            return InvalidCommand(f"a drain's reason must be at most {limit} characters")
        domain = command.domain
        if command.drain == (domain in self.drained):
            return DrainResult(domain, False, ())
        self.revision = index
        # Only jobs with a participant in the domain are touched, in job order.
        touched = [job for _, job in sorted(self.jobs.items()) if job.in_domain(domain)]
        if not command.drain:
            del self.drained[domain]
            for job in touched:
                # Its waiters may be seated now: a JOINING round may close, an ACTIVE one
                # scale up (shapes.py).
                self._after_change(index, now_ms, job)
            return DrainResult(domain, True, ())
        self.drained[domain] = DrainedDomain(domain, command.reason, now_ms)
        detail = f"domain {domain!r} drained" + (f": {command.reason}" if command.reason else "")
        ended: list[tuple[str, int]] = []
        for job in touched:
            r = job.round
            if r.state is not RoundState.ACTIVE or not any(
                job.participants[seat.participant_id].domain == domain for seat in r.members
            ):
                continue  # a JOINING round leaves them out at its close
            self._end_round(index, now_ms, job, EndReason.DRAINED, 0, detail)
            ended.append((job.job_id, r.number))
            self._open_next(index, now_ms, job, survivors=r.members)
        return DrainResult(domain, True, tuple(ended))

    def close_round(self, index: int, now_ms: int, command: CloseRound) -> Result:
        job = self.jobs.get(command.job)
        if job is None or job.round.number != command.round:
            return CloseRoundResult(command.job, command.round, False)
        if command.hold_over:
            self._end_hold(index, now_ms, job)
        if not job.close_due(now_ms, self.drained):
            return CloseRoundResult(command.job, command.round, False)
        self._close(index, now_ms, job)
        return CloseRoundResult(command.job, command.round, True)

    def member_failed(self, index: int, now_ms: int, command: MemberFailed) -> Result:
        job = self.jobs.get(command.job)
        pid = command.participant_id
        if job is None or pid not in job.participants:
            return RemoveResult(command.job, pid, False, 0)
        r = job.round
        # A failure domain's members fail together, and the detector judges them together:
        # a verdict on the round that a domain-mate's failure just ended lands in the held
        # successor ("Failure domains"), with no further round change.
        held = (
            r.number == command.round + 1
            and r.state is RoundState.JOINING
            and now_ms < r.hold_until_ms
            and job.participants[pid].domain != ""
        )
        if r.number != command.round and not held:
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
        frozen = self.jobs[job_id].ended_round_store(round_number, pid)
        if frozen is None:
            return store
        detail = (
            f"round {round_number} has ended; its store is read-only and lacks the key "
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

    def planned_end_job(self, job_id: str, round_number: int, token: int) -> Job | Failure:
        """The job if (round, token) are its last ended round's, that round ended by plan
        (DRAINED or SCALE_UP: every member still in the job) and no later round has
        registered a memory snapshot: the one command fenced so, a ``MemorySnapshotCommit``
        with ``planned_end``, records that round's final snapshot ("Drain" above)."""
        job = self.jobs.get(job_id)
        if job is None:
            return JobNotFound(job_id)
        last = job.history[-1] if job.history else None
        if last is None or last.number != round_number or job.closed:
            detail = f"round {round_number} is not the round that ended last"
            return StaleRound(job_id, round_number, job.round.number, detail)
        if last.end_reason not in (EndReason.DRAINED, EndReason.SCALE_UP):
            detail = f"round {round_number} ended by {last.end_reason.name.lower()}, not by plan"
            return StaleRound(job_id, round_number, job.round.number, detail)
        if token != last.fencing_token:
            return StaleToken(job_id, round_number, token, last.fencing_token)
        memory = job.checkpoints.memory
        if memory is not None and memory.round > round_number:
            detail = f"round {memory.round} registered a memory snapshot since"
            return StaleRound(job_id, round_number, job.round.number, detail)
        return job

    # ----------------------------------------------------------------- queries

    def closes_due(self, now_ms: int) -> list[tuple[str, int]]:
        """(job, round) of every JOINING round the leader should propose to close now."""
        return [
            (job_id, self.jobs[job_id].round.number)
            for job_id in sorted(self.jobs)
            if self.jobs[job_id].close_due(now_ms, self.drained)
        ]

    def drained_domains(self) -> list[DrainedDomain]:
        """The drained failure domains, in name order."""
        return [self.drained[domain] for domain in sorted(self.drained)]

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
        7 while a domain is drained, else 6 while a job holds a memory snapshot, else 5
        while ``next_participant_id`` is set, else 4. So a cluster that uses none of them
        writes the bytes it always wrote, and an older member refuses only a snapshot it
        cannot read."""
        if self.drained:
            return 7
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
        # next_participant_id only in formats 5 and later, the drained domains only in 7
        # (see snapshot_format): without batches, memory snapshots or drains the bytes are
        # those of format 4.
        snapshot_format = self.snapshot_format()
        return [
            self.revision,
            jobs,
            *([self.next_participant_id] if snapshot_format >= 5 else []),
            *(
                [[codec.to_obj(self.drained[domain]) for domain in sorted(self.drained)]]
                if snapshot_format >= 7
                else []
            ),
        ]

    def copy(self) -> Rendezvous:
        """A copy that later applies do not change (``StateMachine.frozen_copy``): O(N) with
        a C-speed step per participant, not a deep copy of every record."""
        clone = Rendezvous(self.limits)
        clone.jobs = {job_id: job.copy() for job_id, job in self.jobs.items()}
        clone.revision, clone.next_participant_id = self.revision, self.next_participant_id
        clone.drained = dict(self.drained)
        clone.cluster_version = self.cluster_version
        return clone

    def restore(
        self,
        obj: Any,
        *,
        lifecycle: bool = True,
        high_water: bool = False,
        memory_snapshots: bool = False,
        drained: bool = False,
    ) -> None:
        """Restore from :meth:`to_obj`'s form; ``lifecycle`` False reads a snapshot written
        before jobs had a lifecycle (10 fields per job: a closed job ended when its last
        round did); ``high_water`` True one that carries ``next_participant_id``;
        ``memory_snapshots`` True one whose checkpoint registries may carry a memory
        snapshot (format 6); ``drained`` True one that carries the drained domains
        (format 7)."""
        length = (4 if drained else 3) if high_water else 2
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
                job.add(participant)
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
        self.drained = {}
        if drained:
            for record in codec.from_obj(obj[3], tuple[DrainedDomain, ...]):
                if record.domain in self.drained:
                    raise codec.StateCodecError(f"domain {record.domain!r} drained twice")
                self.drained[record.domain] = record
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
    if now_ms < r.hold_until_ms:
        # From cluster version 3 the round names the domains holding it (Round.hold_domains).
        whose = (
            f"failed domain {', '.join(r.hold_domains)}"
            if r.hold_domains
            else "a failed member's domain"
        )
        return (
            f"{present} present; held until leader time {r.hold_until_ms} ms for the "
            f"participants of {whose}"
        )
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
