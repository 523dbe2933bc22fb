"""Rendezvous series drawn from the applied log: participants, spares, drained domains, rounds
opened, closed and ended, and how long rounds took to close.

Theory of operation. The state machine holds no metrics (it may not import them, and it
must stay a pure function of the log), so the member looks at it after each batch of
applied entries (``RoundObserver.observe``, from the Ready loop) and counts what changed
since the last look. Every change to a job sets its ``revision`` to the raft index of the
change and ``Rendezvous.revision`` with it, so a batch that touched no job costs one
comparison, and only the jobs whose revision moved are looked at.

For each such job the observer keeps a ``Mark``: the round it saw last, whether that round
was already counted as closed, and the newest ended round it counted. The difference to the
job now (``round_changes``) is what happened between the two looks, whatever entries it
took: every ended round newer than the mark is in the job's history (with its opening,
closing and end time and its end reason), and the current round is the last one opened.
A batch that saw more rounds end than the history keeps (``max_round_history``) counts only
those the history still holds.

The first look (when the member starts) takes its marks without counting: the counters
count what this member applies from then on. Round close durations are the log's own
leader-stamped times (``closed_ms - opened_ms``), so every member observes the same values.

Spares are a job's waiting participants outside the drained domains, so they depend on the
drained set as well as on the job: a look that finds the drained set changed looks at every
job again (a drain is rare; a look that finds it unchanged costs one comparison).
"""

from __future__ import annotations

from dataclasses import dataclass

from .metrics import END_CAUSES, OTHER_JOBS, PARTICIPANT_STATES, NodeMetrics
from .state.jobs import RoundState
from .state.view import JobView, RendezvousView


@dataclass(frozen=True, slots=True)
class Mark:
    """What the observer last saw of a job. ``closed``: round ``round_number`` has been
    counted as closed. ``ended_through``: the newest ended round counted (0: none)."""

    round_number: int
    closed: bool
    ended_through: int


@dataclass(frozen=True, slots=True)
class RoundChanges:
    """What happened to a job between two looks."""

    opened: int
    # Seconds from opening to close, one per round closed.
    close_seconds: tuple[float, ...]
    # End cause (``END_CAUSES``) of each round ended, oldest first.
    ended: tuple[str, ...]


def mark_of(job: JobView) -> Mark:
    history = job.history
    return Mark(
        job.round.number,
        job.round.state is not RoundState.JOINING,
        history[-1].number if history else 0,
    )


def round_changes(before: Mark | None, job: JobView) -> RoundChanges:
    """What happened to ``job`` since ``before`` (None: a job not seen before, every round
    of which is new)."""
    if before is None:
        before = Mark(0, False, 0)
    opened = 0
    close_seconds: list[float] = []
    ended: list[str] = []
    current = job.round
    for record in job.history:
        if record.number <= before.ended_through:
            continue
        if record.number != before.round_number:
            opened += 1
        already_closed = record.number == before.round_number and before.closed
        if record.closed_ms and not already_closed:
            close_seconds.append(max(0, record.closed_ms - record.opened_ms) / 1000)
        ended.append(END_CAUSES[record.end_reason])
    # A closed job's current round is its last ended one (state ENDED), counted above.
    if (
        current.state is RoundState.ENDED
        and job.history
        and job.history[-1].number == (current.number)
    ):
        return RoundChanges(opened, tuple(close_seconds), tuple(ended))
    if current.number != before.round_number:
        opened += 1
    already_closed = current.number == before.round_number and before.closed
    if current.state is RoundState.ACTIVE and not already_closed:
        close_seconds.append(max(0, current.closed_ms - current.opened_ms) / 1000)
    return RoundChanges(opened, tuple(close_seconds), tuple(ended))


def spare_count(job: JobView, drained: frozenset[str]) -> int:
    """The job's waiting participants that are not in a drained domain."""
    if not drained:
        return len(job.waiting)
    participants = job.participants
    return sum(
        1
        for pid in job.waiting
        if (participant := participants.get(pid)) is None or participant.domain not in drained
    )


def participant_counts(job: JobView) -> tuple[int, int, int]:
    """(joining, active, waiting): ``PARTICIPANT_STATES`` in order."""
    members = len(job.round.members)
    state = job.round.state
    return (
        members if state is RoundState.JOINING else 0,
        members if state is RoundState.ACTIVE else 0,
        len(job.waiting),
    )


class RoundObserver:
    """Feeds the rendezvous series of ``metrics`` from the applied state (module docstring)."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self._metrics = metrics
        self._marks: dict[str, Mark] = {}
        # The rendezvous revision of the last look; None before the first.
        self._revision: int | None = None
        # Participant and spare counts of every job, to sum those sharing OTHER_JOBS.
        self._counts: dict[str, tuple[int, int, int]] = {}
        self._spares: dict[str, int] = {}
        # The drained domains at the last look.
        self._drained: frozenset[str] = frozenset()

    def observe(self, rendezvous: RendezvousView) -> None:
        revision = rendezvous.revision
        drained = frozenset(d.domain for d in rendezvous.drained_domains())
        drained_changed = drained != self._drained
        if revision == self._revision and not drained_changed:
            return
        self._drained = drained
        self._metrics.drained_domains.set(len(drained))
        jobs = rendezvous.jobs
        first_look = self._revision is None
        # A changed drained set changes spares of jobs whose revision did not move.
        since = -1 if drained_changed else (self._revision or 0)
        self._revision = revision
        others_changed = False
        for job_id in [j for j in self._marks if j not in jobs]:
            others_changed |= self._drop(job_id)
        for job_id, job in jobs.items():
            if job.revision <= since and job_id in self._marks:
                continue
            before = self._marks.get(job_id)
            self._marks[job_id] = mark_of(job)
            label = self._metrics.job_label(job_id)
            if not first_look:
                self._count(label, round_changes(before, job))
            counts = participant_counts(job)
            spares = spare_count(job, drained)
            if label == OTHER_JOBS:
                others_changed |= self._counts.get(job_id) != counts
                others_changed |= self._spares.get(job_id) != spares
            else:
                self._set_participants(label, counts)
                self._metrics.spares.labels(label).set(spares)
            self._counts[job_id] = counts
            self._spares[job_id] = spares
        if others_changed:
            self._set_participants(OTHER_JOBS, self._other_counts())
            labels = self._metrics.job_labels
            self._metrics.spares.labels(OTHER_JOBS).set(
                sum(n for j, n in self._spares.items() if labels.get(j) == OTHER_JOBS)
            )

    def _count(self, label: str, changes: RoundChanges) -> None:
        metrics = self._metrics
        if changes.opened:
            metrics.rounds_opened.labels(label).inc(changes.opened)
        if changes.close_seconds:
            metrics.rounds_closed.labels(label).inc(len(changes.close_seconds))
            for seconds in changes.close_seconds:
                metrics.round_close_seconds.observe(seconds)
        for cause in changes.ended:
            metrics.rounds_ended.labels(label, cause).inc()

    def _set_participants(self, label: str, counts: tuple[int, int, int]) -> None:
        for state, count in zip(PARTICIPANT_STATES, counts, strict=True):
            self._metrics.participants.labels(label, state).set(count)

    def _other_counts(self) -> tuple[int, int, int]:
        labels = self._metrics.job_labels
        shared = [c for j, c in self._counts.items() if labels.get(j) == OTHER_JOBS]
        return (
            sum(c[0] for c in shared),
            sum(c[1] for c in shared),
            sum(c[2] for c in shared),
        )

    def _drop(self, job_id: str) -> bool:
        """Forget a job the state no longer has, and its series; True if it shared
        OTHER_JOBS."""
        self._marks.pop(job_id, None)
        self._counts.pop(job_id, None)
        self._spares.pop(job_id, None)
        shared = self._metrics.job_labels.get(job_id) == OTHER_JOBS
        self._metrics.forget_job(job_id)
        return shared
