"""``rallypoint jobs`` and ``rounds`` as documents and tables, without a cluster: a finished
job's state, and the leader's epoch milliseconds shown as local times."""

from __future__ import annotations

import time
from datetime import datetime

from rallypoint.client import JobState, RoundInfo, RoundState
from rallypoint.coordinator.cli.jobs import duration, human_times, jobs_document, local_time

ENDED_MS = 1_796_460_467_504


def finished() -> RoundInfo:
    return RoundInfo(
        job="demo",
        round=3,
        state=RoundState.JOINING,
        members=(),
        world_size=0,
        fencing_token=0,
        store_namespace="demo/3",
        reason=f"job finished at leader time {ENDED_MS} ms: the last participant finished",
        waiting=(),
        opened_ms=ENDED_MS,
        closed_ms=0,
        job_closed=False,
        job_revision=99,
        job_state=JobState.FINISHED,
        job_ended_ms=ENDED_MS,
    )


def test_a_finished_job_is_finished_in_json_too() -> None:
    # `jobs` said finished and `jobs --json` said "state": "joining" (its empty round's).
    (row,) = jobs_document([finished()])["jobs"]
    assert (row["state"], row["round_state"], row["job_state"]) == (
        "finished",
        "joining",
        "finished",
    )


def test_leader_times_are_shown_as_local_times_and_durations() -> None:
    now_s = ENDED_MS / 1000 + 75.2
    clock = datetime.fromtimestamp(ENDED_MS / 1000).strftime("%H:%M:%S")
    assert local_time(ENDED_MS, now_s) == f"{clock} (1 min 15 s ago)"
    assert human_times(finished().reason, now_s) == (
        f"job finished at {clock} (1 min 15 s ago): the last participant finished"
    )
    # Another day says its date.
    a_week_later_s = now_s + 7 * 86_400
    assert local_time(ENDED_MS, a_week_later_s).startswith(
        datetime.fromtimestamp(ENDED_MS / 1000).strftime("%Y-%m-%d %H:%M:%S (")
    )
    assert [duration(s) for s in (0.42, 12.4, 243, 7_500)] == [
        "0.4 s",
        "12 s",
        "4 min 3 s",
        "2 h 5 min",
    ]
    assert str(ENDED_MS) not in human_times(finished().reason, time.time())
