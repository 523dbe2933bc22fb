"""Write today's encodings into tests/golden; run by hand, never by the tests:

    PYTHONPATH=.pkgview .venv/bin/python -m tests.golden.generate

Only adds what is missing. A golden file, once committed, holds bytes that every later
version must read, so nothing here is ever rewritten: a new command, peer message or message
type gets its files, a record type's new format version gets a new command file and a new
entry in records.json, and everything already present is left as it is. Everything written is
deterministic (fixed values, fixed times), so running this twice on the same code writes the
same bytes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message as ProtoMessage

from rallypoint.coordinator.member_table import (
    ConfChangeContext,
    MemberAddress,
    MemberTable,
    encode_app_snapshot,
)
from rallypoint.coordinator.peer_auth import PeerKey
from rallypoint.coordinator.peer_session import OutboundSession
from rallypoint.coordinator.state import codec
from rallypoint.coordinator.state.commands import (
    Add,
    CheckpointAbort,
    CheckpointBegin,
    CheckpointCommit,
    CheckpointShardDone,
    CloseJob,
    CloseRound,
    ClusterVersion,
    Command,
    CompareAndSet,
    Configure,
    Delete,
    Drain,
    Envelope,
    Evict,
    Join,
    JoinBatch,
    LeaseExpire,
    LeaseGrant,
    LeaseRevoke,
    Leave,
    MemberFailed,
    MemorySnapshotCommit,
    OwnedSessionOpen,
    PruneJobs,
    Put,
    RoundTrained,
    SessionClose,
    SessionCommand,
    SessionKeepAlive,
    SessionOpen,
    StoreAdd,
    StoreCompareSet,
    StoreDelete,
    StoreSet,
    encode_envelope,
)
from rallypoint.coordinator.state.jobs import EndReason, JobConfig, LeaveOutcome
from rallypoint.coordinator.state.machine import StateMachine
from rallypoint.coordinator.state.values import Fence
from rallypoint.proto.peer.v1 import peer_pb2
from rallypoint.raft.codec import encode_conf_change, encode_message
from rallypoint.raft.storage.disk_storage import DiskStorage
from rallypoint.raft.types import (
    RESPONSE_MESSAGES,
    ConfChange,
    ConfChangeSingle,
    ConfChangeTransition,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Index,
    Message,
    MessageType,
    NodeId,
    Snapshot,
    SnapshotMetadata,
    Term,
)

from .formats import (
    DATA,
    DATA_SEGMENT_SIZE_BYTES,
    ENTRY_HEADER,
    GOLDEN,
    PEER,
    PEER_CHALLENGE,
    PEER_COUNTER,
    PEER_SECRET,
    PEER_V2,
    RAFT,
    RECORDS,
    REQUIRED,
    SNAPSHOTS,
    command_file,
    describe,
    not_applied,
    peer_v2_formats,
)

# ------------------------------------------------------------------ commands

# Every field away from its default, so decoding each one is checked.
CONFIG = JobConfig(
    min_nodes=2,
    max_nodes=8,
    last_call_ms=1_500,
    join_timeout_ms=120_000,
    heartbeat_interval_ms=250,
    phi_threshold_milli=9_500,
    phi_window=64,
    min_std_ms=75,
    acceptable_pause_ms=300,
    scale_up=True,
    keep_checkpoints=5,
    hang_factor_milli=3_000,
    hang_floor_ms=2_000,
    startup_timeout_ms=90_000,
    straggler_factor_milli=1_800,
    straggler_windows=4,
    straggler_window_ms=15_000,
)
# A lease's fencing token is its id (leases.py): a fence of lease 7 holds token 7, or the
# write is refused (StaleFence).
FENCE = Fence(lease_id=7, token=7)
# Each sample is applied in the state SETUP builds for it (``machine_for``) and must be
# applied or answered there, not refused (test_golden.py): ids name what SETUP made
# (session 5, lease 7, participant 17, round 3 with fencing token 44, checkpoint 45).
SAMPLES: list[Command] = [
    # Format 2 (keep_lease); lease_id keeps its default, since a put that keeps the key's
    # lease names none (format 1's file, 001-Put-v1, has lease 7).
    Put(b"golden/key", b"\x00value\xff", 0, FENCE, True, True),
    Delete(b"golden/", True, FENCE, True),
    # Exactly one comparison (more is InvalidCommand), so two fields hold their defaults.
    CompareAndSet(b"golden/cas", b"new", b"old", None, False, 7, FENCE),
    Add(b"golden/counter", -3, 7, FENCE),
    LeaseGrant(30_000),
    LeaseRevoke(7),
    LeaseExpire(7),
    ClusterVersion(2),
    SessionOpen(60_000),
    OwnedSessionOpen(60_000, "job:resnet"),
    SessionKeepAlive(),
    SessionClose(),
    Configure("resnet", CONFIG),
    Join("resnet", "worker-0", b"\x01meta", CONFIG, False, 0, "host-a"),
    JoinBatch(
        "resnet", ("worker-1", "worker-2"), (b"\x01m1", b""), CONFIG, False, ("host-a", "host-b")
    ),
    Leave("resnet", 17, LeaveOutcome.FAILED, "out of memory"),
    Evict("resnet", 17),
    CloseJob("resnet"),
    CloseRound("resnet", 3),
    MemberFailed("resnet", 17, 3, "phi 9.1 over 8.0", EndReason.STRAGGLER),
    RoundTrained("resnet", 3, "disk"),
    PruneJobs(86_400_000, 2, ("old-a", "old-b")),
    Drain("host-a", True, "ecc errors"),
    StoreSet("resnet", 3, 17, b"store/key", b"store value"),
    StoreAdd("resnet", 3, 17, b"store/counter", 5),
    StoreCompareSet("resnet", 3, 17, b"store/key", b"store value", b"next value"),
    StoreDelete("resnet", 3, 17, b"store/key"),
    CheckpointBegin("resnet", 3, 44, 1_000, 4, b"layout", "s3://bucket/ckpt/1000"),
    CheckpointShardDone("resnet", 3, 44, 45, 2),
    CheckpointCommit("resnet", 3, 44, 45),
    CheckpointAbort("resnet", 3, 44, 45),
    MemorySnapshotCommit("resnet", 3, 44, 1_001, 4, b"layout", b"\x01placement", True),
]
LEADER_TIME_MS = 1_764_000_000_000


def envelope_of(command: Command) -> Envelope:
    if isinstance(command, SessionCommand):
        return Envelope(5, 9, 8, LEADER_TIME_MS, command)
    if isinstance(command, SessionOpen):
        return Envelope(0, 0, 0, LEADER_TIME_MS, command)
    return Envelope(5, 0, 0, LEADER_TIME_MS, command)


# ------------------------------------------------------------------ a state for each command

# (index, session, sequence, command) of a log in which every sample is valid. Sessions are
# the indexes of their SessionOpen (3: the workers', 5: the samples'), the lease is 7,
# participant ids are join indexes. Job "resnet" runs CONFIG (min 2, max 8, last call 1.5 s,
# scale-up): round 1 (12, 13, 17) closes at 20 and ends by a scale-up when 30 joins; round 2
# closes at 36 and ends when 13 fails; round 3 (12, 17, 30, 39) closes at 44 (the samples'
# fencing token) and begins checkpoint 45 (the samples'), ranks 0, 1 and 3 done. Leader
# commands (CloseRound, MemberFailed) carry no session. The indexes between are empty
# entries, so the log has every index; entry i is applied at leader time
# ``setup_time_ms(i)``, within every session's TTL of the samples' LEADER_TIME_MS.
SETUP: list[tuple[int, int, int, Command]] = [
    (3, 0, 0, SessionOpen(60_000)),
    (5, 0, 0, SessionOpen(60_000)),
    (7, 3, 1, LeaseGrant(30_000)),
    (8, 3, 2, Put(b"golden/key", b"old value", lease_id=7)),
    (9, 3, 3, Put(b"golden/cas", b"old")),
    (10, 3, 4, Put(b"golden/counter", b"10")),
    (11, 3, 5, Configure("resnet", CONFIG)),
    (12, 3, 6, Join("resnet", "worker-a", b"")),
    (13, 3, 7, Join("resnet", "worker-b", b"")),
    (17, 3, 8, Join("resnet", "worker-c", b"")),
    (20, 0, 0, CloseRound("resnet", 1)),
    (30, 3, 9, Join("resnet", "worker-d", b"")),
    (36, 0, 0, CloseRound("resnet", 2)),
    (37, 0, 0, MemberFailed("resnet", 13, 2, "phi 12.0 over 9.5")),
    (39, 3, 10, Join("resnet", "worker-e", b"")),
    (44, 0, 0, CloseRound("resnet", 3)),
    (45, 3, 11, CheckpointBegin("resnet", 3, 44, 900, 4, b"layout", "s3://bucket/ckpt/900")),
    (46, 3, 12, StoreSet("resnet", 3, 17, b"store/key", b"store value")),
    (47, 3, 13, CheckpointShardDone("resnet", 3, 44, 45, 0)),
    (48, 3, 14, CheckpointShardDone("resnet", 3, 44, 45, 1)),
    (49, 3, 15, CheckpointShardDone("resnet", 3, 44, 45, 3)),
]
ROUND_3_CLOSE = 44  # CloseRound's sample closes round 3 itself, at the same index


def setup_time_ms(index: int) -> int:
    """Leader time of SETUP's entry ``index``: 250 ms apart (a last call of 1.5 s is six
    entries), the last a few seconds before LEADER_TIME_MS."""
    return LEADER_TIME_MS - 30_000 + 250 * index


def setup_for(command: Command) -> tuple[list[tuple[int, int, int, Command]], int]:
    """SETUP, cut or extended so that ``command`` (of any format version) is valid next, and
    the index it is applied at."""
    if isinstance(command, CloseRound):
        return [step for step in SETUP if step[0] < ROUND_3_CLOSE], ROUND_3_CLOSE
    if isinstance(command, CheckpointCommit):
        return [*SETUP, (50, 3, 16, CheckpointShardDone("resnet", 3, 44, 45, 2))], 51
    return SETUP, SETUP[-1][0] + 1


def machine_for(command: Command) -> tuple[StateMachine, int]:
    """A state machine in which ``command`` is valid, and the index to apply it at: every
    entry of ``setup_for(command)`` applied (empty entries between), each checked to be
    applied or answered, so a change that makes SETUP itself refused fails here, by index."""
    steps, at = setup_for(command)
    machine = StateMachine()
    by_index = {index: (session, sequence, step) for index, session, sequence, step in steps}
    for index in range(1, at):
        if index not in by_index:
            machine.apply(index, b"")
            continue
        session, sequence, step = by_index[index]
        envelope = Envelope(session, sequence, 0, setup_time_ms(index), step)
        problem = not_applied(machine.apply(index, encode_envelope(envelope)))
        if problem is not None:
            raise AssertionError(f"SETUP entry {index} ({step!r}): {problem}")
    return machine, at


# ------------------------------------------------------------------ raft messages

CONF_CHANGE = ConfChange(
    (ConfChangeSingle(ConfChangeType.ADD_NODE, NodeId(4)),),
    ConfChangeTransition.AUTO,
    ConfChangeContext("10.0.0.4:7001", "10.0.0.4:7000", 1, 33).encode(),
)
CONF_STATE = ConfState(voters=(NodeId(1), NodeId(2), NodeId(3)), learners=(NodeId(4),))


def sample_message(msg_type: MessageType) -> Message:
    """A message of ``msg_type`` with every field set (the codec does not check meaning)."""
    snapshot = None
    if msg_type is MessageType.MsgSnap:
        snapshot = Snapshot(b"state bytes", SnapshotMetadata(CONF_STATE, Index(8), Term(3)))
    reject = msg_type in RESPONSE_MESSAGES
    return Message(
        type=msg_type,
        to=NodeId(2),
        from_=NodeId(1),
        term=Term(5),
        log_term=Term(4),
        index=Index(10),
        entries=(
            Entry(Term(4), Index(11), EntryType.NORMAL, b"entry data"),
            Entry(Term(5), Index(12), EntryType.CONF_CHANGE, encode_conf_change(CONF_CHANGE)),
        ),
        commit=Index(9),
        snapshot=snapshot,
        reject=reject,
        reject_hint=Index(7 if reject else 0),
        context=b"context",
    )


# ------------------------------------------------------------------ peer messages


def sample_peer_message(name: str) -> ProtoMessage:
    """A proto/peer/v1 message with every field set to a value that is not its default."""
    descriptor = peer_pb2.DESCRIPTOR.message_types_by_name[name]
    message: ProtoMessage = getattr(peer_pb2, name)()
    for field in descriptor.fields:
        if name == "MessageBatch" and field.name == "messages":
            encoded = [encode_message(sample_message(t)) for t in (MessageType.MsgApp,)]
            encoded.append(encode_message(sample_message(MessageType.MsgHeartbeat)))
            message.messages.extend(encoded)
        elif name == "SnapshotChunk" and field.name == "message":
            snap = sample_message(MessageType.MsgSnap)
            assert snap.snapshot is not None
            header = dataclasses.replace(
                snap, snapshot=dataclasses.replace(snap.snapshot, data=b"")
            )
            message.message = encode_message(header)
        elif field.type == field.TYPE_BOOL:
            setattr(message, field.name, True)
        elif field.type == field.TYPE_BYTES:
            setattr(message, field.name, f"{name}.{field.name}".encode())
        elif field.type in (field.TYPE_UINT64, field.TYPE_UINT32):
            setattr(message, field.name, 1_000 + field.number)
        else:
            raise TypeError(f"{name}.{field.name}: add a sample value for its type")
    return message


def stamped_peer_message(name: str) -> ProtoMessage:
    """``sample_peer_message`` stamped as peer format version 2 sends it: counter
    PEER_COUNTER on a stream whose challenge is PEER_CHALLENGE, under PEER_SECRET."""
    message = sample_peer_message(name)
    tag, fields = peer_v2_formats()[name]
    session = OutboundSession(PeerKey(PEER_SECRET), PEER_CHALLENGE)
    session.counter = PEER_COUNTER - 1
    stamp = session.stamp(tag, fields(message))
    message.challenge, message.counter, message.mac = stamp.challenge, stamp.counter, stamp.mac  # type: ignore[attr-defined]
    return message


# ------------------------------------------------------------------ a member's data directory

MEMBERS = MemberTable(
    {
        1: MemberAddress("10.0.0.1:7001", "10.0.0.1:7000"),
        2: MemberAddress("10.0.0.2:7001", "10.0.0.2:7000"),
        3: MemberAddress("10.0.0.3:7001", "10.0.0.3:7000"),
    },
    highest_id=3,
)
SNAPSHOT_INDEX = 9
BLOB = bytes(range(256)) + b"golden" * 20  # entries large enough to need a second segment

# (index, session, sequence, command) of the log after its first two entries (a
# configuration change at 1, the new leader's empty entry at 2). Sessions are the indexes of
# their SessionOpen; the lease is 5; participant ids are join indexes.
LOG: list[tuple[int, int, int, Command]] = [
    (3, 0, 0, SessionOpen(60_000)),
    (4, 3, 1, Put(b"config/lr", b"0.1")),
    (5, 3, 2, LeaseGrant(30_000)),
    (6, 3, 3, Put(b"leader", b"worker-0", lease_id=5)),
    (7, 3, 4, Add(b"steps", 41)),
    (8, 3, 5, Configure("resnet", JobConfig(min_nodes=2, max_nodes=2))),
    (9, 3, 6, Join("resnet", "worker-0", b"m0")),
    # -- the snapshot is taken here (SNAPSHOT_INDEX) --
    (10, 0, 0, SessionOpen(60_000)),
    (11, 10, 1, Join("resnet", "worker-1", b"m1")),
    (12, 3, 7, StoreSet("resnet", 1, 9, b"master_addr", b"10.0.0.1:29500")),
    (13, 3, 8, Delete(b"config/lr")),
    *((14 + i, 10, 2 + i, Put(b"blob/%d" % i, BLOB)) for i in range(12)),
    (26, 3, 9, CompareAndSet(b"steps", b"42", expected_value=b"41")),
]


# ------------------------------------------------------------------ state-machine snapshots

# (session, sequence, command) applied at indexes 1, 2, ...: a job of two workers whose
# round commits a disk checkpoint and then a memory snapshot, which makes the snapshot
# format 6 (the round's fencing token is the raft index of the second join, 4).
FORMAT6_LOG: list[tuple[int, int, Command]] = [
    (0, 0, SessionOpen(60_000)),
    (1, 1, Configure("resnet", JobConfig(min_nodes=2, max_nodes=2))),
    (1, 2, Join("resnet", "worker-0", b"m0")),
    (1, 3, Join("resnet", "worker-1", b"m1")),
    (1, 4, CheckpointBegin("resnet", 1, 4, 100, 2, b"dp2", "file:///ckpt/100")),
    (1, 5, CheckpointShardDone("resnet", 1, 4, 5, 0)),
    (1, 6, CheckpointShardDone("resnet", 1, 4, 5, 1)),
    (1, 7, CheckpointCommit("resnet", 1, 4, 5)),
    (1, 8, MemorySnapshotCommit("resnet", 1, 4, 101, 2, b"dp2", b"\x01rank0@h1,rank1@h0")),
]


def format6_snapshot() -> bytes:
    machine = StateMachine()
    for index, (session, sequence, command) in enumerate(FORMAT6_LOG, 1):
        envelope = Envelope(session, sequence, 0, LEADER_TIME_MS + 100 * index, command)
        machine.apply(index, encode_envelope(envelope))
    image = machine.snapshot()
    assert codec.unpack(image)[0] == 6, "the memory snapshot makes it format 6"
    return image


# (session, sequence, command) applied at indexes 1, 2, ...: a shaped job (units of 2,
# hosts of 2, units inside a host) whose hosts a and b are seated and c waits; a's first
# participant fails, so round 2 is JOINING and held for a's other one; then host c is
# drained, which makes the snapshot format 7 (its fields: a JobConfig of format 2,
# Participants with a domain, a Round with a hold, a DrainedDomain).
SHAPED_CONFIG = JobConfig(
    min_nodes=2,
    max_nodes=4,
    scale_up=True,
    unit_size=2,
    domain_size=2,
    units_within_domains=True,
)
FORMAT7_LOG: list[tuple[int, int, Command]] = [
    (0, 0, SessionOpen(60_000)),
    (1, 1, Configure("llm", SHAPED_CONFIG)),
    (1, 2, JoinBatch("llm", ("a-0", "a-1", "b-0", "b-1"), (), None, True, ("a", "a", "b", "b"))),
    (1, 3, JoinBatch("llm", ("c-0", "c-1"), (b"c0", b"c1"), None, True, ("c", "c"))),
    (0, 0, MemberFailed("llm", 3, 1, "phi 9.1 over 8.0")),
    (1, 4, Drain("c", True, "ecc errors")),
]


def format7_snapshot() -> bytes:
    machine = StateMachine()
    for index, (session, sequence, command) in enumerate(FORMAT7_LOG, 1):
        envelope = Envelope(session, sequence, 0, LEADER_TIME_MS + 10 * index, command)
        machine.apply(index, encode_envelope(envelope))
    image = machine.snapshot()
    assert codec.unpack(image)[0] == 7, "the drained domain makes it format 7"
    job = machine.rendezvous.jobs["llm"]
    assert job.round.number == 2 and job.round.hold_until_ms, job.round
    return image


def entry_data(index: int, session: int, sequence: int, command: Command) -> bytes:
    envelope = Envelope(session, sequence, 0, LEADER_TIME_MS + 100 * index, command)
    return ENTRY_HEADER.pack(1, 1, index) + encode_envelope(envelope)


def write_data_dir(target: Path) -> None:
    """A member's data directory: two WAL segments and one snapshot at SNAPSHOT_INDEX."""
    with tempfile.TemporaryDirectory() as tmp:
        storage = DiskStorage.open(tmp, segment_size_bytes=DATA_SEGMENT_SIZE_BYTES)
        first = [
            Entry(Term(1), Index(1), EntryType.CONF_CHANGE, encode_conf_change(CONF_CHANGE)),
        ]
        storage.persist(HardState(Term(1), NodeId(1), Index(1)), first)
        storage.persist(HardState(Term(2), NodeId(1), Index(1)), [Entry(Term(2), Index(2))])
        machine = StateMachine()
        machine.apply(2, b"")
        for index, session, sequence, command in LOG:
            data = entry_data(index, session, sequence, command)
            storage.persist(
                HardState(Term(2), NodeId(1), Index(index - 1)),
                [Entry(Term(2), Index(index), EntryType.NORMAL, data)],
            )
            machine.apply(index, data[ENTRY_HEADER.size :])
            if index == SNAPSHOT_INDEX:
                app = encode_app_snapshot(MEMBERS, machine.snapshot())
                storage.create_snapshot(Index(index), CONF_STATE, app)
        storage.persist(HardState(Term(2), NodeId(1), Index(LOG[-1][0])), [])
        storage.close()
        segments = sorted(os.listdir(os.path.join(tmp, "wal")))
        assert len(segments) == 2, segments
        shutil.copytree(tmp, target)


# ------------------------------------------------------------------ writing


def write_new(path: Path, data: bytes, description: Any = None) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if description is not None:
        text = json.dumps(description, indent=1, ensure_ascii=False) + "\n"
        path.with_suffix(".json").write_text(text)
    print(f"wrote {path.relative_to(GOLDEN)}")


def record_schemas() -> dict[str, Any]:
    """records.json: per tag, the type and per format version its fields (name, version,
    the default's description or REQUIRED); versions already recorded are kept."""
    schemas: dict[str, Any] = json.loads(RECORDS.read_text()) if RECORDS.exists() else {}
    for tag, fmt in codec.record_formats().items():
        cls = codec.record_class(tag)
        if not cls.__module__.startswith("rallypoint.coordinator."):
            continue  # a test's own record
        fields = []
        for f, version in zip(dataclasses.fields(cls), fmt.field_versions, strict=True):
            if f.default is not dataclasses.MISSING:
                default = describe(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                default = describe(f.default_factory())
            else:
                default = REQUIRED
            fields.append([f.name, version, default])
        entry = schemas.setdefault(str(tag), {"type": fmt.name, "versions": {}})
        entry["versions"].setdefault(str(fmt.version), fields)
    return dict(sorted(schemas.items(), key=lambda item: int(item[0])))


def records_text(schemas: dict[str, Any]) -> str:
    """records.json with one line per field, so a diff shows what a new version added."""
    lines = ["{"]
    for i, (tag, entry) in enumerate(schemas.items()):
        lines.append(f'  "{tag}": {{"type": {json.dumps(entry["type"])}, "versions": {{')
        versions = list(entry["versions"].items())
        for j, (version, fields) in enumerate(versions):
            lines.append(f'    "{version}": [')
            for k, field in enumerate(fields):
                comma = "," if k < len(fields) - 1 else ""
                lines.append(f"      {json.dumps(field)}{comma}")
            lines.append("    ]" + ("," if j < len(versions) - 1 else ""))
        lines.append("  }}" + ("," if i < len(schemas) - 1 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    sampled = {type(command) for command in SAMPLES}
    for tag, fmt in codec.record_formats().items():
        cls = codec.record_class(tag)
        if issubclass(cls, Command) and cls not in sampled:
            print(f"add a sample of {fmt.name} to SAMPLES", file=sys.stderr)
            return 1
    for command in SAMPLES:
        fmt = codec.record_format(type(command))
        envelope = envelope_of(command)
        machine, index = machine_for(command)
        problem = not_applied(machine.apply(index, encode_envelope(envelope)))
        if problem is not None:
            print(f"{fmt.name}: {problem}; change SAMPLES or SETUP", file=sys.stderr)
            return 1
        write_new(
            command_file(fmt.tag, fmt.name, fmt.version),
            encode_envelope(envelope),
            describe(envelope),
        )
    for msg_type in MessageType:
        message = sample_message(msg_type)
        write_new(
            RAFT / f"{msg_type.value:02d}-{msg_type.name}.msgpack",
            encode_message(message),
            describe(message),
        )
    write_new(RAFT / "conf-change.msgpack", encode_conf_change(CONF_CHANGE), describe(CONF_CHANGE))
    for name in peer_pb2.DESCRIPTOR.message_types_by_name:
        message = sample_peer_message(name)
        write_new(
            PEER / f"{name}.binpb",
            message.SerializeToString(deterministic=True),
            json_format.MessageToDict(message, preserving_proto_field_name=True),
        )
    for name in peer_v2_formats():
        stamped = stamped_peer_message(name)
        write_new(
            PEER_V2 / f"{name}.binpb",
            stamped.SerializeToString(deterministic=True),
            json_format.MessageToDict(stamped, preserving_proto_field_name=True),
        )
    write_new(SNAPSHOTS / "format6-snapshot.msgpack", format6_snapshot())
    write_new(SNAPSHOTS / "format7-snapshot.msgpack", format7_snapshot())
    if not DATA.exists():
        write_data_dir(DATA)
        print(f"wrote {DATA.relative_to(GOLDEN)}")
    RECORDS.write_text(records_text(record_schemas()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
