"""Raft traffic between members over gRPC (service ``rallypoint.peer.v1.Raft``).

Theory of operation. Each member listens on its peer port (separate from the client port, so
faults, firewalls and TLS can be applied to each). For every other member it keeps one
:class:`PeerSender`: an outbox drained by a task that holds one long-lived ``Send`` stream
and writes everything queued as one ``MessageBatch``. Raft tolerates loss but must hear of
it: the outbox is bounded and drops the oldest messages when full, and a broken stream
costs the messages in flight; either way the sender reports the peer unreachable (so its
progress goes back to probing), and it reconnects after an exponential backoff with full
jitter (the client's policy, ``client/backoff.py``). A stream is opened only when there is
something to send. Each failure of a run of them is logged once, and the recovery with how
long it took.

Every stream is a session (peer_session.py): the receiver opens it with a fresh challenge in
its initial metadata, and the sender waits for it before writing, then stamps each request
with it and a counter under the MAC, so a recorded request cannot be replayed. A receiver
that sends no challenge within ``CHALLENGE_TIMEOUT_S`` (a member running the previous peer
format) is treated as unreachable, and the log says why.

``MsgSnap`` travels separately, by ``InstallSnapshot``: the snapshot is encoded in the
snapshot file format and streamed in chunks with the whole file's CRC32C. The receiver
assembles it with :class:`~rallypoint.raft.storage.snapshot_transfer.SnapshotReceiver` (a partial
file survives a broken stream; the sender resumes at the offset the receiver asks for) and
hands the verified snapshot to Raft. The outcome is reported back to Raft either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

import google_crc32c
import grpc
import grpc.aio

from rallypoint.client.backoff import Backoff
from rallypoint.proto.peer.v1 import peer_pb2, peer_pb2_grpc
from rallypoint.raft.codec import encode_message
from rallypoint.raft.storage.snapshotter import encode_snapshot_file
from rallypoint.raft.types import Message, MessageType, NodeId, Snapshot

from .peer_auth import (
    BATCH_TAG,
    CHUNK_TAG,
    LIVENESS_TAG,
    PeerKey,
    batch_fields,
    chunk_fields,
    liveness_fields,
)
from .peer_session import ChallengeError, OutboundSession, challenge_from_metadata

log = logging.getLogger("rallypoint.transport")

SNAPSHOT_CHUNK_BYTES = 1024 * 1024
# Streams one snapshot transfer may open (resuming where the last stopped) before it gives up,
# and the wait before each after an unreachable peer.
SNAPSHOT_ATTEMPTS = 8
SNAPSHOT_BACKOFF = Backoff(base_s=0.1, cap_s=1.0)
OUTBOX_LIMIT = 4096
# The longest wait between attempts to reach a peer that is down: a restarted member is
# reached within about this (plus gRPC's own reconnect backoff, capped below as well).
RECONNECT_CAP_S = 0.5
RECONNECT_BACKOFF = Backoff(base_s=0.05, cap_s=RECONNECT_CAP_S)
# How long a sender waits for the receiver's session challenge once a stream is open.
CHALLENGE_TIMEOUT_S = 5.0
# gRPC's default 4 MiB cap is too small for a batch of large entries.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # A connection whose packets were dropped (a partition) keeps them in TCP's retransmission
    # backoff for seconds after the network heals; a peer stream only sends, so nothing else
    # tells the sender. A ping every second, answered within a second, finds such a
    # connection within about two seconds, and a new one is made at once.
    ("grpc.keepalive_time_ms", 1_000),
    ("grpc.keepalive_timeout_ms", 1_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    # ... and a server accepts those pings (else it ends the connection after a few).
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),
    # Reconnect quickly after a peer restarts; our own backoff paces the retries. A
    # connection attempt gives up after a second (the default, 20 s, can outlast a healed
    # partition by the length of a SYN's retransmission backoff).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 1_000),
]


class PeerEnd(Protocol):
    """A member as either end of the peer port sees it."""

    @property
    def member_id(self) -> int: ...

    @property
    def cluster_id(self) -> int: ...

    @property
    def peer_key(self) -> PeerKey: ...

    @property
    def incarnation(self) -> int: ...


class PeerHost(PeerEnd, Protocol):
    """What the sending side needs from its member."""

    @property
    def abstaining(self) -> bool: ...

    def peer_address(self, member_id: int) -> str | None: ...

    def report_unreachable(self, member_id: int) -> None: ...

    def report_snapshot(self, member_id: int, ok: bool) -> None: ...


async def open_session(
    call: grpc.aio.Call, key: PeerKey, timeout_s: float = CHALLENGE_TIMEOUT_S
) -> OutboundSession:
    """The sending end of the session of a stream just opened: waits for the receiver's
    challenge. Raises the call's own error if it ended first, ChallengeError if it sent
    none (a member running the previous peer format)."""
    try:
        async with asyncio.timeout(timeout_s):
            metadata = await call.initial_metadata()
    except TimeoutError:
        raise ChallengeError(
            f"it sent no session challenge within {timeout_s:.0f} s (a member running peer "
            "format version 1 sends none: upgrade it)"
        ) from None
    challenge = challenge_from_metadata(metadata)
    if challenge is None:
        if call.done():
            await call  # type: ignore[misc]  # raises the status that ended it
        raise ChallengeError(
            "it opened the stream without a session challenge (a member running peer format "
            "version 1: upgrade it)"
        )
    return OutboundSession(key, challenge)


class PeerTransport(Protocol):
    """What the member needs of its peer transport (this module's, or ``peerwire``'s)."""

    def send(self, messages: tuple[Message, ...] | list[Message]) -> None: ...

    async def hello(
        self, address: str, request: peer_pb2.HelloRequest, timeout_s: float
    ) -> peer_pb2.HelloAnswer | None: ...

    async def liveness(self, member_id: int, payload: bytes, timeout_s: float = 2.0) -> bool: ...

    async def remove_peer(self, member_id: int) -> None: ...

    async def stop(self) -> None: ...


class PeerServer(Protocol):
    """A running peer port (a grpc server, or ``peerwire``'s listener)."""

    async def stop(self, grace: float | None) -> None: ...


class PeerSender:
    """Delivers messages to one peer over a long-lived stream; see the module docstring.

    Invariant: only the ``_run`` task takes messages out of ``_outbox``, and it writes each
    batch it takes to the one stream it holds, with grpc's write API. (A request iterator
    is never used for the outbox: grpc leaves the iterator of a failed stream parked, and it
    would take, then lose, a later batch.) Whenever messages may have been lost (a stream
    broke, the outbox overflowed, the peer has no address) Raft is told with
    ``report_unreachable``, so its replication to the peer falls back to probing.
    """

    def __init__(
        self,
        host: PeerHost,
        peer_id: int,
        channel_factory: Callable[[str], grpc.aio.Channel],
        rng: random.Random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._host = host
        self._peer_id = peer_id
        self._channel_factory = channel_factory
        self._rng = rng
        self._clock = clock
        # Invariant: at most OUTBOX_LIMIT messages; MsgSnap never enters it.
        self._outbox: deque[Message] = deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._snapshot_task: asyncio.Task[None] | None = None
        self._channel: grpc.aio.Channel | None = None
        self._channel_address: str | None = None
        self._closing: set[asyncio.Task[None]] = set()
        # When the current run of failed streams began; None while the peer is reachable.
        self._failing_since: float | None = None
        self._failed_streams = 0
        self.dropped = 0  # messages dropped because the outbox was full
        self.streams_broken = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for task in (self._task, self._snapshot_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._channel is not None:
            await self._channel.close(grace=None)

    def send(self, message: Message) -> None:
        if message.type is MessageType.MsgSnap:
            self._start_snapshot(message)
            return
        if len(self._outbox) >= OUTBOX_LIMIT:
            self._outbox.popleft()
            self.dropped += 1
            self._host.report_unreachable(self._peer_id)
        self._outbox.append(message)
        self._wakeup.set()

    def _channel_for(self, address: str) -> grpc.aio.Channel:
        if self._channel is None or address != self._channel_address:
            if self._channel is not None:
                old = self._channel
                closing = asyncio.get_running_loop().create_task(old.close(grace=None))
                self._closing.add(closing)  # referenced until done
                closing.add_done_callback(self._closing.discard)
            self._channel = self._channel_factory(address)
            self._channel_address = address
        return self._channel

    def _channel_for_peer(self) -> grpc.aio.Channel | None:
        address = self._host.peer_address(self._peer_id)
        return None if address is None else self._channel_for(address)

    def _take_batch(self, session: OutboundSession) -> peer_pb2.MessageBatch:
        encoded = [encode_message(m) for m in self._outbox]
        self._outbox.clear()
        host = self._host
        batch = peer_pb2.MessageBatch(
            cluster_id=host.cluster_id,
            from_id=host.member_id,
            to_id=self._peer_id,
            messages=encoded,
            incarnation=host.incarnation,
            abstaining=host.abstaining,
        )
        stamp = session.stamp(BATCH_TAG, batch_fields(batch))
        batch.challenge, batch.counter, batch.mac = stamp.challenge, stamp.counter, stamp.mac
        return batch

    async def _wait_for_messages(self) -> None:
        while not self._outbox:
            self._wakeup.clear()
            await self._wakeup.wait()

    async def _run(self) -> None:
        attempt = 0
        while True:
            # A stream is opened only when there is something to send: a peer that is down
            # costs nothing until Raft has a message for it.
            await self._wait_for_messages()
            address = self._host.peer_address(self._peer_id)
            if address is None:
                lost = len(self._outbox)
                self._outbox.clear()
                self._host.report_unreachable(self._peer_id)
                self._note_failure(f"no address is known for it; {lost} messages dropped")
                continue
            opened, reason = await self._stream(self._channel_for(address), address)
            # Whatever the stream carried may be lost: Raft probes again from what it knows.
            self._host.report_unreachable(self._peer_id)
            self.streams_broken += 1
            self._note_failure(reason, address)
            attempt = 0 if opened else attempt + 1
            await asyncio.sleep(RECONNECT_BACKOFF.delay_s(attempt, self._rng))

    async def _stream(self, channel: grpc.aio.Channel, address: str) -> tuple[bool, str]:
        """Write batches to one ``Send`` stream until it ends; return whether it ever
        carried a batch, and why it ended."""
        # No request iterator: batches go through call.write (see the class docstring).
        call = peer_pb2_grpc.RaftStub(channel).Send(None)
        call.add_done_callback(lambda _call: self._wakeup.set())
        opened = False
        try:
            session = await open_session(call, self._host.peer_key)
            while True:
                while not self._outbox and not call.done():
                    self._wakeup.clear()
                    await self._wakeup.wait()
                if call.done():
                    await call  # raises the status that ended it
                    return opened, "the peer closed the stream"
                if self._host.peer_address(self._peer_id) != address:
                    return opened, "its address changed"
                await call.write(self._take_batch(session))
                if not opened:
                    opened = True
                    self._note_restored(address)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.FAILED_PRECONDITION:
                log.error(
                    "member %d: member %d refused our traffic: %s",
                    self._host.member_id,
                    self._peer_id,
                    exc.details(),
                )
            return opened, f"{exc.code().name}: {exc.details()}"
        except ChallengeError as exc:
            return opened, str(exc)
        except asyncio.InvalidStateError:
            return opened, "the stream had already ended"
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this sender is stopping
            # grpc raises CancelledError for a call cancelled under us (its channel closed).
            return opened, "the stream was cancelled"
        finally:
            if not call.done():
                call.cancel()

    def _note_failure(self, reason: str, address: str | None = None) -> None:
        """Log the first failure of a run of them (the rest at debug): one line a fault."""
        self._failed_streams += 1
        if self._failing_since is None:
            self._failing_since = self._clock()
            log.warning(
                "member %d: lost the stream to member %d%s: %s; retrying",
                self._host.member_id,
                self._peer_id,
                f" at {address}" if address else "",
                reason,
            )
        else:
            log.debug(
                "member %d: stream to member %d: %s", self._host.member_id, self._peer_id, reason
            )

    def _note_restored(self, address: str) -> None:
        if self._failing_since is not None:
            log.info(
                "member %d: stream to member %d at %s restored after %.1f s (%d failed streams)",
                self._host.member_id,
                self._peer_id,
                address,
                self._clock() - self._failing_since,
                self._failed_streams,
            )
        self._failing_since = None
        self._failed_streams = 0

    # -- snapshots ------------------------------------------------------------------------

    def _start_snapshot(self, message: Message) -> None:
        if self._snapshot_task is not None and not self._snapshot_task.done():
            # One transfer at a time. Raft holds the peer in snapshot state until the running
            # transfer reports its outcome (always, in its ``finally``), then sends again if
            # it still needs to: nothing is lost by dropping this one.
            return
        self._snapshot_task = asyncio.get_running_loop().create_task(self._send_snapshot(message))

    async def _send_snapshot(self, message: Message) -> None:
        assert message.snapshot is not None
        snapshot = message.snapshot
        file_bytes = b"".join(encode_snapshot_file(snapshot))
        whole_crc = google_crc32c.value(file_bytes)
        header = encode_message(
            Message(
                type=message.type,
                to=message.to,
                from_=message.from_,
                term=message.term,
                snapshot=Snapshot(b"", snapshot.metadata),
            )
        )
        ok = False
        offset = 0
        try:
            for attempt in range(SNAPSHOT_ATTEMPTS):
                channel = self._channel_for_peer()
                if channel is None:
                    break
                try:
                    ack = await self._snapshot_stream(
                        channel, snapshot, file_bytes, whole_crc, header, offset
                    )
                except grpc.aio.AioRpcError as exc:
                    # Unreachable for now (a restarting peer, a channel in backoff): try
                    # again shortly; anything else is the receiver's verdict on the data.
                    if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                        raise
                    if attempt == SNAPSHOT_ATTEMPTS - 1:
                        raise
                    await asyncio.sleep(SNAPSHOT_BACKOFF.delay_s(attempt, self._rng))
                    continue
                if ack.complete:
                    ok = True
                    break
                offset = ack.next_offset
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "member %d: snapshot to member %d failed: %s %s",
                self._host.member_id,
                self._peer_id,
                exc.code().name,
                exc.details(),
            )
        except ChallengeError as exc:
            log.warning(
                "member %d: snapshot to member %d failed: %s",
                self._host.member_id,
                self._peer_id,
                exc,
            )
        finally:
            self._host.report_snapshot(self._peer_id, ok)

    async def _snapshot_stream(
        self,
        channel: grpc.aio.Channel,
        snapshot: Snapshot,
        file_bytes: bytes,
        whole_crc: int,
        header: bytes,
        offset: int,
    ) -> peer_pb2.SnapshotAck:
        """One ``InstallSnapshot`` stream from ``offset``: its session first, then chunks."""
        call = peer_pb2_grpc.RaftStub(channel).InstallSnapshot(None)
        try:
            session = await open_session(call, self._host.peer_key)
            for chunk in self._chunks(session, snapshot, file_bytes, whole_crc, header, offset):
                await call.write(chunk)
            await call.done_writing()
            ack: peer_pb2.SnapshotAck = await call
            return ack
        except asyncio.InvalidStateError:
            # The receiver ended the stream while we wrote: its status says why.
            ended: peer_pb2.SnapshotAck = await call
            return ended
        finally:
            if not call.done():
                call.cancel()

    def _chunks(
        self,
        session: OutboundSession,
        snapshot: Snapshot,
        file_bytes: bytes,
        whole_crc: int,
        header: bytes,
        offset: int,
    ) -> Iterator[peer_pb2.SnapshotChunk]:
        total = len(file_bytes)
        first = True
        host = self._host
        while True:
            end = min(total, offset + SNAPSHOT_CHUNK_BYTES)
            chunk = peer_pb2.SnapshotChunk(
                cluster_id=host.cluster_id,
                from_id=host.member_id,
                to_id=self._peer_id,
                snapshot_index=snapshot.metadata.index,
                snapshot_term=snapshot.metadata.term,
                offset=offset,
                data=file_bytes[offset:end],
                total_size=total,
                crc32c=whole_crc,
                message=header if first else b"",
                incarnation=host.incarnation,
            )
            stamp = session.stamp(CHUNK_TAG, chunk_fields(chunk))
            chunk.challenge, chunk.counter, chunk.mac = stamp.challenge, stamp.counter, stamp.mac
            yield chunk
            first = False
            offset = end
            if offset >= total:
                return


class Transport:
    """All of a member's peer senders, created on demand from the member table."""

    def __init__(
        self,
        host: PeerHost,
        rng: random.Random,
        channel_factory: Callable[[str], grpc.aio.Channel] | None = None,
    ) -> None:
        self._host = host
        self._rng = rng
        self._channel_factory = channel_factory or (
            lambda address: grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
        )
        self._senders: dict[int, PeerSender] = {}
        # Liveness report streams, by address (apart from Raft's streams).
        self._report_links: dict[str, LivenessLink] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        """A new channel to ``address`` (plain or TLS, as this member's peers use)."""
        return self._channel_factory(address)

    async def hello(
        self, address: str, request: peer_pb2.HelloRequest, timeout_s: float
    ) -> peer_pb2.HelloAnswer | None:
        """Ask ``address`` Hello (peer_hello.py); its answer, or None when none came."""
        channel = self._channel_factory(address)
        try:
            answer: peer_pb2.HelloAnswer = await peer_pb2_grpc.RaftStub(channel).Hello(
                request, timeout=timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            log.debug("no hello answer from %s: %s", address, exc)
            return None
        finally:
            await channel.close(grace=None)
        return answer

    def send(self, messages: tuple[Message, ...] | list[Message]) -> None:
        for message in messages:
            sender = self._senders.get(message.to)
            if sender is None:
                sender = PeerSender(self._host, message.to, self._channel_factory, self._rng)
                sender.start()
                self._senders[message.to] = sender
            sender.send(message)

    async def liveness(self, member_id: int, payload: bytes, timeout_s: float = 2.0) -> bool:
        """Send ``member_id`` (the leader) a liveness report; whether it took it. Raises
        the RPC's error when it fails (the caller says everything again next time)."""
        address = self._host.peer_address(member_id)
        if address is None:
            return False
        link = self._report_links.get(address)
        if link is None:
            link = self._report_links[address] = LivenessLink(
                self._host, self._channel_factory(address)
            )
        return await link.report(member_id, payload, timeout_s)

    async def remove_peer(self, member_id: int) -> None:
        sender = self._senders.pop(NodeId(member_id), None)
        if sender is not None:
            await sender.stop()

    async def stop(self) -> None:
        senders, self._senders = list(self._senders.values()), {}
        for sender in senders:
            await sender.stop()
        links, self._report_links = list(self._report_links.values()), {}
        for link in links:
            await link.close()


class LivenessLink:
    """One long-lived ``Liveness`` stream to a member, opened on demand and again after it
    fails: one report at a time, each answered by one ack in order."""

    def __init__(self, host: PeerEnd, channel: grpc.aio.Channel) -> None:
        self._host = host
        self._channel = channel
        self._call: grpc.aio.StreamStreamCall | None = None  # type: ignore[type-arg]
        self._session: OutboundSession | None = None
        self._lock = asyncio.Lock()

    async def report(self, member_id: int, payload: bytes, timeout_s: float) -> bool:
        """Whether ``member_id`` took the report; raises the stream's error (AioRpcError,
        ChallengeError, TimeoutError) when it fails, after which the next report opens a
        new stream."""
        async with self._lock:
            try:
                async with asyncio.timeout(timeout_s):
                    return await self._report(member_id, payload)
            except BaseException:
                self._drop()
                raise

    async def _report(self, member_id: int, payload: bytes) -> bool:
        host = self._host
        if self._call is None or self._session is None or self._call.done():
            self._drop()
            self._call = peer_pb2_grpc.RaftStub(self._channel).Liveness(None)
            self._session = await open_session(self._call, host.peer_key)
        request = peer_pb2.LivenessReport(
            cluster_id=host.cluster_id, from_id=host.member_id, to_id=member_id, payload=payload
        )
        stamp = self._session.stamp(LIVENESS_TAG, liveness_fields(request))
        request.challenge, request.counter, request.mac = stamp.challenge, stamp.counter, stamp.mac
        await self._call.write(request)
        ack = await self._call.read()
        if not isinstance(ack, peer_pb2.LivenessAck):  # EOF: the member ended the stream
            code, details = await self._call.code(), await self._call.details()
            raise ConnectionError(f"the liveness stream ended: {code.name} {details}")
        return bool(ack.taken)

    def _drop(self) -> None:
        if self._call is not None and not self._call.done():
            self._call.cancel()
        self._call = None
        self._session = None

    async def close(self) -> None:
        self._drop()
        await self._channel.close(grace=None)
