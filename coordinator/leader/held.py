"""When the leader may end a round held for a failed member's host-mates: who is known alive
since the failure that held it (rendezvous.py, "Failure domains"; supervisor.py, ``_in_doubt``
and ``_end_hold``).

The word it judges by is the leader's, gathered from every member's liveness reports and its
own streams (:class:`Word`); what counts as proof of life after the failure, and why, is in
:func:`all_known_alive`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..state.view import JobView

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Word:
    """What the leader heard of the participants of its held jobs (its monotonic ms)."""

    # When each was last heard on an open stream, by any member's word.
    heard: dict[Key, int]
    # The highest round each named in a heartbeat on an open stream, by any member's word.
    named: dict[Key, int]
    # The participants that reported a failed collective to the leader: (job,
    # participant) -> (the round it failed in, when).
    reported: dict[Key, tuple[int, int]]
    # (job, round) -> when the first failed collective of that round was reported.
    first_report: dict[tuple[str, int], int]


def seats_to_check(job: JobView, domains: Sequence[str]) -> tuple[int, ...]:
    """The participants of the held round whose word :func:`all_known_alive` judges: the
    members in ``domains`` (every one with a domain, if none is named). A walk of the whole
    round, so the leader keeps the answer per job revision: it is asked again with every
    heartbeat that names the held round, and a round may have tens of thousands of members
    of whom a handful share the failed member's host."""
    participants = job.participants
    out = []
    for seat in job.round.members:
        participant = participants.get(seat.participant_id)
        if participant is None or not participant.domain:
            continue
        if domains and participant.domain not in domains:
            continue
        out.append(seat.participant_id)
    return tuple(out)


def all_known_alive(
    job_id: str, job: JobView, seats: Sequence[int], word: Word, wall_ms: int, now_ms: int
) -> bool:
    """Whether every one of ``seats`` (:func:`seats_to_check`: the members of the held
    round in its held domains, or all with a domain) is known alive since the latest
    failure that held it: heard on an
    open stream at least a heartbeat interval after the failure (a heartbeat read right
    after it may have been sent before a death: it waited in a queue with the stream's
    end), by the word of the member carrying it (``LivenessReport.heard``), or it
    reported the failed collective of the round that failure ended to the leader (alive
    after the death that failed the collective). The failure is dated by its verdict, or
    by the first report to the leader of that round's failed collective if earlier (within two
    intervals): no later than the death either way, and nearer it.

    Or, with no margin, when the failure's verdict opened the held round (no later
    failure pushed its hold on): a heartbeat on an open stream that named the held round
    or a later one (``LivenessReport.named``). A worker names only a round it was told
    of, and the held round did not exist before the verdict that opened it, which came
    after the death: so that heartbeat was sent after the failure, however long it
    waited in a queue. A process that died with the failed member cannot send it (a
    heartbeat naming the ended round can, and counts only by the margin above). A
    failure during the JOINING round (a host-mate's later verdict pushing the hold)
    is after the round opened: there the margin alone counts."""
    r, interval_ms = job.round, job.config.heartbeat_interval_ms
    # The latest failure that held the round (each pushes the hold to 2 intervals past
    # it), on the leader's wall clock, then on its monotonic clock.
    failed_wall_ms = r.hold_until_ms - 2 * interval_ms
    named_proves = failed_wall_ms <= r.opened_ms
    failed_ms = now_ms - (wall_ms - failed_wall_ms)
    reported_ms = word.first_report.get((job_id, r.number - 1), failed_ms)
    since_ms = max(min(failed_ms, reported_ms), failed_ms - 2 * interval_ms)
    for pid in seats:
        if word.heard.get((job_id, pid), 0) >= since_ms + interval_ms:
            continue
        if named_proves and word.named.get((job_id, pid), 0) >= r.number:
            continue
        reported = word.reported.get((job_id, pid))
        if (
            reported is None
            or reported[0] != r.number - 1
            or reported[1] < failed_ms - 2 * interval_ms
        ):
            return False
    return True
