"""DiskStorage: restart gives back what MemoryStorage held; snapshots, compaction, fallback."""

from __future__ import annotations

import logging
import os
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rallypoint.raft import Config, RawNode, StateType
from rallypoint.raft.log_storage import MemoryStorage
from rallypoint.raft.storage.disk_storage import DiskStorage, PersistRequest, SnapshotPolicy
from rallypoint.raft.storage.snapshotter import SnapshotCorruptionError, Snapshotter
from rallypoint.raft.storage.wal import WalCorruptionError
from rallypoint.raft.types import (
    ConfState,
    Entry,
    HardState,
    Index,
    NodeId,
    Snapshot,
    SnapshotMetadata,
    Term,
)

CONF = ConfState(voters=(NodeId(1), NodeId(2), NodeId(3)))


def no_fsync(fd: int) -> None:
    """For tests that never crash: durability is not what they check."""


def open_storage(path: Path | str, retain: int = 2) -> DiskStorage:
    return DiskStorage.open(
        str(path),
        segment_size_bytes=1024,
        policy=SnapshotPolicy(entries_per_snapshot=10, retain_snapshots=retain),
        fsync=no_fsync,
    )


def ents(lo: int, hi: int, term: int = 1) -> list[Entry]:
    return [Entry(Term(term), Index(i), data=b"e%d" % i) for i in range(lo, hi + 1)]


def contents(storage: DiskStorage | MemoryStorage) -> tuple[object, ...]:
    first, last = storage.first_index(), storage.last_index()
    entries = storage.entries(first, Index(last + 1)) if last >= first else []
    return (
        first,
        last,
        storage.term(Index(first - 1)),
        entries,
        storage.initial_state(),
        storage.snapshot(),
    )


def as_restarted(model: MemoryStorage) -> MemoryStorage:
    """What a restart holds: the snapshot, the entries after it, the hard state."""
    restarted = MemoryStorage()
    snapshot = model.snapshot()
    if not snapshot.is_empty():
        restarted.apply_snapshot(snapshot)
    after = snapshot.metadata.index + 1
    if model.last_index() >= after:
        restarted.append(model.entries(Index(after), Index(model.last_index() + 1)))
    restarted.set_hard_state(model.hard_state)
    return restarted


def next_hard_state(old: HardState, term: int, vote_seed: int, commit: int) -> HardState:
    """A hard state a node could persist after ``old``: the vote changes only with the term."""
    vote = NodeId(vote_seed % 4) if term > old.term or old.vote == 0 else old.vote
    return HardState(Term(term), vote, Index(commit))


OPS = st.lists(
    st.tuples(
        st.sampled_from(["append", "append", "append", "hard", "snap", "compact", "install"])
        | st.sampled_from(["restart", "batch"]),
        st.integers(0, 6),
        st.integers(0, 6),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_restart_equals_memory_storage_under_random_operations(
    ops: list[tuple[str, int, int]],
) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        disk = open_storage(data_dir)
        model = MemoryStorage()
        term = 1
        try:
            for kind, a, b in ops:
                snap_index = model.snapshot().metadata.index
                last = model.last_index()
                if kind in ("append", "batch"):
                    term += a % 2
                    start = max(snap_index + 1, model.first_index(), last + 1 - a)
                    new = ents(start, start + b, term)
                    hs = next_hard_state(model.hard_state, term, a, min(last, start))
                    if kind == "batch":
                        half = len(new) // 2
                        disk.persist_batch(
                            [
                                PersistRequest(hs, tuple(new[:half])),
                                PersistRequest(entries=tuple(new[half:])),
                            ]
                        )
                    else:
                        disk.persist(hs, new)
                    model.append(new)
                    model.set_hard_state(hs)
                elif kind == "hard":
                    term += a % 2
                    hs = next_hard_state(model.hard_state, term, b, min(last, b))
                    disk.persist(hs, [])
                    model.set_hard_state(hs)
                elif kind == "snap" and model.hard_state.commit > snap_index:
                    # Of committed entries only, as a member snapshots what it applied
                    # (write_snapshot writes the snapshot's index as committed).
                    commit = model.hard_state.commit
                    index = Index(snap_index + 1 + (a * 7 + b) % (commit - snap_index))
                    data = b"state@%d" % index
                    assert disk.create_snapshot(index, CONF, data) == model.create_snapshot(
                        index, CONF, data
                    )
                elif kind == "compact" and snap_index >= model.first_index():
                    index = Index(model.first_index() + a % (snap_index - model.first_index() + 1))
                    disk.compact(index)
                    model.compact(index)
                elif kind == "install":
                    index = Index(max(snap_index + 1, last - 3 + a + b))
                    term += 1
                    snapshot = Snapshot(b"installed", SnapshotMetadata(CONF, index, Term(term)))
                    disk.apply_snapshot(snapshot)
                    model.apply_snapshot(snapshot)
                elif kind == "restart":
                    disk.close()
                    disk = open_storage(data_dir)
                    model = as_restarted(model)
                assert contents(disk) == contents(model), kind
            disk.close()
            disk = open_storage(data_dir)
            assert contents(disk) == contents(as_restarted(model))
        finally:
            disk.close()


def test_group_commit_one_fsync_per_batch(tmp_path: Path) -> None:
    calls: list[int] = []
    disk = DiskStorage.open(str(tmp_path), fsync=lambda fd: calls.append(fd))
    calls.clear()
    batch = [
        PersistRequest(HardState(Term(1), NodeId(1), Index(i - 1)), tuple(ents(i, i)))
        for i in range(1, 11)
    ]
    disk.persist_batch(batch)
    assert len(calls) == 1
    assert disk.last_index() == 10 and disk.hard_state.commit == 9
    disk.close()


def test_term_or_vote_going_backwards_is_refused_before_writing(tmp_path: Path) -> None:
    disk = open_storage(tmp_path)
    disk.persist(HardState(Term(3), NodeId(2), Index(0)), ents(1, 2, 3))
    with pytest.raises(AssertionError, match="backwards"):
        disk.persist_batch(
            [PersistRequest(entries=tuple(ents(3, 3, 3))), PersistRequest(HardState(Term(2)))]
        )
    with pytest.raises(AssertionError, match="backwards"):
        disk.persist(HardState(Term(3), NodeId(1), Index(0)), [])
    disk.close()
    disk = open_storage(tmp_path)
    assert disk.last_index() == 2 and disk.hard_state == HardState(Term(3), NodeId(2), Index(0))
    disk.close()


def build_compacted(path: Path, retain: int) -> MemoryStorage:
    """Entries 1..80 with snapshots at 20 and 50, compacted; returns the model."""
    disk = open_storage(path, retain)
    model = MemoryStorage()
    for lo in range(1, 81, 10):
        disk.persist(HardState(Term(1), NodeId(1), Index(lo - 1)), ents(lo, lo + 9))
        model.append(ents(lo, lo + 9))
    model.set_hard_state(HardState(Term(1), NodeId(1), Index(70)))
    for index in (20, 50):
        disk.create_snapshot(Index(index), CONF, b"s%d" % index)
        model.create_snapshot(Index(index), CONF, b"s%d" % index)
        disk.compact(Index(index))
        model.compact(Index(index))
    disk.close()
    return model


def test_compaction_removes_segments_and_restart_is_equal(tmp_path: Path) -> None:
    model = build_compacted(tmp_path, retain=1)
    wal_files = sorted((tmp_path / "wal").glob("*.wal"))
    assert wal_files[0].name[:16] != "0" * 16  # a prefix of segments was deleted
    assert [p.name for p in (tmp_path / "snap").iterdir()] == [
        "0000000000000001-0000000000000032.snap"
    ]
    disk = open_storage(tmp_path, retain=1)
    assert contents(disk) == contents(as_restarted(model))
    disk.close()


def test_corrupt_newest_snapshot_falls_back_to_the_older_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = build_compacted(tmp_path, retain=2)
    newest = tmp_path / "snap" / "0000000000000001-0000000000000032.snap"
    newest.write_bytes(newest.read_bytes()[:-3] + b"\0\0\0")
    with caplog.at_level(logging.WARNING):
        disk = open_storage(tmp_path)
    assert "fell back" in caplog.text
    assert disk.snapshot().metadata.index == 20
    assert disk.first_index() == 21 and disk.entries(Index(21), Index(81)) == ents(21, 80)
    assert disk.hard_state == model.hard_state
    disk.close()


def test_no_verifying_snapshot_refuses_to_start(tmp_path: Path) -> None:
    build_compacted(tmp_path, retain=1)
    (only,) = (tmp_path / "snap").iterdir()
    data = bytearray(only.read_bytes())
    data[20] ^= 4
    only.write_bytes(bytes(data))
    with pytest.raises(SnapshotCorruptionError) as info:
        open_storage(tmp_path, retain=1)
    assert info.value.path == str(only)


def test_missing_snapshot_with_a_compacted_log_refuses_to_start(tmp_path: Path) -> None:
    build_compacted(tmp_path, retain=1)
    for snap in (tmp_path / "snap").iterdir():
        os.unlink(snap)
    with pytest.raises(WalCorruptionError, match="in no file"):
        open_storage(tmp_path, retain=1)


def test_snapshot_file_without_a_wal_marker_is_ignored(tmp_path: Path) -> None:
    disk = open_storage(tmp_path)
    disk.persist(HardState(Term(1), NodeId(1), Index(5)), ents(1, 10))
    disk.close()
    # A crash between writing an installed snapshot's file and logging its marker.
    Snapshotter(str(tmp_path / "snap")).save(
        Snapshot(b"x", SnapshotMetadata(CONF, Index(100), Term(2)))
    )
    disk = open_storage(tmp_path)
    assert disk.snapshot().is_empty() and disk.last_index() == 10
    disk.close()


def test_installed_snapshot_replaces_the_log_across_restart(tmp_path: Path) -> None:
    disk = open_storage(tmp_path)
    disk.persist(HardState(Term(1), NodeId(1), Index(5)), ents(1, 300))
    snapshot = Snapshot(b"leader state", SnapshotMetadata(CONF, Index(200), Term(2)))
    disk.persist(HardState(Term(2), NodeId(0), Index(200)), [], snapshot)
    assert (disk.first_index(), disk.last_index()) == (201, 200)
    disk.close()
    disk = open_storage(tmp_path)
    assert (disk.first_index(), disk.last_index()) == (201, 200)
    assert disk.snapshot() == snapshot and disk.initial_state()[1] == CONF
    disk.persist(HardState(), ents(201, 203, 2))
    disk.close()
    disk = open_storage(tmp_path)
    assert disk.entries(Index(201), Index(204)) == ents(201, 203, 2)
    disk.close()


def test_should_snapshot_follows_the_policy(tmp_path: Path) -> None:
    disk = open_storage(tmp_path)
    disk.persist(HardState(Term(1), NodeId(1), Index(30)), ents(1, 30))
    assert not disk.should_snapshot(Index(9))
    assert disk.should_snapshot(Index(10))
    disk.create_snapshot(Index(10), CONF, b"s")
    assert not disk.should_snapshot(Index(19)) and disk.should_snapshot(Index(20))
    disk.close()


def test_fsync_only_for_readies_that_must_sync(tmp_path: Path) -> None:
    """The Ready contract's step 2 with the real core: a Ready whose only change is the
    commit index is written without an fsync; one with entries or a new term or vote is
    fsynced."""
    fsyncs: list[int] = []
    disk = DiskStorage.open(str(tmp_path), fsync=fsyncs.append)
    bootstrap = Snapshot(b"", SnapshotMetadata(ConfState(voters=(NodeId(1),)), Index(1), Term(1)))
    disk.persist_batch([PersistRequest(HardState(Term(1), NodeId(0), Index(1)), (), bootstrap)])
    node = RawNode(Config(id=NodeId(1), storage=disk, rng=random.Random(1), applied=Index(1)))
    node.campaign()
    outcomes: list[tuple[bool, int]] = []
    proposed = False
    while node.has_ready():
        rd = node.ready()
        fsyncs.clear()
        disk.persist_batch([PersistRequest(rd.hard_state, rd.entries, rd.snapshot, rd.must_sync)])
        outcomes.append((rd.must_sync, len(fsyncs)))
        node.advance(rd)
        if not proposed and node.basic_status().soft_state.raft_state is StateType.LEADER:
            node.propose(b"x")
            proposed = True
    assert all((count > 0) == must_sync for must_sync, count in outcomes), outcomes
    # Elected (term and vote), the no-op and the proposal (entries), and at least one Ready
    # that only moved the commit index, which was not synced.
    assert any(must_sync for must_sync, _ in outcomes)
    assert (False, 0) in outcomes
    assert disk.hard_state.commit == disk.last_index() == 3
    disk.close()


def test_a_held_commit_index_goes_to_the_wal_with_the_next_entries(tmp_path: Path) -> None:
    """hold_commit keeps a commit-only hard state in memory, writing nothing; the next write
    that carries the newest hard state puts it in the WAL."""
    disk = open_storage(tmp_path)
    disk.persist(HardState(Term(2), NodeId(1), Index(0)), ents(1, 3, 2))
    wal_bytes = sum(p.stat().st_size for p in (tmp_path / "wal").glob("*.wal"))
    disk.hold_commit(HardState(Term(2), NodeId(1), Index(3)))
    assert disk.hard_state.commit == 3
    assert sum(p.stat().st_size for p in (tmp_path / "wal").glob("*.wal")) == wal_bytes
    with pytest.raises(AssertionError, match="moves more than the commit"):
        disk.hold_commit(HardState(Term(3), NodeId(1), Index(3)))
    with pytest.raises(AssertionError, match="goes back"):
        disk.hold_commit(HardState(Term(2), NodeId(1), Index(2)))
    disk.persist(disk.hard_state, ents(4, 4, 2))
    disk.close()
    disk = open_storage(tmp_path)
    assert disk.hard_state == HardState(Term(2), NodeId(1), Index(3))
    disk.close()


def test_a_snapshot_past_the_written_commit_index_raises_it(tmp_path: Path) -> None:
    """A snapshot of state applied under a commit index held only in memory: the WAL's commit
    index is raised to the snapshot's, so the core restarts (it refuses a commit index below
    its snapshot's) with the snapshot and the entries after it."""
    disk = open_storage(tmp_path)
    disk.persist(HardState(Term(2), NodeId(1), Index(2)), ents(1, 8, 2))
    disk.hold_commit(HardState(Term(2), NodeId(1), Index(6)))
    disk.create_snapshot(Index(5), CONF, b"s5")
    disk.close()
    disk = open_storage(tmp_path)
    assert disk.hard_state == HardState(Term(2), NodeId(1), Index(5))
    assert disk.snapshot().metadata.index == 5 and disk.last_index() == 8
    node = RawNode(Config(id=NodeId(1), storage=disk, rng=random.Random(1), applied=Index(5)))
    assert node.basic_status().hard_state.commit == 5
    disk.close()
