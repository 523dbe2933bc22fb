"""Job lifecycle: finished, failed and closed jobs, their retention and pruning, the time a
round trained and where its state came from; and that snapshots and log entries of the
format before it stay readable."""

from __future__ import annotations

from pathlib import Path

import msgpack

from rallypoint.coordinator.state import codec
from rallypoint.coordinator.state.commands import (
    CheckpointBegin,
    CheckpointCommit,
    CheckpointShardDone,
    CloseJob,
    Configure,
    Envelope,
    Join,
    JoinBatch,
    Leave,
    MemorySnapshotCommit,
    PruneJobs,
    RoundTrained,
    SessionClose,
    decode_envelope,
    encode_envelope,
)
from rallypoint.coordinator.state.errors import InvalidCommand, JobClosed
from rallypoint.coordinator.state.jobs import (
    JobConfig,
    JobState,
    LeaveOutcome,
    RendezvousLimits,
    Round,
    RoundRecord,
    RoundState,
)
from rallypoint.coordinator.state.machine import Limits, StateMachine
from rallypoint.coordinator.state.results import (
    CheckpointBeginResult,
    CheckpointCommitResult,
    JoinBatchResult,
    JoinResult,
    MemorySnapshotCommitResult,
    PruneJobsResult,
    RemoveResult,
    RoundTrainedResult,
)

from .job_replica import CONFIG, JobReplica

GOLDEN = Path(__file__).parent / "golden"
ONE = JobConfig(min_nodes=1, max_nodes=2)


def leave(r: JobReplica, session: int, pid: int, outcome: LeaveOutcome, detail: str = "") -> None:
    result = r.do(session, Leave("j", pid, outcome, detail))
    assert isinstance(result, RemoveResult), result


def two_workers(r: JobReplica) -> list[tuple[int, int]]:
    """Two workers in an ACTIVE round: (session, participant id) each."""
    sessions = [r.open(), r.open()]
    pids = [r.join(s, f"w{n}", CONFIG).participant_id for n, s in enumerate(sessions)]
    r.time_ms += 1_000
    r.close_round()
    assert r.job().round.state is RoundState.ACTIVE
    return list(zip(sessions, pids, strict=True))


def test_the_last_worker_to_leave_finished_ends_the_job_finished() -> None:
    r = JobReplica()
    (sa, a), (sb, b) = two_workers(r)
    leave(r, sa, a, LeaveOutcome.FINISHED)
    assert r.job().state is JobState.OPEN  # one is still in the job
    r.time_ms = 9_000
    leave(r, sb, b, LeaveOutcome.FINISHED, "reached max_steps 200")
    job = r.job()
    assert (job.state, job.ended_ms, job.end_detail) == (
        JobState.FINISHED,
        9_000,
        "reached max_steps 200",
    )
    # No longer "joining for 1038 s of the join timeout": the reason says it ended.
    assert r.sm.rendezvous.reason("j", 99_000) == (
        "job finished at leader time 9000 ms: reached max_steps 200"
    )
    assert job.round.state is RoundState.JOINING and not job.round.members
    assert r.sm.rendezvous.closes_due(99_000) == []
    # The same job id runs again: a new run, rounds go on.
    number = job.round.number
    again = r.join(r.open(), "w9", ONE)
    assert again.round == number
    assert (r.job().state, r.job().ended_ms, r.job().config) == (JobState.OPEN, 0, ONE)


def test_a_failure_reported_by_any_leave_makes_the_job_failed() -> None:
    r = JobReplica()
    (sa, a), (sb, b) = two_workers(r)
    leave(r, sa, a, LeaveOutcome.FAILED, "workers failed: exit code 1")
    assert r.job().state is JobState.OPEN
    leave(r, sb, b, LeaveOutcome.FINISHED)
    assert (r.job().state, r.job().end_detail) == (JobState.FAILED, "workers failed: exit code 1")


def test_a_failure_then_the_last_worker_dying_is_failed() -> None:
    r = JobReplica()
    (sa, a), (sb, _) = two_workers(r)
    leave(r, sa, a, LeaveOutcome.FAILED)
    r.apply(SessionClose(), session_id=sb)  # the other process dies: its session ends
    assert r.job().state is JobState.FAILED
    assert r.job().end_detail == "w0 left saying the job failed"


def test_leaving_without_an_outcome_or_dying_leaves_the_job_open() -> None:
    r = JobReplica()
    (sa, a), (sb, _) = two_workers(r)
    leave(r, sa, a, LeaveOutcome.UNSPECIFIED)
    r.apply(SessionClose(), session_id=sb)
    assert not r.job().participants
    assert r.job().state is JobState.OPEN  # a restarted worker may come back


def test_closed_is_a_state_and_only_configure_reopens() -> None:
    r = JobReplica()
    two_workers(r)
    r.time_ms = 5_000
    r.do(r.open(), CloseJob("j"))
    assert (r.job().state, r.job().ended_ms) == (JobState.CLOSED, 5_000)
    assert r.do(r.open(), Join("j", "late", b"", CONFIG)) == JobClosed("j")
    r.do(r.open(), Configure("j", CONFIG))
    assert (r.job().state, r.job().ended_ms) == (JobState.OPEN, 0)


def test_configure_starts_a_finished_job_again() -> None:
    r = JobReplica()
    session = r.open()
    pid = r.join(session, "w0", ONE).participant_id
    leave(r, session, pid, LeaveOutcome.FINISHED)
    assert r.job().state is JobState.FINISHED
    r.do(r.open(), Configure("j", ONE))
    assert r.job().state is JobState.OPEN


def test_a_leave_detail_is_bounded() -> None:
    r = JobReplica(Limits(rendezvous=RendezvousLimits(max_leave_detail_chars=4)))
    session = r.open()
    pid = r.join(session, "w0", ONE).participant_id
    refused = r.do(session, Leave("j", pid, LeaveOutcome.FAILED, "x" * 5))
    assert isinstance(refused, InvalidCommand)
    assert pid in r.job().participants


def finish(r: JobReplica, job: str, time_ms: int) -> None:
    r.time_ms = time_ms
    session = r.open()
    result = r.do(session, Join(job, "w", b"", ONE))
    assert isinstance(result, JoinResult)
    assert isinstance(
        r.do(session, Leave(job, result.participant_id, LeaveOutcome.FINISHED)), RemoveResult
    )


def test_ended_jobs_are_kept_up_to_a_count_and_an_age() -> None:
    limits = RendezvousLimits(max_ended_jobs=2, ended_job_retention_ms=10_000)
    r = JobReplica(Limits(rendezvous=limits))
    for n, job in enumerate(("a", "b", "c")):
        finish(r, job, 1_000 + n)
    # Three ended, two kept: the one that ended first is gone.
    assert sorted(r.sm.rendezvous.jobs) == ["b", "c"]
    r.time_ms = 5_000
    r.join(r.open(), "w0", ONE, job="open")
    # Past the age, at the next job command: every ended job goes, the open one stays.
    r.time_ms = 11_002
    r.join(r.open(), "w1", ONE, job="open")
    assert sorted(r.sm.rendezvous.jobs) == ["open"]


def test_prune_removes_ended_jobs_only_as_told() -> None:
    r = JobReplica()
    for n, job in enumerate(("a", "b", "c", "d")):
        finish(r, job, 1_000 * (n + 1))
    r.join(r.open(), "w0", ONE, job="open")
    r.time_ms = 10_000
    operator = r.open()
    # The one that ended last is kept; only those that ended 7 s ago or more go.
    assert r.do(operator, PruneJobs(7_000, 1)) == PruneJobsResult(("a", "b", "c"))
    assert sorted(r.sm.rendezvous.jobs) == ["d", "open"]
    # Named: an open job is never pruned, nor an unknown one.
    assert r.do(operator, PruneJobs(0, 0, ("open", "zz", "d"))) == PruneJobsResult(("d",))
    assert sorted(r.sm.rendezvous.jobs) == ["open"]
    assert isinstance(r.do(operator, PruneJobs(-1, 0)), InvalidCommand)


def test_a_new_job_takes_the_place_of_the_oldest_ended_one_when_full() -> None:
    r = JobReplica(Limits(rendezvous=RendezvousLimits(max_jobs=2)))
    finish(r, "a", 1_000)
    finish(r, "b", 2_000)
    r.join(r.open(), "w0", ONE, job="c")
    assert sorted(r.sm.rendezvous.jobs) == ["b", "c"]


def test_a_round_trained_once_and_its_record_keeps_it() -> None:
    r = JobReplica()
    (sa, a), _ = two_workers(r)
    number = r.job().round.number
    assert r.apply(RoundTrained("j", number + 1)) == RoundTrainedResult("j", number + 1, False)
    r.time_ms = 7_000
    assert r.apply(RoundTrained("j", number)) == RoundTrainedResult("j", number, True)
    r.time_ms = 8_000
    assert r.apply(RoundTrained("j", number)) == RoundTrainedResult("j", number, False)
    assert r.job().round.trained_ms == 7_000
    leave(r, sa, a, LeaveOutcome.UNSPECIFIED)
    assert r.job().history[-1].trained_ms == 7_000
    assert r.job().round.trained_ms == 0  # the next round has not trained yet
    # A JOINING round does not train.
    assert r.apply(RoundTrained("j", r.job().round.number)).recorded is False  # type: ignore[attr-defined]


def test_the_lifecycle_survives_a_snapshot() -> None:
    r = JobReplica()
    (sa, a), (sb, b) = two_workers(r)
    r.apply(RoundTrained("j", r.job().round.number))
    leave(r, sa, a, LeaveOutcome.FAILED, "oom")
    leave(r, sb, b, LeaveOutcome.FINISHED)
    finish(r, "k", 3_000)
    data = r.sm.snapshot()
    restored = StateMachine()
    restored.restore(data)
    assert restored.snapshot() == data
    job = restored.rendezvous.jobs["j"]
    assert (job.state, job.end_detail) == (JobState.FAILED, "oom")
    assert restored.rendezvous.jobs["k"].state is JobState.FINISHED


# ---------------------------------------------------------------------- older formats


def test_a_snapshot_of_the_format_before_the_lifecycle_is_restored() -> None:
    # Written by the release before jobs had a lifecycle (snapshot format 3), from the log
    # in format3-log.msgpack (see golden/README.md).
    old = (GOLDEN / "format3-snapshot.msgpack").read_bytes()
    restored = StateMachine()
    restored.restore(old)
    jobs = restored.rendezvous.jobs
    assert sorted(jobs) == ["other", "train"]
    assert jobs["train"].state is JobState.OPEN
    closed = jobs["other"]
    assert closed.state is JobState.CLOSED
    assert closed.ended_ms == closed.history[-1].ended_ms > 0
    assert all(record.trained_ms == 0 for record in jobs["train"].history)
    # Replaying that release's log gives the same state as restoring its snapshot.
    replayed = StateMachine()
    for index, data in msgpack.unpackb((GOLDEN / "format3-log.msgpack").read_bytes()):
        replayed.apply(index, data)
    assert replayed.snapshot() == restored.snapshot()


def test_a_round_trained_keeps_its_restore_and_an_older_command_reads_without_one() -> None:
    r = JobReplica()
    (sa, a), _ = two_workers(r)
    number = r.job().round.number
    # A RoundTrained as a leader of the release before restores existed wrote it: no field.
    older = msgpack.packb([20, 0, 0, 0, r.time_ms, [47, "j", number]], use_bin_type=True)
    command = decode_envelope(older).command
    assert command == RoundTrained("j", number) and command.restore == ""  # type: ignore[attr-defined]
    # And a restore left unsaid is written that way, so such a leader reads today's too.
    assert encode_envelope(Envelope(0, 0, 0, r.time_ms, RoundTrained("j", number))) == older
    r.apply(RoundTrained("j", number, "broadcast"))
    assert r.job().round.restore == "broadcast"
    leave(r, sa, a, LeaveOutcome.UNSPECIFIED)
    assert r.job().history[-1].restore == "broadcast"
    assert r.job().round.restore == ""  # the next round has not said yet
    data = r.sm.snapshot()
    restored = StateMachine()
    restored.restore(data)
    assert restored.rendezvous.jobs["j"].history[-1].restore == "broadcast"
    assert restored.snapshot() == data


def test_rounds_of_an_older_snapshot_read_with_no_restore() -> None:
    # Round and RoundRecord as written before the restore: their last field is trained_ms.
    round_obj = [343, 4, 2, [[342, 9, 0]], [], 1_000, None, 2_000, 12, 3_000]
    record_obj = [345, 3, [[344, 9, "w0", 0]], 8, 500, 600, 900, 1, 10, "phi 9.1", 700]
    assert codec.from_obj(round_obj, Round).restore == ""
    record = codec.from_obj(record_obj, RoundRecord)
    assert (record.trained_ms, record.restore) == (700, "")
    # Unchanged records keep their bytes: the field is written only when it says something.
    assert codec.to_obj(codec.from_obj(record_obj, RoundRecord)) == record_obj


def finished_run_with_state(r: JobReplica) -> None:
    """A run of job "j" that committed a checkpoint and a memory snapshot, then finished."""
    (sa, a), (sb, b) = two_workers(r)
    r_ = r.job().round
    begun = r.do(sa, CheckpointBegin("j", r_.number, r_.fencing_token, 300, 2, b"L", "/ck/300"))
    assert isinstance(begun, CheckpointBeginResult)
    for rank in (0, 1):
        r.do(sa, CheckpointShardDone("j", r_.number, r_.fencing_token, begun.checkpoint_id, rank))
    committed = r.do(sa, CheckpointCommit("j", r_.number, r_.fencing_token, begun.checkpoint_id))
    assert isinstance(committed, CheckpointCommitResult)
    memory = r.do(sa, MemorySnapshotCommit("j", r_.number, r_.fencing_token, 300, 2, b"", b""))
    assert isinstance(memory, MemorySnapshotCommitResult)
    leave(r, sa, a, LeaveOutcome.FINISHED)
    leave(r, sb, b, LeaveOutcome.FINISHED)
    assert r.job().state is JobState.FINISHED


def test_a_job_id_used_again_is_a_new_run_that_does_not_see_the_old_runs_state() -> None:
    r = JobReplica()
    finished_run_with_state(r)
    assert r.sm.rendezvous.jobs["j"].checkpoints.latest() is not None
    result = r.do(r.open(), Join("j", "w1", b"", CONFIG, resume=False))
    assert isinstance(result, JoinResult)
    registry = r.job().checkpoints
    # Not step 300 of the run before: the new run starts fresh (issue 34, item 2).
    assert (registry.latest(), registry.latest_memory_snapshot()) == (None, None)
    # Its second worker joins an open job: nothing more is forgotten, nothing comes back.
    r.do(r.open(), Join("j", "w2", b"", CONFIG, resume=True))
    assert r.job().checkpoints.latest() is None


def test_a_new_run_with_resume_restores_the_old_runs_latest() -> None:
    for batch in (False, True):
        r = JobReplica()
        finished_run_with_state(r)
        if batch:
            joined = r.do(r.open(), JoinBatch("j", ("w1", "w2"), (), CONFIG, resume=True))
            assert isinstance(joined, JoinBatchResult)
        else:
            assert isinstance(r.do(r.open(), Join("j", "w1", b"", CONFIG, resume=True)), JoinResult)
        latest = r.job().checkpoints.latest()
        assert latest is not None and latest.step == 300


def test_a_join_batch_that_starts_a_new_run_fences_the_old_state_off() -> None:
    r = JobReplica()
    finished_run_with_state(r)
    joined = r.do(r.open(), JoinBatch("j", ("a0", "a1"), (), CONFIG, resume=False))
    assert isinstance(joined, JoinBatchResult)
    assert r.job().checkpoints.latest() is None


def test_a_join_of_the_format_before_runs_reads_as_resume_and_is_written_so() -> None:
    # A Join as written before runs existed (no resume field) did what resume=True does now.
    r = JobReplica()
    finished_run_with_state(r)
    session = r.open()
    older = msgpack.packb(
        [20, session, 1, 0, r.time_ms, [41, "j", "w1", b"", codec.to_obj(CONFIG)]],
        use_bin_type=True,
    )
    command = decode_envelope(older).command
    assert command == Join("j", "w1", b"", CONFIG) and command.resume  # type: ignore[attr-defined]
    assert encode_envelope(decode_envelope(older)) == older
    fresh = Envelope(session, 1, 0, r.time_ms, Join("j", "w1", b"", CONFIG, resume=False))
    assert len(msgpack.unpackb(encode_envelope(fresh))[-1]) == 6  # the field is written
