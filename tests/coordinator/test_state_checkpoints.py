"""The checkpoint registry: begin, shards, commit, abort, latest, retirement, and fencing
(a stale round or token, a zombie, a round that ended under a pending checkpoint)."""

from __future__ import annotations

from dataclasses import replace

from rallypoint.coordinator.state.commands import (
    CheckpointAbort,
    CheckpointBegin,
    CheckpointCommit,
    CheckpointShardDone,
)
from rallypoint.coordinator.state.errors import (
    CheckpointIncomplete,
    CheckpointNotFound,
    InvalidCommand,
    JobNotFound,
    LimitExceeded,
    StaleRound,
    StaleToken,
)
from rallypoint.coordinator.state.jobs import CheckpointInfo, RendezvousLimits
from rallypoint.coordinator.state.machine import Limits, StateMachine
from rallypoint.coordinator.state.results import (
    CheckpointAbortResult,
    CheckpointBeginResult,
    CheckpointCommitResult,
    ShardDoneResult,
)

from .job_replica import CONFIG, JobReplica


def active(limits: Limits | None = None, keep: int = 3) -> tuple[JobReplica, int, int, int]:
    """Job "j" ACTIVE with 3 workers; (replica, session, round, fencing token)."""
    r = JobReplica(limits)
    r.workers(3, replace(CONFIG, min_nodes=3, last_call_ms=0, keep_checkpoints=keep))
    s = r.open()
    return r, s, r.job().round.number, r.job().round.fencing_token


def checkpoint(r: JobReplica, s: int, round_: int, token: int, step: int) -> CheckpointInfo:
    begun = r.do(s, CheckpointBegin("j", round_, token, step, 3, b"layout", f"file:///ck/{step}"))
    assert isinstance(begun, CheckpointBeginResult)
    for rank in range(3):
        r.do(s, CheckpointShardDone("j", round_, token, begun.checkpoint_id, rank))
    committed = r.do(s, CheckpointCommit("j", round_, token, begun.checkpoint_id))
    assert isinstance(committed, CheckpointCommitResult)
    return committed.checkpoint


def test_begin_report_commit_and_latest() -> None:
    r, s, round_, token = active()
    registry = r.job().checkpoints
    assert registry.latest() is None
    begun = r.do(s, CheckpointBegin("j", round_, token, 100, 3, b"L", "s3://b/100"))
    assert begun == CheckpointBeginResult(r.index)
    cid = r.index
    assert r.do(s, CheckpointShardDone("j", round_, token, cid, 2)) == ShardDoneResult(cid, 1, 3)
    assert r.do(s, CheckpointShardDone("j", round_, token, cid, 2)) == ShardDoneResult(cid, 1, 3)
    assert r.do(s, CheckpointCommit("j", round_, token, cid)) == CheckpointIncomplete(
        "j", cid, (0, 1)
    )
    assert isinstance(r.do(s, CheckpointShardDone("j", round_, token, cid, 3)), InvalidCommand)
    r.do(s, CheckpointShardDone("j", round_, token, cid, 0))
    r.do(s, CheckpointShardDone("j", round_, token, cid, 1))
    r.time_ms = 9_000
    info = CheckpointInfo(cid, 100, round_, 3, b"L", "s3://b/100", 9_000)
    assert r.do(s, CheckpointCommit("j", round_, token, cid)) == CheckpointCommitResult(info, ())
    assert registry.latest() == info
    assert r.do(s, CheckpointCommit("j", round_, token, cid)) == CheckpointNotFound("j", cid)


def test_only_the_last_k_are_kept_and_the_retired_are_reported() -> None:
    r, s, round_, token = active(keep=2)
    first = checkpoint(r, s, round_, token, 1)
    second = checkpoint(r, s, round_, token, 2)
    begun = r.do(s, CheckpointBegin("j", round_, token, 3, 3, b"", "u"))
    assert isinstance(begun, CheckpointBeginResult)
    for rank in range(3):
        r.do(s, CheckpointShardDone("j", round_, token, begun.checkpoint_id, rank))
    result = r.do(s, CheckpointCommit("j", round_, token, begun.checkpoint_id))
    assert isinstance(result, CheckpointCommitResult) and result.retired == (first,)
    assert r.job().checkpoints.committed == [second, result.checkpoint]


def test_stale_rounds_and_tokens_are_refused() -> None:
    r, s, round_, token = active()
    begun = r.do(s, CheckpointBegin("j", round_, token, 1, 3, b"", "u"))
    assert isinstance(begun, CheckpointBeginResult)
    cid = begun.checkpoint_id
    assert r.do(s, CheckpointShardDone("j", round_, token - 1, cid, 0)) == StaleToken(
        "j", round_, token - 1, token
    )
    assert isinstance(r.do(s, CheckpointCommit("j", round_ - 1, token, cid)), StaleRound)
    assert r.do(s, CheckpointAbort("nope", round_, token, cid)) == JobNotFound("nope")
    assert r.do(s, CheckpointAbort("j", round_, token, cid)) == CheckpointAbortResult(cid)
    assert r.do(s, CheckpointAbort("j", round_, token, cid)) == CheckpointNotFound("j", cid)
    mismatch = r.do(s, CheckpointBegin("j", round_, token, 1, 2, b"", "u"))
    assert isinstance(mismatch, InvalidCommand) and "not the round's 3" in mismatch.message


def test_a_zombie_cannot_commit_after_its_round_ended() -> None:
    r, s, round_, token = active()
    committed = checkpoint(r, s, round_, token, 10)
    begun = r.do(s, CheckpointBegin("j", round_, token, 20, 3, b"", "u"))
    assert isinstance(begun, CheckpointBeginResult)
    for rank in range(3):
        r.do(s, CheckpointShardDone("j", round_, token, begun.checkpoint_id, rank))
    # Rank 0 pauses past its detection: the round ends before the commit arrives.
    r.fail(r.job().round.members[0].participant_id)
    assert r.job().checkpoints.pending == {}  # dropped with the round
    late = r.do(s, CheckpointCommit("j", round_, token, begun.checkpoint_id))
    assert isinstance(late, StaleRound) and "has ended" in late.message
    # The next round, even with the old round number's token, is fenced by its own token.
    r.workers(1, replace(CONFIG, min_nodes=3, last_call_ms=0, keep_checkpoints=3))
    new_round = r.job().round
    assert new_round.number == round_ + 1
    assert r.do(s, CheckpointCommit("j", new_round.number, token, begun.checkpoint_id)) == (
        StaleToken("j", new_round.number, token, new_round.fencing_token)
    )
    assert r.job().checkpoints.latest() == committed


def test_pending_checkpoints_are_bounded() -> None:
    r, s, round_, token = active(Limits(rendezvous=RendezvousLimits(max_pending_checkpoints=1)))
    assert isinstance(
        r.do(s, CheckpointBegin("j", round_, token, 1, 3, b"", "u")), CheckpointBeginResult
    )
    assert r.do(s, CheckpointBegin("j", round_, token, 2, 3, b"", "u")) == LimitExceeded(
        "pending checkpoints per job", 1
    )


def test_pending_and_committed_checkpoints_survive_a_snapshot_byte_for_byte() -> None:
    r, s, round_, token = active()
    checkpoint(r, s, round_, token, 5)
    begun = r.do(s, CheckpointBegin("j", round_, token, 6, 3, b"L", "u"))
    assert isinstance(begun, CheckpointBeginResult)
    r.do(s, CheckpointShardDone("j", round_, token, begun.checkpoint_id, 1))
    image = r.sm.snapshot()
    restored = StateMachine()
    restored.restore(image)
    assert restored.snapshot() == image
    registry = restored.rendezvous.jobs["j"].checkpoints
    assert registry.pending[begun.checkpoint_id].reported == {1}
    assert registry.latest() == r.job().checkpoints.latest()
