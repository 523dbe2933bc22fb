"""The stream peer transport on loopback (coordinator/peerwire/): its batching, bounds,
frames' version and keepalives, hellos and liveness reports. The contract with Raft (every
message delivered or reported) is test_transport.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgpack
import pytest

from rallypoint.coordinator.peer_auth import BATCH_TAG, batch_fields
from rallypoint.coordinator.peer_hello import ask
from rallypoint.coordinator.peer_session import OutboundSession
from rallypoint.coordinator.peerwire import conn as conn_module
from rallypoint.coordinator.peerwire import frames
from rallypoint.coordinator.peerwire.transport import (
    KEEPALIVE_S,
    StreamSender,
    StreamTransport,
)
from rallypoint.proto.peer.v1 import peer_pb2
from rallypoint.raft.codec import encode_message
from rallypoint.raft.types import Entry, Index, Message, MessageType, NodeId, Term
from tests.coordinator.test_transport import (
    CLUSTER_ID,
    Host,
    Peer,
    delivered_numbers,
    heartbeat,
    send_and_account,
    wait_for,
)
from tests.coordinator.test_transport import pair as pair  # the fixture
from tests.coordinator.timeout_scopes import TimeoutScopes


def append_of(size: int) -> Message:
    big = Entry(index=Index(1), term=Term(1), data=b"x" * size)
    return Message(
        type=MessageType.MsgApp, to=NodeId(2), from_=NodeId(1), term=Term(1), entries=(big,)
    )


def count_batches(receiver: Host) -> list[int]:
    """The number of messages in each batch ``receiver`` is delivered from now on."""
    batches: list[int] = []
    deliver = receiver.deliver

    def counting(messages: list[Message], incarnation: int, abstaining: bool) -> None:
        batches.append(len(messages))
        deliver(messages, incarnation, abstaining)

    receiver.deliver = counting  # type: ignore[method-assign]
    return batches


async def test_messages_queued_while_the_socket_is_busy_go_out_in_one_batch(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    host, receiver, peer, sender = pair
    await peer.start()
    assert await send_and_account(sender, host, receiver, 0)
    batches = count_batches(receiver)
    for n in range(1, 201):
        sender.send(heartbeat(n))  # all queued before the sender's task runs again
    await wait_for(lambda: len(delivered_numbers(receiver)) == 201, 5.0, "every heartbeat")
    assert len(batches) <= 3, batches


async def test_batches_sent_one_at_a_time_arm_no_timeout_scope_each(
    pair: tuple[Host, Host, Peer, StreamSender], monkeypatch: pytest.MonkeyPatch
) -> None:
    """50 heartbeats, each sent once the one before was delivered: the sender's idle waits
    share the connection's one keepalive timer, and the listener's reads its one watchdog
    (an ``asyncio.timeout`` per idle wait, and two per frame read, before)."""
    host, receiver, peer, sender = pair
    await peer.start()
    assert await send_and_account(sender, host, receiver, 0)  # connected and authenticated
    scopes = TimeoutScopes(monkeypatch)
    for n in range(1, 51):
        assert await send_and_account(sender, host, receiver, n)
    assert sender.streams_broken == 0
    assert scopes.count == 0


async def test_an_idle_connection_that_answers_its_pings_stays_up(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    host, receiver, peer, sender = pair
    await peer.start()
    assert await send_and_account(sender, host, receiver, 0)
    # Idle for three keepalive periods and more: pinged, answered, kept.
    await asyncio.sleep(3.5 * KEEPALIVE_S)
    assert sender.streams_broken == 0
    assert await send_and_account(sender, host, receiver, 1)
    assert sender.streams_broken == 0


async def test_the_outbox_is_bounded_in_bytes_too(tmp_path: Path) -> None:
    host = Host(1, tmp_path)
    sender = StreamSender(host, 2, None, random.Random(1))  # not started
    sender.outbox_bytes_limit = 1_000_000
    for _ in range(30):
        sender.send(append_of(100_000))
        assert sender.buffered_bytes <= 1_000_000
    assert sender.dropped >= 20
    assert host.unreachable >= 20


async def test_hello_and_liveness_reports_travel_on_the_stream_protocol(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    host, receiver, peer, _sender = pair
    await peer.start()
    transport = StreamTransport(host, random.Random(3))
    try:
        answered = await ask(2, peer.address, 1, CLUSTER_ID, host.peer_key, transport.hello)
        assert answered is not None
        assert answered[0].member_id == 2 and answered[0].knows_sender
        for n in range(3):
            assert await transport.liveness(2, b"report-%d" % n)
        assert receiver.reports == [b"report-0", b"report-1", b"report-2"]
    finally:
        await transport.stop()


async def test_a_stopped_transport_starts_no_sender(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    """A member stops its transport before its peer listener, which may still step a
    forwarded proposal (and ask the transport to hold no notice for its sender) or let Raft
    send: a sender started then would dial on, owned by nobody, after the member stopped."""
    host, _receiver, peer, _sender = pair
    await peer.start()
    transport = StreamTransport(host, random.Random(3))
    await transport.stop()
    transport.send([heartbeat(1)])
    transport.await_commit(2, 5)
    assert transport._senders == {}


@contextlib.asynccontextmanager
async def raft_listener(
    after_open: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    receive_window: int = 0,
) -> AsyncIterator[str]:
    """A listener that opens each ``RAFT`` connection as a member does (its preamble and a
    challenge) and leaves the rest to ``after_open``; its address. ``receive_window``: a
    small socket receive buffer, so that a sender's buffer fills when nobody reads."""
    accepted: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        writer.write(frames.preamble(frames.KIND_RAFT))
        writer.write(frames.frame(frames.OPEN, b"c" * 16))
        await after_open(reader, writer)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    if receive_window:
        for sock in server.sockets:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_window)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in accepted:
            writer.close()
        server.close()


async def opened_and_idle(transport: StreamTransport) -> StreamSender:
    """Member 2's sender once its connection has carried a batch and waits for more."""
    transport.send([heartbeat(0)])
    sender = transport.sender(2)
    await wait_for(lambda: sender._direct is not None, 5.0, "the connection open and idle")
    return sender


async def test_a_message_for_an_open_idle_connection_leaves_in_the_callers_turn(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    """What the member sends while a peer's connection is open and idle is on the socket
    when ``send`` returns (a follower's ack, a leader's append), not queued for the
    sender's task to write in a later turn of the loop; one call's messages for a peer are
    still one batch."""
    host, receiver, peer, _sender = pair
    await peer.start()
    transport = StreamTransport(host, random.Random(3))
    batches = count_batches(receiver)
    try:
        sender = await opened_and_idle(transport)  # the task wrote the first batch
        for n in range(1, 21):
            transport.send([heartbeat(n)])
            assert sender.buffered_bytes == 0, f"heartbeat {n} waits for a later turn"
            await wait_for(lambda n=n: n in delivered_numbers(receiver), 5.0, f"heartbeat {n}")
        transport.send([heartbeat(n) for n in range(21, 31)])
        assert sender.buffered_bytes == 0
        await wait_for(lambda: 30 in delivered_numbers(receiver), 5.0, "heartbeats 21-30")
        assert batches == [1] * 21 + [10]
        assert sender.streams_broken == 0 and host.unreachable == 0
    finally:
        await transport.stop()


async def test_a_direct_write_that_fails_ends_the_connection_and_reports_the_loss(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    """The socket closes under an idle connection: the message written into it may be
    lost, so Raft is told (the peer unreachable), and the next message goes on a new
    connection."""
    host, receiver, peer, _sender = pair
    await peer.start()
    transport = StreamTransport(host, random.Random(3))
    try:
        sender = await opened_and_idle(transport)
        conn = sender._conn
        assert conn is not None
        conn.writer.transport.abort()  # closing: the next write raises
        transport.send([heartbeat(1)])
        await wait_for(lambda: host.unreachable >= 1, 5.0, "the loss reported")
        assert sender.streams_broken == 1
        transport.send([heartbeat(2)])  # dialled again (a connection opens for a message)
        await wait_for(lambda: 2 in delivered_numbers(receiver), 5.0, "heartbeat 2")
        assert sender._conn not in (None, conn)
    finally:
        await transport.stop()


async def test_direct_writes_to_a_peer_that_stops_reading_end_its_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As test_a_peer_that_stops_reading_is_reported_and_its_buffer_stays_bounded, through
    the member's transport: once the socket holds bytes the sender's task waits for it to
    drain, and gives up after WRITE_STALL_S."""
    monkeypatch.setattr(conn_module, "WRITE_STALL_S", 0.5)
    monkeypatch.setattr(conn_module, "WRITE_BUFFER_BYTES", 256 * 1024)
    stalled = asyncio.Event()

    async def reads_one_batch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(frames.PREAMBLE.size)
        length, _kind = frames.HEADER.unpack(await reader.readexactly(frames.HEADER.size))
        await reader.readexactly(length)  # the first batch, then nothing more
        await stalled.wait()

    host = Host(1, tmp_path)
    transport = StreamTransport(host, random.Random(1))
    append = append_of(64 * 1024)
    async with raft_listener(reads_one_batch, receive_window=4096) as address:
        host.addresses[2] = address
        try:
            sender = await opened_and_idle(transport)
            peak = 0
            for _ in range(400):
                transport.send([append])
                peak = max(peak, sender.buffered_bytes)
                await asyncio.sleep(0.005)
                if sender.streams_broken:
                    break
            await wait_for(lambda: sender.streams_broken >= 1, 10.0, "the stalled connection end")
            assert host.unreachable >= 1
            assert peak <= 64 * 1024 * 1024 + 256 * 1024 + 8 * 1024 * 1024
        finally:
            stalled.set()
            await transport.stop()


async def test_what_queues_while_a_direct_write_drains_goes_out_when_it_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A direct write the socket could not take whole hands the rest to the task; a message
    sent meanwhile waits in the outbox and leaves as soon as the socket has drained (not at
    the next keepalive: here a minute away)."""
    from rallypoint.coordinator.peerwire import transport as transport_module

    monkeypatch.setattr(transport_module, "KEEPALIVE_S", 60.0)
    monkeypatch.setattr(conn_module, "WRITE_BUFFER_BYTES", 256 * 1024)
    read_on = asyncio.Event()
    batches: list[int] = []

    async def reads_when_told(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(frames.PREAMBLE.size)
        while True:
            if len(batches) == 1:
                await read_on.wait()
            length, kind = frames.HEADER.unpack(await reader.readexactly(frames.HEADER.size))
            await reader.readexactly(length)
            if kind == frames.BATCH:
                batches.append(length)

    host = Host(1, tmp_path)
    transport = StreamTransport(host, random.Random(1))
    append = append_of(4 * 1024 * 1024)
    async with raft_listener(reads_when_told, receive_window=4096) as address:
        host.addresses[2] = address
        try:
            sender = await opened_and_idle(transport)
            transport.send([append])  # more than the sockets hold: the task drains the rest
            assert sender._direct is None
            await asyncio.sleep(0.05)
            transport.send([heartbeat(1)])
            assert sender.queued
            read_on.set()
            await wait_for(lambda: len(batches) == 3, 5.0, "the append and heartbeat 1")
            assert sender.streams_broken == 0 and host.unreachable == 0
        finally:
            await transport.stop()


# -- the wire, by hand ------------------------------------------------------------------


async def open_raw(
    address: str, kind: int = frames.KIND_RAFT, version: int = 1
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(frames.preamble(kind, version))
    return reader, writer


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    async with asyncio.timeout(5.0):
        length, kind = frames.HEADER.unpack(await reader.readexactly(frames.HEADER.size))
        return kind, await reader.readexactly(length)


async def opened(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A Raft connection past its preambles, and the listener's challenge."""
    reader, writer = await open_raw(address)
    async with asyncio.timeout(5.0):
        frames.parse_preamble(await reader.readexactly(frames.PREAMBLE.size))
    kind, challenge = await read_frame(reader)
    assert kind == frames.OPEN
    return reader, writer, challenge


def stamped_batch(host: Host, session: OutboundSession, n: int) -> bytes:
    batch = peer_pb2.MessageBatch(
        cluster_id=CLUSTER_ID,
        from_id=1,
        to_id=2,
        messages=[encode_message(heartbeat(n))],
        incarnation=7,
    )
    stamp = session.stamp(BATCH_TAG, batch_fields(batch))
    batch.challenge, batch.counter, batch.mac = stamp.challenge, stamp.counter, stamp.mac
    return frames.frame(frames.BATCH, frames.encode_record(batch))


async def test_a_peer_of_an_unknown_frame_version_is_refused_with_one_clear_line(
    pair: tuple[Host, Host, Peer, StreamSender], caplog: pytest.LogCaptureFixture
) -> None:
    _host, _receiver, peer, _sender = pair
    await peer.start()
    caplog.set_level(logging.WARNING, "rallypoint.transport")
    reader, writer = await open_raw(peer.address, version=9)
    async with asyncio.timeout(5.0):
        assert await reader.read() == b""  # closed, nothing said in a version it may not read
    writer.close()
    lines = [r.getMessage() for r in caplog.records if "frame version 9" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "speaks peer frame version 9; this member speaks 1" in lines[0]


async def test_a_sender_names_a_listener_of_another_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def newer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        writer.write(frames.preamble(frames.KIND_RAFT, version=2))
        await reader.read(100)
        writer.close()

    server = await asyncio.start_server(newer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    host = Host(1, tmp_path)
    host.addresses[2] = f"127.0.0.1:{port}"
    sender = StreamSender(host, 2, None, random.Random(1))
    sender.start()
    caplog.set_level(logging.ERROR, "rallypoint.transport")
    try:
        sender.send(heartbeat(1))
        await wait_for(lambda: host.unreachable >= 1, 5.0, "the peer reported unreachable")
        assert any("speaks peer frame version 2" in r.getMessage() for r in caplog.records)
    finally:
        await sender.stop()
        for writer in accepted:
            writer.close()
        server.close()


async def test_an_old_member_speaking_grpc_is_named(
    pair: tuple[Host, Host, Peer, StreamSender], caplog: pytest.LogCaptureFixture
) -> None:
    _host, _receiver, peer, _sender = pair
    await peer.start()
    caplog.set_level(logging.WARNING, "rallypoint.transport")
    host, port = peer.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    async with asyncio.timeout(5.0):
        assert await reader.read() == b""
    writer.close()
    assert any("speaks gRPC" in r.getMessage() for r in caplog.records)


async def test_an_oversized_length_is_refused_from_the_header_alone(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    _host, receiver, peer, _sender = pair
    await peer.start()
    reader, writer, _challenge = await opened(peer.address)
    # The header only: a listener that meant to read 4 GiB would wait here for it.
    writer.write(struct.pack(">IB", 0xFFFF_FFFF, frames.BATCH))
    kind, body = await read_frame(reader)
    assert kind == frames.ERROR
    assert frames.decode_error(body)[0] == "UNAUTHENTICATED"
    writer.close()
    assert not receiver.delivered
    with pytest.raises(frames.FrameError, match="over the limit"):
        frames.parse_header(struct.pack(">IB", frames.MAX_FRAME_BYTES + 1, frames.BATCH))


async def test_a_replayed_frame_is_refused(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    host, receiver, peer, _sender = pair
    await peer.start()
    reader, writer, challenge = await opened(peer.address)
    recorded = stamped_batch(host, OutboundSession(host.peer_key, challenge), 1)
    writer.write(recorded)
    await wait_for(lambda: 1 in delivered_numbers(receiver), 5.0, "the first batch")
    writer.write(recorded)  # again, on its own connection
    kind, body = await read_frame(reader)
    assert kind == frames.ERROR
    code, message, reason = frames.decode_error(body)
    assert (code, reason) == ("PERMISSION_DENIED", "REPLAY"), message
    writer.close()
    # ... and on a new one.
    reader, writer, _ = await opened(peer.address)
    writer.write(recorded)
    kind, body = await read_frame(reader)
    assert frames.decode_error(body)[2] == "REPLAY"
    writer.close()
    assert [r for r, _ in receiver.refusals] == ["replay", "replay"]
    assert len([m for m in receiver.delivered]) == 1


async def test_garbage_after_the_header_is_refused_as_unauthenticated(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    _host, receiver, peer, _sender = pair
    await peer.start()
    reader, writer, _ = await opened(peer.address)
    writer.write(frames.frame(frames.BATCH, b"\xc1garbage"))
    _kind, body = await read_frame(reader)
    assert frames.decode_error(body)[:2] == ("UNAUTHENTICATED", "peer authentication failed")
    writer.close()
    assert not receiver.delivered


async def test_a_batch_whose_flag_overflows_is_refused_as_unauthenticated(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    """A boolean past a C long (msgpack holds up to 2**64 - 1) does not parse: refused like
    any unparsable frame (the protobuf record raised OverflowError, which ended the
    connection with nothing said)."""
    _host, receiver, peer, _sender = pair
    await peer.start()
    reader, writer, _ = await opened(peer.address)
    fields = [CLUSTER_ID, 1, 2, [], 0, 2**64 - 1, b"m" * 32, b"c" * 16, 1]
    writer.write(frames.frame(frames.BATCH, msgpack.packb(fields, use_bin_type=True)))
    _kind, body = await read_frame(reader)
    assert frames.decode_error(body)[:2] == ("UNAUTHENTICATED", "peer authentication failed")
    writer.close()
    assert not receiver.delivered


async def test_a_slow_sender_of_bytes_is_cut_off(
    pair: tuple[Host, Host, Peer, StreamSender], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rallypoint.coordinator.peerwire import server as server_module

    monkeypatch.setattr(server_module, "HANDSHAKE_TIMEOUT_S", 0.5)
    _host, _receiver, peer, _sender = pair
    await peer.start()
    reader, writer, _ = await opened(peer.address)
    writer.write(struct.pack(">IB", 100, frames.BATCH) + b"x")  # then nothing more
    async with asyncio.timeout(5.0):
        rest = await reader.read()  # closed by the listener, not by us
    assert rest == b""
    writer.close()


async def test_a_peer_that_stops_reading_is_reported_and_its_buffer_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(conn_module, "WRITE_STALL_S", 0.5)
    monkeypatch.setattr(conn_module, "WRITE_BUFFER_BYTES", 256 * 1024)
    stalled = asyncio.Event()

    async def never_reads(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await stalled.wait()

    host = Host(1, tmp_path)
    sender = StreamSender(host, 2, None, random.Random(1))
    sender.outbox_bytes_limit = 2 * 1024 * 1024
    peak = 0
    # A small receive window, so the sender's buffer fills.
    async with raft_listener(never_reads, receive_window=4096) as address:
        host.addresses[2] = address
        sender.start()
        try:
            for _ in range(400):
                sender.send(append_of(64 * 1024))
                peak = max(peak, sender.buffered_bytes)
                await asyncio.sleep(0.005)
                if sender.streams_broken:
                    break
            await wait_for(lambda: sender.streams_broken >= 1, 10.0, "the stalled connection end")
        finally:
            stalled.set()
            await sender.stop()
    assert host.unreachable >= 1
    # The outbox's bound, plus the socket buffer's high-water mark and one batch at most.
    assert peak <= 2 * 1024 * 1024 + 256 * 1024 + 8 * 1024 * 1024


async def test_a_connection_that_answers_no_keepalive_is_taken_for_lost(tmp_path: Path) -> None:
    silent = asyncio.Event()

    async def deaf(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):  # reads everything, answers nothing
            pass
        await silent.wait()

    host = Host(1, tmp_path)
    sender = StreamSender(host, 2, None, random.Random(1))
    async with raft_listener(deaf) as address:
        host.addresses[2] = address
        sender.start()
        try:
            sender.send(heartbeat(1))
            await wait_for(lambda: sender.streams_broken >= 1, 10 * KEEPALIVE_S, "a lost link")
            assert host.unreachable >= 1
        finally:
            silent.set()
            await sender.stop()


async def test_a_sender_outlives_an_unexpected_error_and_says_so(
    pair: tuple[Host, Host, Peer, StreamSender],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sender's connection that ends in an error no network fault explains (a bug) is
    logged, reported to Raft as a possible loss and dialled again. The sender's task once
    ended with it, silently: every later message to that peer stayed in the outbox, and the
    member could neither vote for the peer nor answer it."""
    host, receiver, peer, sender = pair
    await peer.start()
    assert await send_and_account(sender, host, receiver, 0)
    take_batch = sender._take_batch
    failures = [ValueError("a batch that cannot be encoded")]

    def failing_once(session: OutboundSession) -> bytes:
        if failures:
            raise failures.pop()
        return take_batch(session)

    monkeypatch.setattr(sender, "_take_batch", failing_once)
    unreachable = host.unreachable
    with caplog.at_level(logging.ERROR, logger="rallypoint.transport"):
        sender.send(heartbeat(1))
        await wait_for(lambda: host.unreachable > unreachable, 5.0, "the loss reported")
    assert "failed unexpectedly" in caplog.text, caplog.text
    # Raft sends again what may have been lost; this time it arrives.
    sender.send(heartbeat(2))
    await wait_for(lambda: 2 in delivered_numbers(receiver), 5.0, "heartbeat 2 delivered")
