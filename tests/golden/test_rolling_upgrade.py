"""A rolling upgrade: today's member opens the data directory an older one left (golden
``data/``: WAL segments and a snapshot file) and replays it to the state that release had;
and records cross versions in both directions (a newer reader fills defaults into an older
record, an older reader refuses a newer one in one clear line)."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgpack
import pytest

from rallypoint.coordinator.member_table import MemberAddress, decode_app_snapshot
from rallypoint.coordinator.node.proposals import unwrap
from rallypoint.coordinator.state.codec import StateCodecError
from rallypoint.coordinator.state.jobs import (
    DrainedDomain,
    JobConfig,
    MemorySnapshotInfo,
    RoundState,
)
from rallypoint.coordinator.state.machine import SNAPSHOT_FORMAT, StateMachine
from rallypoint.raft.codec import decode_conf_change
from rallypoint.raft.storage.disk_storage import DiskStorage
from rallypoint.raft.storage.snapshotter import decode_snapshot_file, encode_snapshot_file
from rallypoint.raft.storage.wal import WAL
from rallypoint.raft.types import ConfChangeType, Entry, EntryType, HardState, Index, Term

from .formats import DATA, DATA_SEGMENT_SIZE_BYTES, ENTRY_HEADER, SNAPSHOTS

BLOB = bytes(range(256)) + b"golden" * 20  # generate.py's blob values


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A copy of the golden data directory (opening a WAL may repair and preallocate it)."""
    target = tmp_path / "data"
    shutil.copytree(DATA, target)
    return target


def apply_entries(machine: StateMachine, entries: list[Entry]) -> None:
    """What a member's apply loop does with committed entries (coordinator/node/driver.py)."""
    for entry in entries:
        if entry.type is EntryType.CONF_CHANGE:
            change = decode_conf_change(entry.data)
            assert [c.type for c in change.changes] == [ConfChangeType.ADD_NODE]
        elif not entry.data:
            machine.apply(entry.index, b"")
        else:
            proposer_id, proposal_id, payload = unwrap(entry.data)
            assert (proposer_id, proposal_id) == (1, entry.index)
            machine.apply(entry.index, payload)


def open_and_replay(data_dir: Path) -> tuple[DiskStorage, StateMachine]:
    """Restart as a member does: the newest snapshot, then the log after it."""
    storage = DiskStorage.open(str(data_dir), segment_size_bytes=DATA_SEGMENT_SIZE_BYTES)
    snapshot = storage.snapshot()
    members, state = decode_app_snapshot(snapshot.data)
    assert members.get(2) == MemberAddress("10.0.0.2:7001", "10.0.0.2:7000")
    machine = StateMachine()
    machine.restore(state)
    commit = storage.hard_state.commit
    apply_entries(machine, storage.entries(Index(snapshot.metadata.index + 1), Index(commit + 1)))
    return storage, machine


def test_todays_member_replays_an_older_data_directory_to_its_state(data_dir: Path) -> None:
    storage, machine = open_and_replay(data_dir)
    try:
        assert storage.hard_state == HardState(Term(2), 1, Index(26))
        snapshot = storage.snapshot().metadata
        assert (snapshot.index, snapshot.term) == (9, 2)
        assert snapshot.conf_state.voters == (1, 2, 3) and snapshot.conf_state.learners == (4,)
        assert (storage.first_index(), storage.last_index()) == (10, 26)
    finally:
        storage.close()
    assert machine.applied_index == 26
    assert machine.get(b"config/lr") is None  # put at 4, deleted at 13
    leader = machine.get(b"leader")
    assert leader is not None and (leader.value, leader.lease_id) == (b"worker-0", 5)
    steps = machine.get(b"steps")
    assert steps is not None and steps.value == b"42"  # added 41 at 7, set 42 at 26
    for i in range(12):
        blob = machine.get(b"blob/%d" % i)
        assert blob is not None and blob.value == BLOB
    assert machine.lease_info(5) is not None
    assert machine.session_info(3) is not None and machine.session_info(10) is not None
    job = machine.rendezvous.jobs["resnet"]
    assert job.config == JobConfig(min_nodes=2, max_nodes=2)
    assert job.round.state is RoundState.ACTIVE
    assert [(seat.participant_id, seat.rank) for seat in job.round.members] == [(9, 0), (11, 1)]
    assert job.store is not None and job.store.get(b"master_addr") == b"10.0.0.1:29500"


def test_restoring_the_snapshot_and_replaying_the_whole_log_agree(data_dir: Path) -> None:
    storage, from_snapshot = open_and_replay(data_dir)
    storage.close()
    wal, records = WAL.open(str(data_dir / "wal"), segment_size_bytes=DATA_SEGMENT_SIZE_BYTES)
    wal.close()
    entries = [record.value for record in records if isinstance(record.value, Entry)]
    assert [entry.index for entry in entries] == list(range(1, 27))
    from_log = StateMachine()
    apply_entries(from_log, entries)
    assert from_log.snapshot() == from_snapshot.snapshot()


def test_the_snapshot_file_and_its_state_encode_as_they_were_written() -> None:
    [path] = (DATA / "snap").iterdir()
    data = path.read_bytes()
    snapshot = decode_snapshot_file(str(path), data)
    assert b"".join(encode_snapshot_file(snapshot)) == data
    _, state = decode_app_snapshot(snapshot.data)
    machine = StateMachine()
    machine.restore(state)
    assert machine.applied_index == 9
    if msgpack.unpackb(state)[0] in (4, SNAPSHOT_FORMAT):  # formats written today: canonical
        assert machine.snapshot() == state


def test_a_format_6_snapshot_restores_its_memory_snapshot_and_encodes_the_same() -> None:
    # generate.py's FORMAT6_LOG: a job of two workers, a disk checkpoint committed at 8 and
    # a memory snapshot at 9, in round 1 (token 4).
    data = (SNAPSHOTS / "format6-snapshot.msgpack").read_bytes()
    assert msgpack.unpackb(data)[0] == 6
    machine = StateMachine()
    machine.restore(data)
    assert machine.applied_index == 9
    registry = machine.rendezvous.jobs["resnet"].checkpoints
    disk = registry.latest()
    assert disk is not None and (disk.checkpoint_id, disk.step, disk.uri) == (
        5,
        100,
        "file:///ckpt/100",
    )
    assert registry.latest_memory_snapshot() == MemorySnapshotInfo(
        9, 101, 1, 2, b"dp2", b"\x01rank0@h1,rank1@h0", 1_764_000_000_900
    )
    assert machine.snapshot() == data


def test_a_format_7_snapshot_restores_its_drained_domain_and_shaped_job_and_encodes_the_same() -> (
    None
):
    # generate.py's FORMAT7_LOG: a shaped job (units of 2, hosts a, b seated, c waiting),
    # a-0 failed (round 2 JOINING, held), host c drained.
    data = (SNAPSHOTS / "format7-snapshot.msgpack").read_bytes()
    assert msgpack.unpackb(data)[0] == 7
    machine = StateMachine()
    machine.restore(data)
    assert machine.applied_index == 6
    assert machine.rendezvous.drained_domains() == [
        DrainedDomain("c", "ecc errors", 1_764_000_000_060)
    ]
    job = machine.rendezvous.jobs["llm"]
    assert (job.config.unit_size, job.config.domain_size, job.config.units_within_domains) == (
        2, 2, True,
    )  # fmt: skip
    assert job.round.number == 2 and job.round.state is RoundState.JOINING
    assert job.round.hold_until_ms == 1_764_000_000_050 + 2 * job.config.heartbeat_interval_ms
    assert {p.name: p.domain for p in job.participants.values()} == {
        "a-1": "a", "b-0": "b", "b-1": "b", "c-0": "c", "c-1": "c",
    }  # fmt: skip
    assert machine.snapshot() == data


def append_entry(data_dir: Path, envelope: list[object]) -> None:
    """Write ``envelope`` (an Envelope's msgpack form) as committed entry 27, as a member
    whose leader proposed it would (session 3, sequence 10)."""
    storage = DiskStorage.open(str(data_dir), segment_size_bytes=DATA_SEGMENT_SIZE_BYTES)
    data = ENTRY_HEADER.pack(1, 1, 27) + msgpack.packb(envelope)
    storage.persist(HardState(Term(2), 1, Index(27)), [Entry(Term(2), Index(27), data=data)])
    storage.close()


def test_a_newer_member_fills_defaults_into_an_older_entry(data_dir: Path) -> None:
    # JobConfig as a release before hang and straggler detection wrote it: its first 11
    # fields. Today's member reads the fields it lacks as their defaults.
    older_config = [340, 2, 3, 0, 600_000, 100, 8_000, 100, 50, 0, False, 3]
    append_entry(data_dir, [20, 3, 10, 0, 1_764_000_002_700, [40, "resnet", older_config]])
    storage, machine = open_and_replay(data_dir)
    storage.close()
    assert machine.rendezvous.jobs["resnet"].config == JobConfig(min_nodes=2, max_nodes=3)


def test_an_older_member_refuses_an_entry_a_newer_one_wrote_naming_both_versions(
    data_dir: Path,
) -> None:
    # A later release appends a field to Put and uses it: its leader writes the entry below
    # into every member's log. This (older) build must stop with a clear reason, never guess.
    future_put = [1, b"k", b"v", 0, None, False, False, 3]
    append_entry(data_dir, [20, 3, 10, 0, 1_764_000_002_700, future_put])
    with pytest.raises(StateCodecError) as refused:
        open_and_replay(data_dir)
    assert str(refused.value) == (
        "Envelope.command: Put record (tag 1) has 7 fields: it was written by a newer version "
        "of rallypoint; this build reads Put up to format version 2 (6 fields); upgrade this "
        "member"
    )
