"""The peer port against outsiders and a member gone wrong, with real member processes.

An outsider (no secret, a wrong one) reaches the peer port and tries what once worked: a
forged MsgTimeoutNow that made a follower leader, a heartbeat at term + 1000 that forced an
election, a forged MsgApp that one follower committed. A member gone wrong (the right
secret, malformed content) sends a term near 2^64 (it once killed a member and wedged the
cluster forever), undecodable bytes, a MsgSnap of garbage (once persisted: the member never
started again) and a snapshot claiming a terabyte. Afterwards no member died, nothing was
persisted, the leader is the same and the cluster serves.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import google_crc32c
import grpc
import msgpack
import pytest

from rallypoint.client import Client
from rallypoint.coordinator.peer_auth import cluster_id_for
from rallypoint.proto.peer.v1 import peer_pb2
from rallypoint.raft.codec import encode_message, message_to_obj
from rallypoint.raft.storage.snapshotter import encode_snapshot_file
from rallypoint.raft.types import (
    ConfState,
    Entry,
    EntryType,
    Index,
    Message,
    MessageType,
    NodeId,
    Snapshot,
    SnapshotMetadata,
    Term,
)
from tests.integration.harness import ProcessCluster, running_cluster, wait_until
from tests.integration.peer_client import PeerClient

pytestmark = pytest.mark.integration

MT = MessageType


def message(type_: MessageType, frm: int, to: int, term: int, **fields: object) -> Message:
    return Message(type=type_, from_=NodeId(frm), to=NodeId(to), term=Term(term), **fields)  # type: ignore[arg-type]


def roles(cluster: ProcessCluster) -> tuple[int, int, int]:
    """(leader, a follower, its term)."""
    leader = cluster.leader()
    follower = next(i for i in cluster.members if i != leader)
    status = cluster.status(follower)
    assert status is not None
    return leader, follower, status.term


def assert_undisturbed(cluster: ProcessCluster, leader: int, term: int) -> None:
    for member_id, member in cluster.members.items():
        assert member.running, f"member {member_id} died:\n{cluster.log_text(member_id)[-2000:]}"
    assert cluster.leader() == leader
    for member_id in cluster.members:
        status = cluster.status(member_id)
        assert status is not None and status.term == term, (member_id, status)


async def test_outsiders_are_refused_before_anything_reaches_raft(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 3) as cluster:
        leader, follower, term = roles(cluster)
        address = cluster.members[follower].peer_address
        secret = cluster.secret_path.read_bytes().strip()
        real_cluster_id = cluster_id_for(secret, "rallypoint")
        attacks = {
            "timeout-now": [message(MT.MsgTimeoutNow, leader, follower, term)],
            "heartbeat at term + 1000": [message(MT.MsgHeartbeat, leader, follower, term + 1000)],
            "append at the current term": [
                message(
                    MT.MsgApp,
                    leader,
                    follower,
                    term,
                    index=Index(1),
                    log_term=Term(1),
                    entries=(Entry(Term(term), Index(2), EntryType.NORMAL, b"forged"),),
                    commit=Index(2),
                )
            ],
        }
        outsiders = [
            PeerClient(address, None),
            PeerClient(address, b"not-the-cluster-secret"),
        ]
        for outsider in outsiders:
            outsider.cluster_id = real_cluster_id  # even knowing the id does not help
            for what, messages in attacks.items():
                code, details = outsider.send([outsider.batch(leader, follower, messages)])
                assert code is grpc.StatusCode.UNAUTHENTICATED, what
                assert f"{real_cluster_id:x}" not in details  # nothing about the cluster
        assert_undisturbed(cluster, leader, term)
        async with Client(cluster.endpoints, timeout_s=20.0) as client:
            await client.put("still", "serving")
            assert (await client.get("still")) is not None


async def test_a_member_gone_wrong_cannot_kill_or_wedge_another(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 3) as cluster:
        leader, follower, term = roles(cluster)
        target = cluster.members[follower]
        insider = PeerClient(target.peer_address, cluster.secret_path.read_bytes().strip())

        def batch(*messages: Message | bytes) -> peer_pb2.MessageBatch:
            return insider.batch(leader, follower, list(messages))

        def heartbeat_at(term: int) -> bytes:
            # Encoded by hand: the codec would not let such a term through either way.
            raw = message_to_obj(message(MT.MsgHeartbeat, leader, follower, 0))
            raw[3] = term
            return bytes(msgpack.packb(raw, use_bin_type=True))

        for what, sent in {
            "a term near 2^64": batch(heartbeat_at(2**64 - 2)),
            "a term past the range": batch(heartbeat_at(2**62)),
            "undecodable bytes": batch(b"\xc1\xc1\xc1"),
            "an entry that would not apply": batch(
                message(
                    MT.MsgApp,
                    leader,
                    follower,
                    term,
                    index=Index(1),
                    log_term=Term(1),
                    entries=(Entry(Term(term), Index(2), EntryType.NORMAL, b"\x01garbage"),),
                )
            ),
            "MsgSnap inside a batch": batch(
                message(
                    MT.MsgSnap,
                    leader,
                    follower,
                    term,
                    snapshot=Snapshot(b"garbage", SnapshotMetadata(ConfState(), Index(9), Term(1))),
                )
            ),
        }.items():
            code, details = insider.send([sent])
            assert code is grpc.StatusCode.INVALID_ARGUMENT, (what, code, details)

        # A snapshot of garbage: the file format and checksum are right, the content is not.
        garbage = Snapshot(
            os.urandom(256),
            SnapshotMetadata(
                ConfState(voters=(NodeId(1), NodeId(2), NodeId(3))), Index(10**6), Term(term)
            ),
        )
        file_bytes = b"".join(encode_snapshot_file(garbage))
        header = encode_message(
            message(MT.MsgSnap, leader, follower, term, snapshot=Snapshot(b"", garbage.metadata))
        )

        def chunk(total_size: int, data: bytes) -> peer_pb2.SnapshotChunk:
            return peer_pb2.SnapshotChunk(
                cluster_id=insider.cluster_id,
                from_id=leader,
                to_id=follower,
                snapshot_index=10**6,
                snapshot_term=term,
                offset=0,
                data=data,
                total_size=total_size,
                crc32c=google_crc32c.value(file_bytes),
                message=header,
            )

        code, details = insider.install([chunk(len(file_bytes), file_bytes)])
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        code, details = insider.install([chunk(10**12, file_bytes[:1024])])
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        incoming = target.data_dir / "incoming"
        assert not list(incoming.glob("*")), "a refused transfer left files behind"

        assert_undisturbed(cluster, leader, term)
        # Nothing garbage was persisted: the member restarts from its own disk.
        cluster.restart(follower)
        wait_until(lambda: cluster.status(follower), 20, "the restarted member")
        async with Client(cluster.endpoints, timeout_s=20.0) as client:
            await client.put("after", "attacks")
        assert cluster.members[follower].running


async def test_a_wiped_member_rejoins_without_losing_acknowledged_writes(tmp_path: Path) -> None:
    """The issue's reproducer: the lagging member must not win with the wiped one's vote."""
    with running_cluster(tmp_path, 3) as cluster:
        leader = cluster.leader()
        lagging, wiped = (i for i in cluster.members if i != leader)
        cluster.pause(lagging)
        async with Client(cluster.endpoints, timeout_s=20.0) as client:
            for i in range(50):
                await client.put(f"acked/{i:02d}", str(i))
        cluster.kill(leader)
        cluster.kill(wiped)
        cluster.wipe(wiped)
        cluster.start(wiped)  # plain serve, same flags, empty data dir
        cluster.resume(lagging)

        def told_it_lost_its_data() -> bool:
            status = cluster.status(wiped)
            return status is not None and status.catching_up

        wait_until(told_it_lost_its_data, 20, "the wiped member to start, catching up")
        # For many election timeouts the lagging member campaigns and must not win: sampled
        # every 0.1 s for 3 s.
        for _ in range(30):
            for member_id in (lagging, wiped):
                status = cluster.status(member_id)
                # (It may still believe in the dead leader for an election timeout.)
                assert status is None or status.leader_id not in (lagging, wiped), status
            time.sleep(0.1)
        cluster.start(leader)
        new_leader = cluster.leader(timeout_s=30)
        assert new_leader != wiped
        async with Client(cluster.endpoints, timeout_s=20.0) as client:
            for i in range(50):
                kv = await client.get(f"acked/{i:02d}")
                assert kv is not None and kv.value == str(i).encode(), i
            await client.put("after", "rejoin")
        # Every member, the wiped one included, ends with the same state and votes again.
        leader_status = cluster.status(new_leader)
        assert leader_status is not None

        def converged() -> bool:
            statuses = [cluster.status(i) for i in cluster.members]
            return all(
                s is not None
                and s.applied_index >= leader_status.commit_index
                and not s.catching_up
                for s in statuses
            )

        wait_until(converged, 20, "every member to catch up")
        for member_id in cluster.members:
            async with Client([cluster.members[member_id].client_address]) as local:
                found = [kv async for kv in local.range_pages("acked/", serializable=True)]
                assert len(found) == 50, member_id
        assert "lost its data and rejoins" in cluster.log_text(wiped)


async def test_a_data_dir_of_another_member_is_refused(tmp_path: Path) -> None:
    cluster = ProcessCluster(tmp_path, 3)
    cluster.start_all()
    try:
        cluster.leader()
        cluster.kill(2)
        # Member 2's data directory given to member 3.
        cluster.kill(3)
        cluster.members[3].data_dir = cluster.members[2].data_dir
        cluster.start(3)
        member = cluster.members[3]
        assert member.proc is not None
        assert member.proc.wait(timeout=30) == 2
        log = cluster.log_text(3)
        assert "belongs to member 2, but this member was started as member 3" in log
        assert "Traceback" not in log
    finally:
        cluster.shutdown()
