"""The peer service on a real port, for what the fuzzer (tests/fuzz) found in it.

grpc parsed each request before the servicer saw it, and answered one that does not parse
with UNKNOWN and the parser's error, before the MAC was checked: an outsider learned how we
parse, and the member logged a traceback per request. And a snapshot whose checksum matched
but whose file format did not ended UNKNOWN instead of being refused.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import google_crc32c
import grpc
import grpc.aio
import pytest

from rallypoint.coordinator.peer_auth import (
    BATCH_TAG,
    CHUNK_TAG,
    HELLO_TAG,
    LIVENESS_TAG,
    PREVIOUS_BATCH_TAG,
    PeerKey,
    batch_fields,
    chunk_fields,
    liveness_fields,
)
from rallypoint.coordinator.peer_hello import hello_request_fields
from rallypoint.coordinator.peer_service import UNAUTHENTICATED_MESSAGE, add_peer_service
from rallypoint.coordinator.peer_session import ChallengeError, OutboundSession
from rallypoint.coordinator.transport import open_session
from rallypoint.proto.peer.v1 import peer_pb2
from rallypoint.raft.codec import encode_message
from rallypoint.raft.storage.snapshotter import MAGIC
from rallypoint.raft.types import (
    ConfState,
    Index,
    Message,
    MessageType,
    NodeId,
    Snapshot,
    SnapshotMetadata,
    Term,
)

from .test_transport import CLUSTER_ID, Host


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(2, tmp_path)


@pytest.fixture
async def channel(host: Host) -> AsyncIterator[grpc.aio.Channel]:
    server = grpc.aio.server()
    add_peer_service(server, host)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel
    finally:
        await channel.close(None)
        await server.stop(grace=None)


@pytest.mark.parametrize("payload", [b"\xff\xff\xff", b"\x22\x10abc"])  # corrupt, truncated
async def test_a_request_that_does_not_parse_is_unauthenticated(
    channel: grpc.aio.Channel, payload: bytes
) -> None:
    calls = {
        "Send": lambda: channel.stream_unary("/rallypoint.peer.v1.Raft/Send")(iter([payload])),
        "InstallSnapshot": lambda: channel.stream_unary("/rallypoint.peer.v1.Raft/InstallSnapshot")(
            iter([payload])
        ),
        "Hello": lambda: channel.unary_unary("/rallypoint.peer.v1.Raft/Hello")(payload),
    }
    for name, call in calls.items():
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call()
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
        assert refused.value.details() == UNAUTHENTICATED_MESSAGE, name


async def test_a_signed_request_still_parses(channel: grpc.aio.Channel, tmp_path: Path) -> None:
    host = Host(2, tmp_path)
    request = peer_pb2.HelloRequest(cluster_id=CLUSTER_ID, from_id=1, to_id=2, nonce=b"n")
    request.mac = host.peer_key.sign(HELLO_TAG, hello_request_fields(request))
    answer = await channel.unary_unary(
        "/rallypoint.peer.v1.Raft/Hello",
        request_serializer=peer_pb2.HelloRequest.SerializeToString,
        response_deserializer=peer_pb2.HelloAnswer.FromString,
    )(request)
    assert answer.member_id == 2


def _chunk(host: Host, file_bytes: bytes) -> peer_pb2.SnapshotChunk:
    header = Message(
        type=MessageType.MsgSnap,
        to=NodeId(2),
        from_=NodeId(1),
        term=Term(3),
        snapshot=Snapshot(b"", SnapshotMetadata(ConfState(voters=(NodeId(1),)), Index(9), Term(3))),
    )
    chunk = peer_pb2.SnapshotChunk(
        cluster_id=CLUSTER_ID,
        from_id=1,
        to_id=2,
        snapshot_index=9,
        snapshot_term=3,
        offset=0,
        data=file_bytes,
        total_size=len(file_bytes),
        crc32c=google_crc32c.value(file_bytes),
        message=encode_message(header),
    )
    return chunk


async def install(
    channel: grpc.aio.Channel, key: PeerKey, chunks: list[peer_pb2.SnapshotChunk]
) -> None:
    """One InstallSnapshot stream as a member sends it: the session first, then each chunk
    stamped with it."""
    call = channel.stream_unary(
        "/rallypoint.peer.v1.Raft/InstallSnapshot",
        request_serializer=peer_pb2.SnapshotChunk.SerializeToString,
        response_deserializer=peer_pb2.SnapshotAck.FromString,
    )()
    session = await open_session(call, key)
    for chunk in chunks:
        stamp = session.stamp(CHUNK_TAG, chunk_fields(chunk))
        chunk.challenge, chunk.counter, chunk.mac = stamp.challenge, stamp.counter, stamp.mac
        await call.write(chunk)
    await call.done_writing()
    await call


@pytest.mark.parametrize(
    "file_bytes",
    [
        b"",  # too short for a snapshot
        b"NOTSNAP!" + bytes(24),  # bad magic
        MAGIC + struct.pack("<I", 2**31) + bytes(16),  # metadata length past the end
    ],
    ids=["too-short", "bad-magic", "metadata-past-the-end"],
)
async def test_a_snapshot_file_of_a_broken_format_is_refused(
    channel: grpc.aio.Channel, tmp_path: Path, file_bytes: bytes
) -> None:
    """The checksum matches and the format does not: this ended UNKNOWN (the decoder's
    SnapshotCorruptionError escaped the servicer). It is refused, and no file stays."""
    host = Host(2, tmp_path)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await install(channel, host.peer_key, [_chunk(host, file_bytes)])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert "bad snapshot" in (refused.value.details() or "")
    assert host.delivered == []
    deadline = asyncio.get_running_loop().time() + 2.0
    while list(tmp_path.iterdir()) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)  # the member answers before it has cleaned up
    assert list(tmp_path.iterdir()) == []


# -- sessions: every stream bound to its challenge (peer_session.py) --------------------------

LIVENESS = "/rallypoint.peer.v1.Raft/Liveness"
SEND = "/rallypoint.peer.v1.Raft/Send"


def _report(key: PeerKey, session: OutboundSession, payload: bytes) -> peer_pb2.LivenessReport:
    report = peer_pb2.LivenessReport(cluster_id=CLUSTER_ID, from_id=1, to_id=2, payload=payload)
    stamp = session.stamp(LIVENESS_TAG, liveness_fields(report))
    report.challenge, report.counter, report.mac = stamp.challenge, stamp.counter, stamp.mac
    return report


def _liveness_call(channel: grpc.aio.Channel) -> Any:
    return channel.stream_stream(
        LIVENESS,
        request_serializer=peer_pb2.LivenessReport.SerializeToString,
        response_deserializer=peer_pb2.LivenessAck.FromString,
    )()


async def test_a_liveness_report_replayed_on_its_stream_or_another_is_refused(
    channel: grpc.aio.Channel, host: Host
) -> None:
    call = _liveness_call(channel)
    session = await open_session(call, host.peer_key)
    first = _report(host.peer_key, session, b"first")
    await call.write(first)
    assert (await call.read()).taken
    await call.write(_report(host.peer_key, session, b"second"))
    assert (await call.read()).taken
    assert host.reports == [b"first", b"second"]
    await call.write(first)  # again, on its own stream
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call.read()
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "number 1 was already taken on this connection (last 2)" in (
        refused.value.details() or ""
    )
    # ... and on a new one: made for another stream's challenge.
    other = _liveness_call(channel)
    await open_session(other, host.peer_key)
    await other.write(first)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await other.read()
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "made for another connection" in (refused.value.details() or "")
    assert host.reports == [b"first", b"second"]
    assert [reason for reason, _ in host.refusals] == ["replay", "replay"]


async def test_a_snapshot_chunk_replayed_on_a_new_stream_is_refused(
    channel: grpc.aio.Channel, host: Host
) -> None:
    chunk = _chunk(host, b"NOTSNAP!" + bytes(24))
    call = channel.stream_unary(
        "/rallypoint.peer.v1.Raft/InstallSnapshot",
        request_serializer=peer_pb2.SnapshotChunk.SerializeToString,
        response_deserializer=peer_pb2.SnapshotAck.FromString,
    )()
    session = await open_session(call, host.peer_key)
    stamp = session.stamp(CHUNK_TAG, chunk_fields(chunk))
    chunk.challenge, chunk.counter, chunk.mac = stamp.challenge, stamp.counter, stamp.mac
    call.cancel()  # recorded, never delivered: replayed elsewhere
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await channel.stream_unary("/rallypoint.peer.v1.Raft/InstallSnapshot")(
            iter([chunk.SerializeToString()])
        )
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "a replay" in (refused.value.details() or "")


async def test_a_member_of_the_previous_peer_format_is_refused_saying_so(
    channel: grpc.aio.Channel, host: Host
) -> None:
    """A member still running format version 1 (MAC without a session) is a member: it is
    told, and this member logs, what to do; an outsider's unstamped batch stays
    unauthenticated."""
    batch = peer_pb2.MessageBatch(cluster_id=CLUSTER_ID, from_id=1, to_id=2, incarnation=7)
    batch.mac = host.peer_key.sign(PREVIOUS_BATCH_TAG, batch_fields(batch))
    send = channel.stream_unary(SEND, None, None)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await send(iter([batch.SerializeToString()]))
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    details = refused.value.details() or ""
    assert "format version 1" in details and "upgrade member 1" in details
    assert [reason for reason, _ in host.refusals] == ["old_format"]
    batch.mac = PeerKey(b"another-secret-entirely").sign(PREVIOUS_BATCH_TAG, batch_fields(batch))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await send(iter([batch.SerializeToString()]))
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.details() == UNAUTHENTICATED_MESSAGE


async def test_a_sender_waits_for_the_challenge_and_says_when_none_comes() -> None:
    """Against a member of the previous format (no challenge in the stream's metadata)."""

    class Silent:
        async def initial_metadata(self) -> tuple[()]:
            return ()

        def done(self) -> bool:
            return False

    with pytest.raises(ChallengeError, match="version 1"):
        await open_session(Silent(), PeerKey(b"transport-test-secret"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("stopping", "said"), [(False, "is starting"), (True, "is shutting down")])
async def test_a_member_that_takes_no_traffic_says_whether_it_starts_or_stops(
    tmp_path: Path, stopping: bool, said: str
) -> None:
    # A stopping member said "is starting", so the others logged that as it shut down.
    host = Host(2, tmp_path)
    host.accepts_traffic, host.stopping = False, stopping
    server = grpc.aio.server()
    add_peer_service(server, host)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    batch = peer_pb2.MessageBatch(cluster_id=CLUSTER_ID, from_id=1, to_id=2)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.stream_unary(
                SEND,
                request_serializer=peer_pb2.MessageBatch.SerializeToString,
                response_deserializer=peer_pb2.SendAck.FromString,
            )()
            session = await open_session(call, host.peer_key)
            stamp = session.stamp(BATCH_TAG, batch_fields(batch))
            batch.challenge, batch.counter, batch.mac = stamp.challenge, stamp.counter, stamp.mac
            await call.write(batch)
            await call.done_writing()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
    finally:
        await server.stop(grace=None)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert refused.value.details() == f"member 2 {said}"
