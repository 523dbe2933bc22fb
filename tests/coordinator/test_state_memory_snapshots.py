"""A job's latest in-memory snapshot: committed, fenced by round and token like a disk
checkpoint (a zombie cannot record one), checked against the round's world size and the
limits, replaced by a later commit, kept across round ends, and carried in the state
machine's snapshot (format 6 only while some job holds one)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rallypoint.coordinator.state import codec
from rallypoint.coordinator.state.commands import (
    CheckpointBegin,
    Envelope,
    Join,
    JoinBatch,
    MemorySnapshotCommit,
    encode_envelope,
)
from rallypoint.coordinator.state.errors import (
    InvalidCommand,
    JobNotFound,
    LimitExceeded,
    StaleRound,
    StaleToken,
)
from rallypoint.coordinator.state.jobs import MemorySnapshotInfo, RendezvousLimits
from rallypoint.coordinator.state.machine import SNAPSHOT_FORMAT, Limits, StateMachine
from rallypoint.coordinator.state.results import (
    CheckpointBeginResult,
    JoinBatchResult,
    MemorySnapshotCommitResult,
)

from .job_replica import CONFIG, JobReplica
from .test_state_checkpoints import active, checkpoint

THREE = replace(CONFIG, min_nodes=3, last_call_ms=0, keep_checkpoints=3)


def commit(
    r: JobReplica, s: int, round_: int, token: int, step: int, **fields: object
) -> MemorySnapshotCommitResult:
    values: dict[str, object] = {"world_size": 3, "layout": b"L", "placement": b"P"}
    values.update(fields)
    result = r.do(s, MemorySnapshotCommit("j", round_, token, step, **values))  # type: ignore[arg-type]
    assert isinstance(result, MemorySnapshotCommitResult), result
    return result


def test_a_commit_records_the_snapshot_under_its_raft_index_and_time() -> None:
    r, s, round_, token = active()
    assert r.job().checkpoints.latest_memory_snapshot() is None
    r.time_ms = 7_000
    result = commit(r, s, round_, token, 41, layout=b"dp3", placement=b"\x01rank0@host1")
    expected = MemorySnapshotInfo(r.index, 41, round_, 3, b"dp3", b"\x01rank0@host1", 7_000)
    assert result == MemorySnapshotCommitResult(expected)
    assert r.job().checkpoints.latest_memory_snapshot() == expected
    # Disk checkpoints are a separate record: neither replaces the other.
    assert r.job().checkpoints.latest() is None
    disk = checkpoint(r, s, round_, token, 40)
    assert r.job().checkpoints.latest() == disk
    assert r.job().checkpoints.latest_memory_snapshot() == expected


def test_a_later_commit_replaces_the_snapshot_whatever_its_step() -> None:
    r, s, round_, token = active()
    first = commit(r, s, round_, token, 10).snapshot
    second = commit(r, s, round_, token, 11, placement=b"moved").snapshot
    assert second.snapshot_id > first.snapshot_id
    assert r.job().checkpoints.latest_memory_snapshot() == second
    # Newest by commit, not by step: a world that restarted from an older disk checkpoint
    # has a newer state at a lower step.
    third = commit(r, s, round_, token, 3).snapshot
    assert r.job().checkpoints.latest_memory_snapshot() == third


def test_a_stale_round_a_stale_token_or_an_unknown_job_is_refused() -> None:
    r, s, round_, token = active()
    kept = commit(r, s, round_, token, 5).snapshot
    stale_token = r.do(s, MemorySnapshotCommit("j", round_, token - 1, 6, 3, b"", b""))
    assert stale_token == StaleToken("j", round_, token - 1, token)
    stale_round = r.do(s, MemorySnapshotCommit("j", round_ - 1, token, 6, 3, b"", b""))
    assert isinstance(stale_round, StaleRound) and "has ended" in stale_round.message
    future = r.do(s, MemorySnapshotCommit("j", round_ + 1, token, 6, 3, b"", b""))
    assert isinstance(future, StaleRound) and "does not exist yet" in future.message
    nope = r.do(s, MemorySnapshotCommit("nope", round_, token, 6, 3, b"", b""))
    assert nope == JobNotFound("nope")
    assert r.job().checkpoints.latest_memory_snapshot() == kept


def test_the_world_size_must_be_the_rounds_and_the_sizes_are_bounded() -> None:
    limits = Limits(rendezvous=RendezvousLimits(max_layout_bytes=4, max_placement_bytes=6))
    r, s, round_, token = active(limits)
    mismatch = r.do(s, MemorySnapshotCommit("j", round_, token, 1, 2, b"", b""))
    assert isinstance(mismatch, InvalidCommand)
    assert mismatch.message == "world_size 2 is not the round's 3"
    negative = r.do(s, MemorySnapshotCommit("j", round_, token, -1, 3, b"", b""))
    assert isinstance(negative, InvalidCommand) and "step must be >= 0" in negative.message
    layout = r.do(s, MemorySnapshotCommit("j", round_, token, 1, 3, b"x" * 5, b""))
    assert layout == LimitExceeded("memory snapshot layout bytes", 4)
    placement = r.do(s, MemorySnapshotCommit("j", round_, token, 1, 3, b"", b"x" * 7))
    assert placement == LimitExceeded("memory snapshot placement bytes", 6)
    assert r.job().checkpoints.latest_memory_snapshot() is None
    # At the bounds exactly: recorded.
    commit(r, s, round_, token, 1, layout=b"x" * 4, placement=b"y" * 6)


def test_the_snapshot_survives_the_round_and_a_zombie_cannot_replace_it() -> None:
    r, s, round_, token = active()
    committed = commit(r, s, round_, token, 20).snapshot
    # Rank 0 pauses past its failure detection: the round ends without it.
    r.fail(r.job().round.members[0].participant_id)
    assert r.job().checkpoints.latest_memory_snapshot() == committed
    # The zombie wakes up and tries to record the step it had in memory.
    late = r.do(s, MemorySnapshotCommit("j", round_, token, 21, 3, b"L", b"P"))
    assert isinstance(late, StaleRound) and "has ended" in late.message
    # The next round (a newcomer replaces the failed rank) reads the same snapshot ...
    r.workers(1, THREE)
    new_round = r.job().round
    assert new_round.number == round_ + 1 and len(new_round.members) == 3
    assert r.job().checkpoints.latest_memory_snapshot() == committed
    # ... and the zombie's old token is no good in it either.
    old_token = r.do(s, MemorySnapshotCommit("j", new_round.number, token, 21, 3, b"", b""))
    assert old_token == StaleToken("j", new_round.number, token, new_round.fencing_token)
    newer = commit(r, s, new_round.number, new_round.fencing_token, 22).snapshot
    assert newer.round == new_round.number
    assert r.job().checkpoints.latest_memory_snapshot() == newer


def test_a_retried_commit_answers_once_and_records_once() -> None:
    r, s, round_, token = active()
    command = MemorySnapshotCommit("j", round_, token, 9, 3, b"L", b"P")
    first = r.apply(command, s, 50)
    index = r.index
    r.time_ms += 500
    again = r.apply(command, s, 50)
    assert first == again and isinstance(first, MemorySnapshotCommitResult)
    assert r.job().checkpoints.latest_memory_snapshot() == first.snapshot
    assert first.snapshot.snapshot_id == index


# ------------------------------------------------------------------ snapshots of the machine


def test_the_machine_snapshot_is_format_4_until_a_memory_snapshot_is_committed() -> None:
    r, s, round_, token = active()
    checkpoint(r, s, round_, token, 5)
    assert isinstance(
        r.do(s, CheckpointBegin("j", round_, token, 6, 3, b"", "u")), CheckpointBeginResult
    )
    before = r.sm.snapshot()
    assert codec.unpack(before)[0] == 4  # as a release without memory snapshots wrote it
    committed = commit(r, s, round_, token, 6).snapshot
    image = r.sm.snapshot()
    assert (
        codec.unpack(image)[0] == 6 == SNAPSHOT_FORMAT - 2
    )  # 7: a drained domain; 8: a cluster version
    restored = StateMachine()
    restored.restore(image)
    assert restored.snapshot() == image
    registry = restored.rendezvous.jobs["j"].checkpoints
    assert registry.latest_memory_snapshot() == committed
    assert registry.latest() == r.job().checkpoints.latest()
    assert registry.pending.keys() == r.job().checkpoints.pending.keys()


def test_a_snapshot_written_before_memory_snapshots_restores_without_one() -> None:
    r, s, round_, token = active()
    checkpoint(r, s, round_, token, 5)
    old = r.sm.snapshot()
    assert codec.unpack(old)[0] == 4
    restored = StateMachine()
    restored.restore(old)
    assert restored.rendezvous.jobs["j"].checkpoints.latest_memory_snapshot() is None
    assert restored.snapshot() == old
    # The restored member goes on exactly as the one that never stopped.
    envelope = Envelope(
        s, 99, 0, r.time_ms, MemorySnapshotCommit("j", round_, token, 6, 3, b"", b"")
    )
    answers = [m.apply(r.index + 1, encode_envelope(envelope)) for m in (r.sm, restored)]
    assert answers[0] == answers[1] and isinstance(answers[0], MemorySnapshotCommitResult)
    assert restored.snapshot() == r.sm.snapshot()


def test_an_older_format_carrying_a_memory_snapshot_is_refused_as_malformed() -> None:
    r, s, round_, token = active()
    commit(r, s, round_, token, 5)
    image = codec.unpack(r.sm.snapshot())
    image[0] = 5  # format 5 registries have two elements; this one has three
    with pytest.raises(codec.StateCodecError, match="malformed checkpoint registry"):
        StateMachine().restore(codec.pack(image))


def test_format_6_keeps_the_participant_id_high_water_mark() -> None:
    r = JobReplica()
    s = r.open()
    joined = r.do(s, JoinBatch("j", ("a", "b", "c"), (), THREE))
    assert isinstance(joined, JoinBatchResult)
    round_ = r.job().round
    high_water = r.sm.rendezvous.next_participant_id
    assert high_water and codec.unpack(r.sm.snapshot())[0] == 5
    commit(r, s, round_.number, round_.fencing_token, 1)
    image = r.sm.snapshot()
    assert codec.unpack(image)[0] == 6
    restored = StateMachine()
    restored.restore(image)
    assert restored.snapshot() == image
    assert restored.rendezvous.next_participant_id == high_water
    # Both hand out the same next participant id.
    join = Envelope(s, 99, 0, r.time_ms, Join("j", "d", b""))
    answers = [m.apply(r.index + 1, encode_envelope(join)) for m in (r.sm, restored)]
    assert answers[0] == answers[1]
