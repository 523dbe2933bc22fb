"""An evicted straggler is held out of its job (rendezvous.py, "Stragglers"): from cluster
version 5, a join by its name within ``straggler_hold_windows`` x ``straggler_window_ms`` of
its eviction is refused (``HeldOut``) and changes nothing; after the hold it joins as any
newcomer. Below the version the join is admitted at once, as before. Times are the
commands' own (the leader's)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rallypoint.coordinator.state.commands import (
    ClusterVersion,
    Join,
    JoinBatch,
    Leave,
    MemberFailed,
)
from rallypoint.coordinator.state.errors import HeldOut
from rallypoint.coordinator.state.jobs import (
    EndReason,
    JobConfig,
    JobState,
    LeaveOutcome,
    RoundState,
)
from rallypoint.coordinator.state.machine import StateMachine
from rallypoint.coordinator.state.results import ClusterVersionResult, JoinResult
from rallypoint.coordinator.state.versions import STRAGGLER_HOLD_VERSION, required_version

from .job_replica import JobReplica

# Three workers, scale-up on, rounds close at once; straggler windows of 1 s, held 5 of them.
CONFIG = JobConfig(
    min_nodes=2,
    max_nodes=3,
    scale_up=True,
    straggler_factor_milli=1500,
    straggler_window_ms=1000,
    straggler_hold_windows=5,
)
HOLD_MS = 5 * 1000


def evicted(version: int = STRAGGLER_HOLD_VERSION, config: JobConfig = CONFIG) -> JobReplica:
    """A replica at cluster ``version`` whose job's round 1 (w0, w1, w2) ended by the
    straggler policy evicting w2: round 2 is ACTIVE with w0 and w1."""
    return evicted_in_session(version, config)[0]


def evicted_in_session(
    version: int = STRAGGLER_HOLD_VERSION, config: JobConfig = CONFIG
) -> tuple[JobReplica, int]:
    """:func:`evicted`, and the session whose batch joined the three workers."""
    r = JobReplica()
    if version > 1:
        assert r.apply(ClusterVersion(version)) == ClusterVersionResult(version, True)
    # One batch, so that the first round holds all three (rounds close at once).
    session = r.open()
    batch = r.do(session, JoinBatch("j", ("w0", "w1", "w2"), (), config))
    w0, w1, w2 = batch.participant_ids  # type: ignore[attr-defined]
    assert r.job().round.state is RoundState.ACTIVE and r.job().round.number == 1
    r.time_ms += 3_000
    cause = "straggler: 900 ms per step outside collectives, 3.0 x the median"
    verdict = MemberFailed("j", w2, 1, cause, EndReason.STRAGGLER)
    assert r.apply(verdict).removed  # type: ignore[attr-defined]
    now = r.job().round
    assert (now.number, now.state, now.member_ids) == (2, RoundState.ACTIVE, [w0, w1])
    return r, session


def join_again(r: JobReplica, name: str = "w2") -> object:
    """A join by ``name`` from a new session (a restarted process)."""
    return r.do(r.open(), Join("j", name, b"", CONFIG))


def test_a_join_by_the_evicted_name_within_the_hold_is_refused_and_ends_no_round() -> None:
    r = evicted()
    ended_ms = r.job().history[-1].ended_ms
    before = (r.job().round, list(r.job().waiting), sorted(r.job().participants))
    r.time_ms += 1_500
    refused = join_again(r)
    assert refused == HeldOut("j", "w2", 1, ended_ms + HOLD_MS, HOLD_MS - 1_500)
    assert "join again in 3.500 s" in refused.message  # type: ignore[attr-defined]
    assert (r.job().round, list(r.job().waiting), sorted(r.job().participants)) == before
    # A batch holding the name is refused whole; the same holds just before the hold ends.
    r.time_ms = ended_ms + HOLD_MS - 1
    batch = r.do(r.open(), JoinBatch("j", ("w2", "w9"), (), CONFIG))
    assert isinstance(batch, HeldOut) and batch.retry_after_ms == 1
    assert [rec.end_reason for rec in r.job().history] == [EndReason.STRAGGLER]
    assert r.job().round == before[0]


def test_after_the_hold_the_name_joins_as_a_newcomer_and_scales_the_job_up() -> None:
    r = evicted()
    r.time_ms = r.job().history[-1].ended_ms + HOLD_MS
    joined = join_again(r)
    assert isinstance(joined, JoinResult)
    reasons = [rec.end_reason for rec in r.job().history]
    assert reasons == [EndReason.STRAGGLER, EndReason.SCALE_UP]
    assert len(r.job().round.members) == 3


def test_only_the_evicted_name_is_held_and_only_after_a_straggler_verdict() -> None:
    r = evicted()
    r.time_ms += 100
    # Another worker's join scales the job up as ever.
    assert isinstance(join_again(r, "w3"), JoinResult)
    assert r.job().history[-1].end_reason is EndReason.SCALE_UP
    # A member declared failed (not a straggler) may come back at once.
    w0 = r.job().round.member_ids[0]
    r.time_ms += 100
    assert r.fail(w0).removed  # type: ignore[attr-defined]
    assert isinstance(join_again(r, "w0"), JoinResult)


def test_a_refused_join_into_an_ended_job_leaves_it_ended_with_its_checkpoints() -> None:
    """The job ended (its last workers finished) within w2's hold: w2's join, which would
    start a new run, is refused and starts none: the job stays FINISHED as it was (a new run
    would have emptied its checkpoint registry). A join that is refused changes nothing."""
    r, session = evicted_in_session()
    for pid in list(r.job().round.member_ids):
        r.do(session, Leave("j", pid, LeaveOutcome.FINISHED))
    job = r.job()
    assert job.ended and job.outcome is JobState.FINISHED
    before = (job.round, list(job.history), job.ended_ms, job.end_detail)
    r.time_ms += 1_000
    assert isinstance(join_again(r), HeldOut)
    job = r.job()
    assert job.ended and job.outcome is JobState.FINISHED
    assert (job.round, list(job.history), job.ended_ms, job.end_detail) == before


def test_the_hold_is_read_from_the_replicated_state_a_snapshot_restores() -> None:
    r = evicted()
    restored = StateMachine()
    restored.restore(r.sm.snapshot())
    r.sm = restored
    r.time_ms += 1_000
    assert isinstance(join_again(r), HeldOut)


def test_below_cluster_version_5_the_evicted_name_joins_at_once_as_before() -> None:
    r = evicted(STRAGGLER_HOLD_VERSION - 1)
    r.time_ms += 100
    assert isinstance(join_again(r), JoinResult)
    reasons = [rec.end_reason for rec in r.job().history]
    assert reasons == [EndReason.STRAGGLER, EndReason.SCALE_UP]


def test_the_default_hold_is_written_as_before_and_another_needs_cluster_version_5() -> None:
    default = replace(CONFIG, straggler_hold_windows=JobConfig(1, 1).straggler_hold_windows)
    assert required_version(Join("j", "w0", b"", default)) == (1, "")
    needed = required_version(Join("j", "w0", b"", CONFIG))
    assert needed == (STRAGGLER_HOLD_VERSION, "JobConfig.straggler_hold_windows")


@pytest.mark.parametrize("windows", [0, -1])
def test_a_hold_of_less_than_one_window_is_refused_in_one_line(windows: int) -> None:
    config = replace(CONFIG, straggler_hold_windows=windows)
    assert config.problem(JobReplica().sm.rendezvous.limits) == (
        "straggler_hold_windows must be >= 1"
    )
