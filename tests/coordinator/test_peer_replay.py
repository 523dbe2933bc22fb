"""Recorded peer traffic replayed (issue 33, item 3): refused, on its own connection and on
another.

Members in one process on loopback (real peer ports, the stream protocol). A follower
forwards a client's SessionOpen to the leader as a MsgProp; the batch it sent is recorded as
it left the follower (the proxy of the issue saw the same bytes). Replayed, it used to be
appended again, and each copy opened one more session. Now each peer connection is bound to
the receiver's challenge and numbered (coordinator/peer_session.py): a copy on a new
connection was made for another connection's challenge, a copy on its own connection
repeats a number.
"""

from __future__ import annotations

import logging

import pytest

from rallypoint.coordinator.node.driver import Node
from rallypoint.coordinator.peer_auth import BATCH_TAG, batch_fields
from rallypoint.coordinator.peer_session import OutboundSession
from rallypoint.coordinator.peerwire import frames
from rallypoint.coordinator.peerwire.transport import StreamSender
from rallypoint.proto.peer.v1 import peer_pb2
from rallypoint.raft.codec import decode_message
from rallypoint.raft.types import MessageType

from .raw_peer import RawPeer
from .test_node import Cluster, wait_until
from .test_node import cluster as cluster  # the fixture: three in-process members
from .test_node import open_session as open_client_session


async def forwarded_proposal(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> tuple[Node, Node, bytes]:
    """(leader, follower, the BATCH frame's body that carried the follower's forwarded
    SessionOpen to the leader), once that session is open."""
    leader = await cluster.leader()
    follower = next(n for n in cluster.nodes.values() if n is not leader)
    recorded: list[bytes] = []
    take_batch = StreamSender._take_batch

    def recording(sender: StreamSender, session: OutboundSession) -> bytes:
        body = take_batch(sender, session)
        recorded.append(body)
        return body

    monkeypatch.setattr(StreamSender, "_take_batch", recording)
    await open_client_session(follower)
    monkeypatch.setattr(StreamSender, "_take_batch", take_batch)
    for payload in recorded:
        batch = frames.decode_record(peer_pb2.MessageBatch, payload)
        types = [decode_message(m).type for m in batch.messages]
        if batch.to_id == leader.member_id and MessageType.MsgProp in types:
            return leader, follower, payload
    raise AssertionError("the follower sent no MsgProp to the leader")


def sessions(node: Node) -> int:
    return len(node.state.sessions.in_order())


def refusals(node: Node, reason: str) -> float:
    value: float = node.metrics.peer_refusals.labels(reason)._value.get()
    return value


async def test_a_forwarded_proposal_replayed_on_a_new_connection_is_refused(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    leader, follower, recorded = await forwarded_proposal(cluster, monkeypatch)
    before = sessions(leader)
    address = cluster.members[leader.member_id].peer_address
    for attempt in range(3):  # a proxy replays as often as it likes
        with caplog.at_level(logging.WARNING, logger="rallypoint.node"):
            async with await RawPeer.open(address, frames.KIND_RAFT) as proxy:
                proxy.send(frames.BATCH, recorded)
                refused = await proxy.refusal()
        assert refused.code == "PERMISSION_DENIED", refused.message
        details = refused.message
        assert "made for another connection" in details and "a replay" in details
        assert sessions(leader) == before, f"replay {attempt} opened a session"
    assert refusals(leader, "replay") == 3
    lines = [r.getMessage() for r in caplog.records if "a replay" in r.getMessage()]
    assert lines and f"from member {follower.member_id} refused" in lines[0]
    # The real follower's own stream is untouched: it still forwards.
    await open_client_session(follower)
    assert sessions(leader) == before + 1
    assert not cluster.fatal


async def test_a_forwarded_proposal_replayed_on_its_own_connection_is_refused(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Played by a connection of our own (a proxy in the middle of the follower's
    connection replays the same way): the recorded proposal, stamped for this connection as
    its sender stamps it, is taken once; the same bytes again on it are refused."""
    leader, follower, recorded = await forwarded_proposal(cluster, monkeypatch)
    before = sessions(leader)
    batch = frames.decode_record(peer_pb2.MessageBatch, recorded)
    address = cluster.members[leader.member_id].peer_address
    async with await RawPeer.open(address, frames.KIND_RAFT) as proxy:
        stamp = proxy.session(follower.peers.peer_key).stamp(BATCH_TAG, batch_fields(batch))
        batch.challenge, batch.counter, batch.mac = stamp.challenge, stamp.counter, stamp.mac
        body = frames.encode_record(batch)
        proxy.send(frames.BATCH, body)
        await wait_until(lambda: sessions(leader) > before, "the stamped proposal taken")
        proxy.send(frames.BATCH, body)  # the very same bytes, again
        refused = await proxy.refusal()
    assert refused.code == "PERMISSION_DENIED"
    assert "already taken on this connection" in refused.message
    assert sessions(leader) == before + 1
    assert refusals(leader, "replay") == 1
    assert not cluster.fatal
