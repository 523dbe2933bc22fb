"""Recorded peer traffic replayed (issue 33, item 3): refused, on its own connection and on
another.

Members in one process on loopback (real gRPC peer ports). A follower forwards a client's
SessionOpen to the leader as a MsgProp; the batch it sent is recorded as it left the
follower (the proxy of the issue saw the same bytes). Replayed, it used to be appended
again, and each copy opened one more session. Now each peer stream is bound to the
receiver's challenge and numbered (coordinator/peer_session.py): a copy on a new stream was
made for another stream's challenge, a copy on its own stream repeats a number.
"""

from __future__ import annotations

import logging

import grpc
import grpc.aio
import pytest

from rallypoint.coordinator.node.driver import Node
from rallypoint.coordinator.peer_auth import BATCH_TAG, batch_fields
from rallypoint.coordinator.transport import PeerSender, open_session
from rallypoint.proto.peer.v1 import peer_pb2
from rallypoint.raft.codec import decode_message
from rallypoint.raft.types import MessageType

from .test_node import Cluster, wait_until
from .test_node import cluster as cluster  # the fixture: three in-process members
from .test_node import open_session as open_client_session

SEND = "/rallypoint.peer.v1.Raft/Send"


async def forwarded_proposal(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> tuple[Node, Node, bytes]:
    """(leader, follower, the serialized batch that carried the follower's forwarded
    SessionOpen to the leader), once that session is open."""
    leader = await cluster.leader()
    follower = next(n for n in cluster.nodes.values() if n is not leader)
    recorded: list[bytes] = []
    take_batch = PeerSender._take_batch

    def recording(sender: PeerSender, *args: object) -> peer_pb2.MessageBatch:
        batch = take_batch(sender, *args)  # type: ignore[arg-type]
        recorded.append(batch.SerializeToString())
        return batch

    monkeypatch.setattr(PeerSender, "_take_batch", recording)
    await open_client_session(follower)
    monkeypatch.setattr(PeerSender, "_take_batch", take_batch)
    for payload in recorded:
        batch = peer_pb2.MessageBatch.FromString(payload)
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
        async with grpc.aio.insecure_channel(address) as channel:
            send = channel.stream_unary(SEND, None, None)
            with (
                caplog.at_level(logging.WARNING, logger="rallypoint.node"),
                pytest.raises(grpc.aio.AioRpcError) as refused,
            ):
                await send(iter([recorded]))
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED, refused.value.details()
        details = refused.value.details() or ""
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
    """Played by a stream of our own (a proxy in the middle of the follower's stream
    replays the same way): the recorded proposal, stamped for this stream as its sender
    stamps it, is taken once; the same bytes again on the same stream are refused."""
    leader, follower, recorded = await forwarded_proposal(cluster, monkeypatch)
    before = sessions(leader)
    batch = peer_pb2.MessageBatch.FromString(recorded)
    address = cluster.members[leader.member_id].peer_address
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_unary(
            SEND,
            request_serializer=peer_pb2.MessageBatch.SerializeToString,
            response_deserializer=peer_pb2.SendAck.FromString,
        )()
        session = await open_session(call, follower.peers.peer_key)
        stamp = session.stamp(BATCH_TAG, batch_fields(batch))
        batch.challenge, batch.counter, batch.mac = stamp.challenge, stamp.counter, stamp.mac
        await call.write(batch)
        await wait_until(lambda: sessions(leader) > before, "the stamped proposal taken")
        await call.write(batch)  # the very same bytes, again
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "already taken on this connection" in (refused.value.details() or "")
    assert sessions(leader) == before + 1
    assert refusals(leader, "replay") == 1
    assert not cluster.fatal
