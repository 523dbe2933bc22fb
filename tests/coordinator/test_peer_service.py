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

import google_crc32c
import grpc
import grpc.aio
import pytest

from rallypoint.coordinator.peer_auth import (
    BATCH_TAG,
    CHUNK_TAG,
    HELLO_TAG,
    batch_fields,
    chunk_fields,
)
from rallypoint.coordinator.peer_hello import hello_request_fields
from rallypoint.coordinator.peer_service import UNAUTHENTICATED_MESSAGE, add_peer_service
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
async def channel(tmp_path: Path) -> AsyncIterator[grpc.aio.Channel]:
    server = grpc.aio.server()
    add_peer_service(server, Host(2, tmp_path))
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
    chunk.mac = host.peer_key.sign(CHUNK_TAG, chunk_fields(chunk))
    return chunk


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
    install = channel.stream_unary(
        "/rallypoint.peer.v1.Raft/InstallSnapshot",
        request_serializer=peer_pb2.SnapshotChunk.SerializeToString,
        response_deserializer=peer_pb2.SnapshotAck.FromString,
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await install(iter([_chunk(host, file_bytes)]))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert "bad snapshot" in (refused.value.details() or "")
    assert host.delivered == []
    deadline = asyncio.get_running_loop().time() + 2.0
    while list(tmp_path.iterdir()) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)  # the member answers before it has cleaned up
    assert list(tmp_path.iterdir()) == []


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
    batch.mac = host.peer_key.sign(BATCH_TAG, batch_fields(batch))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await channel.stream_unary(
                    "/rallypoint.peer.v1.Raft/Send",
                    request_serializer=peer_pb2.MessageBatch.SerializeToString,
                    response_deserializer=peer_pb2.SendAck.FromString,
                )(iter([batch]))
    finally:
        await server.stop(grace=None)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert refused.value.details() == f"member 2 {said}"
