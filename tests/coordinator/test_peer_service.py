"""The peer port on a real port, for what the fuzzer (tests/fuzz) found in it, and the
sessions that bind every request to its connection.

A request that does not parse was once answered with the parser's error, before the MAC was
checked: an outsider learned how we parse, and the member logged a traceback per request.
It is refused as any unauthenticated request. And a snapshot whose checksum matched but whose
file format did not ended UNKNOWN instead of being refused. Driven with raw frames of the
stream peer protocol (raw_peer.py).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import google_crc32c
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
from rallypoint.coordinator.peer_gate import UNAUTHENTICATED_MESSAGE
from rallypoint.coordinator.peer_hello import hello_request_fields
from rallypoint.coordinator.peer_session import OutboundSession
from rallypoint.coordinator.peerwire import frames
from rallypoint.coordinator.peerwire.conn import ConnectionLost, dial
from rallypoint.coordinator.peerwire.server import PeerListener
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

from .raw_peer import RawPeer, Refused
from .test_transport import CLUSTER_ID, Host


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(2, tmp_path)


async def listening(host: Host) -> tuple[PeerListener, str]:
    listener = PeerListener(host)
    await listener.start("127.0.0.1:0")
    return listener, f"127.0.0.1:{listener.port}"


@pytest.fixture
async def address(host: Host) -> AsyncIterator[str]:
    listener, address = await listening(host)
    try:
        yield address
    finally:
        await listener.stop(grace=None)


# (connection kind, the frame a request travels in)
REQUESTS = {
    "batch": (frames.KIND_RAFT, frames.BATCH),
    "chunk": (frames.KIND_SNAPSHOT, frames.CHUNK),
    "liveness": (frames.KIND_LIVENESS, frames.LIVENESS),
    "hello": (frames.KIND_HELLO, frames.HELLO),
}


@pytest.mark.parametrize("payload", [b"\xff\xff\xff", b"\x22\x10abc", b"\x93\x01"])
async def test_a_request_that_does_not_parse_is_unauthenticated(
    address: str, payload: bytes
) -> None:
    for name, (kind, frame_type) in REQUESTS.items():
        async with await RawPeer.open(address, kind, session=kind != frames.KIND_HELLO) as peer:
            peer.send(frame_type, payload)
            refused = await peer.refusal()
        assert refused.code == "UNAUTHENTICATED", name
        assert refused.message == UNAUTHENTICATED_MESSAGE, name


async def test_a_signed_request_still_parses(address: str, host: Host) -> None:
    request = peer_pb2.HelloRequest(cluster_id=CLUSTER_ID, from_id=1, to_id=2, nonce=b"n")
    request.mac = host.peer_key.sign(HELLO_TAG, hello_request_fields(request))
    async with await RawPeer.open(address, frames.KIND_HELLO, session=False) as peer:
        peer.send(frames.HELLO, frames.encode_record(request))
        body = await peer.expect(frames.HELLO_ANSWER)
    assert frames.decode_record(peer_pb2.HelloAnswer, body).member_id == 2


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


def _stamp_chunk(session: OutboundSession, chunk: peer_pb2.SnapshotChunk) -> bytes:
    stamp = session.stamp(CHUNK_TAG, chunk_fields(chunk))
    chunk.challenge, chunk.counter, chunk.mac = stamp.challenge, stamp.counter, stamp.mac
    return frames.encode_record(chunk)


async def install(address: str, key: PeerKey, chunks: list[peer_pb2.SnapshotChunk]) -> bytes:
    """One snapshot transfer as a member sends it: each chunk stamped with the connection's
    session; the member's SNAPSHOT_ACK (a refusal raises Refused)."""
    async with await RawPeer.open(address, frames.KIND_SNAPSHOT) as peer:
        session = peer.session(key)
        for chunk in chunks:
            peer.send(frames.CHUNK, _stamp_chunk(session, chunk))
        return await peer.expect(frames.SNAPSHOT_ACK)


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
    address: str, host: Host, tmp_path: Path, file_bytes: bytes
) -> None:
    """The checksum matches and the format does not: this ended UNKNOWN (the decoder's
    SnapshotCorruptionError escaped the servicer). It is refused, and no file stays."""
    with pytest.raises(Refused) as refused:
        await install(address, host.peer_key, [_chunk(host, file_bytes)])
    assert refused.value.code == "INVALID_ARGUMENT", refused.value.message
    assert "bad snapshot" in refused.value.message
    assert host.delivered == []
    deadline = asyncio.get_running_loop().time() + 2.0
    while list(tmp_path.iterdir()) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)  # the member answers before it has cleaned up
    assert list(tmp_path.iterdir()) == []


# -- sessions: every connection bound to its challenge (peer_session.py) ----------------------


def _report(session: OutboundSession, payload: bytes) -> bytes:
    report = peer_pb2.LivenessReport(cluster_id=CLUSTER_ID, from_id=1, to_id=2, payload=payload)
    stamp = session.stamp(LIVENESS_TAG, liveness_fields(report))
    report.challenge, report.counter, report.mac = stamp.challenge, stamp.counter, stamp.mac
    return frames.encode_record(report)


async def test_a_liveness_report_replayed_on_its_connection_or_another_is_refused(
    address: str, host: Host
) -> None:
    async with await RawPeer.open(address, frames.KIND_LIVENESS) as peer:
        session = peer.session(host.peer_key)
        first = _report(session, b"first")
        peer.send(frames.LIVENESS, first)
        ack = await peer.expect(frames.LIVENESS_ACK)
        assert frames.decode_record(peer_pb2.LivenessAck, ack).taken
        peer.send(frames.LIVENESS, _report(session, b"second"))
        await peer.expect(frames.LIVENESS_ACK)
        assert host.reports == [b"first", b"second"]
        peer.send(frames.LIVENESS, first)  # again, on its own connection
        refused = await peer.refusal()
    assert refused.code == "PERMISSION_DENIED"
    assert "number 1 was already taken on this connection (last 2)" in refused.message
    # ... and on a new one: made for another connection's challenge.
    async with await RawPeer.open(address, frames.KIND_LIVENESS) as other:
        other.send(frames.LIVENESS, first)
        refused = await other.refusal()
    assert refused.code == "PERMISSION_DENIED"
    assert "made for another connection" in refused.message
    assert host.reports == [b"first", b"second"]
    assert [reason for reason, _ in host.refusals] == ["replay", "replay"]


async def test_a_snapshot_chunk_replayed_on_a_new_connection_is_refused(
    address: str, host: Host
) -> None:
    chunk = _chunk(host, b"NOTSNAP!" + bytes(24))
    async with await RawPeer.open(address, frames.KIND_SNAPSHOT) as peer:
        recorded = _stamp_chunk(peer.session(host.peer_key), chunk)  # never delivered there
    async with await RawPeer.open(address, frames.KIND_SNAPSHOT) as replay:
        replay.send(frames.CHUNK, recorded)
        refused = await replay.refusal()
    assert refused.code == "PERMISSION_DENIED"
    assert "a replay" in refused.message


async def test_a_member_of_the_previous_peer_format_is_refused_saying_so(
    address: str, host: Host
) -> None:
    """A member still running format version 1 (MAC without a session) is a member: it is
    told, and this member logs, what to do; an outsider's unstamped batch stays
    unauthenticated."""
    batch = peer_pb2.MessageBatch(cluster_id=CLUSTER_ID, from_id=1, to_id=2, incarnation=7)
    batch.mac = host.peer_key.sign(PREVIOUS_BATCH_TAG, batch_fields(batch))
    async with await RawPeer.open(address, frames.KIND_RAFT) as peer:
        peer.send(frames.BATCH, frames.encode_record(batch))
        refused = await peer.refusal()
    assert refused.code == "FAILED_PRECONDITION"
    assert "format version 1" in refused.message and "upgrade member 1" in refused.message
    assert [reason for reason, _ in host.refusals] == ["old_format"]
    batch.mac = PeerKey(b"another-secret-entirely").sign(PREVIOUS_BATCH_TAG, batch_fields(batch))
    async with await RawPeer.open(address, frames.KIND_RAFT) as peer:
        peer.send(frames.BATCH, frames.encode_record(batch))
        refused = await peer.refusal()
    assert refused.code == "UNAUTHENTICATED"
    assert refused.message == UNAUTHENTICATED_MESSAGE


async def test_a_sender_waits_for_the_challenge_and_says_when_none_comes() -> None:
    """Against a listener that answers the preamble and never sends its challenge. The
    dialer that gives up closes its connection: the listener's handler sees it end (else
    the handler outlived the test, and its transport, never closed, failed a later test
    when the garbage collector found it)."""
    handled = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            kind = frames.parse_preamble(await reader.readexactly(frames.PREAMBLE.size))
            writer.write(frames.preamble(kind))
            await reader.read()  # until the dialer gives up
        finally:
            writer.close()
            handled.set()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ConnectionLost, match="no answer within 1 s"):
            await dial(f"127.0.0.1:{port}", frames.KIND_RAFT, None, session=True, timeout_s=1.0)
        async with asyncio.timeout(5):
            await handled.wait()
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(("stopping", "said"), [(False, "is starting"), (True, "is shutting down")])
async def test_a_member_that_takes_no_traffic_says_whether_it_starts_or_stops(
    tmp_path: Path, stopping: bool, said: str
) -> None:
    # A stopping member said "is starting", so the others logged that as it shut down.
    host = Host(2, tmp_path)
    host.accepts_traffic, host.stopping = False, stopping
    listener, address = await listening(host)
    batch = peer_pb2.MessageBatch(cluster_id=CLUSTER_ID, from_id=1, to_id=2)
    try:
        async with await RawPeer.open(address, frames.KIND_RAFT) as peer:
            stamp = peer.session(host.peer_key).stamp(BATCH_TAG, batch_fields(batch))
            batch.challenge, batch.counter, batch.mac = stamp.challenge, stamp.counter, stamp.mac
            peer.send(frames.BATCH, frames.encode_record(batch))
            refused = await peer.refusal()
    finally:
        await listener.stop(grace=None)
    assert refused.code == "UNAVAILABLE"
    assert refused.message == f"member 2 {said}"
