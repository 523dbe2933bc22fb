"""The sending side of the stream peer protocol: Raft traffic, snapshots, liveness, hellos.

Theory of operation (as the gRPC transport's, ``coordinator/transport.py``, whose interface
this keeps). For every other member :class:`StreamSender` keeps an outbox of encoded Raft
messages, drained by one task that holds one long-lived connection (kind ``RAFT``): each
time the socket can take more, everything queued goes out as one ``BATCH`` frame, so a busy
socket batches what queued behind it. What the member sends while that connection is open
and idle (it has carried a batch, the socket holds none of our bytes) is written in the
sending call itself, one ``BATCH`` per call and peer (:meth:`StreamSender.flush`): a
follower's ack and a leader's append leave in the turn of the event loop that made them,
not the task's next one; a write the socket cannot take whole, or that fails, goes back to
the task, which waits for the socket to drain or ends the connection. Memory for a peer is
bounded: the outbox holds at most ``OUTBOX_LIMIT`` messages and ``OUTBOX_BYTES`` bytes (the
oldest are dropped past either), and the connection's unsent bytes at most its high-water
mark plus one batch (conn.py): a peer that stops reading is found when a write waits longer
than ``WRITE_STALL_S``, and its connection ends. A commit notice may wait up to
``COMMIT_NOTICE_HOLD_S`` for the next message to its peer and go out in the same batch
(``notice_hold.py``: never for a peer waiting on its own apply to answer a request it
forwarded).

Raft tolerates loss but must hear of it: whenever messages may have been lost (a dropped
message, a connection that ended, no address for the peer) the sender reports the peer
unreachable, so its progress goes back to probing, and it dials again after an exponential
backoff with full jitter. A connection is opened only when there is something to send. An
idle connection sends ``PING`` every ``KEEPALIVE_S``; one that has heard nothing (no
``PONG``) for ``KEEPALIVE_TIMEOUT_S`` since is taken for lost (a partition whose packets were
dropped says nothing else). Each failure of a run of them is logged once, and the recovery
with how long it took.

``MsgSnap`` travels on a connection of its own (kind ``SNAPSHOT``), in chunks of the snapshot
file with the whole file's CRC32C, resuming where the receiver says it stopped; the outcome
is reported to Raft either way. Liveness reports have a connection of their own
(``liveness_link.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterator

import google_crc32c
from google.protobuf.message import Message as ProtoMessage

from rallypoint.proto.peer.v1 import peer_pb2
from rallypoint.raft.codec import encode_message
from rallypoint.raft.storage.snapshotter import encode_snapshot_file
from rallypoint.raft.types import Message, MessageType, NodeId, Snapshot

from ..peer_auth import (
    BATCH_TAG,
    CHUNK_TAG,
    batch_parts,
    chunk_fields,
)
from ..peer_lookup import AddressLookup
from ..peer_session import ChallengeError, OutboundSession
from ..transport import (
    OUTBOX_LIMIT,
    RECONNECT_BACKOFF,
    SNAPSHOT_ATTEMPTS,
    SNAPSHOT_BACKOFF,
    SNAPSHOT_CHUNK_BYTES,
    PeerHost,
)
from .conn import ConnectionLost, FrameConn, PeerError, dial
from .frames import (
    BATCH,
    CHUNK,
    ERROR,
    HELLO,
    HELLO_ANSWER,
    KIND_HELLO,
    KIND_MEMBERS,
    KIND_RAFT,
    KIND_SNAPSHOT,
    MEMBERS,
    MEMBERS_ANSWER,
    PING,
    PONG,
    SNAPSHOT_ACK,
    FrameError,
    P,
    VersionError,
    decode_error,
    decode_record,
    encode_batch,
    encode_record,
)
from .liveness_link import StreamLivenessLink
from .notice_hold import COMMIT_NOTICE_HOLD_S, NoticeHold

log = logging.getLogger("rallypoint.transport")

# Bytes of encoded messages an outbox may hold (besides OUTBOX_LIMIT messages).
OUTBOX_BYTES = 64 * 1024 * 1024
# The most bytes of messages one BATCH frame carries (the rest go in the next).
BATCH_BYTES = 8 * 1024 * 1024
KEEPALIVE_S = 1.0
KEEPALIVE_TIMEOUT_S = 2.0

# Failures that end a connection: each means messages may have been lost.
LOST = (ConnectionLost, PeerError, FrameError, ChallengeError, ConnectionError, OSError)


class _Direct:
    """A connection :meth:`StreamSender.flush` may write to, and what it saw doing so."""

    __slots__ = ("address", "conn", "lost", "session", "undrained", "wrote_at")

    def __init__(self, conn: FrameConn, session: OutboundSession, address: str) -> None:
        self.conn, self.session, self.address = conn, session, address
        self.wrote_at = 0.0  # the loop's time of the last batch written directly
        self.lost: str | None = None  # why a direct write failed
        self.undrained = False  # a direct write left bytes in the socket's buffer


class StreamSender:
    """Delivers messages to one peer over a long-lived connection; see the module docstring.

    Invariant: only the ``_run`` task takes messages out of ``_outbox``; ``_outbox_bytes`` is
    the sum of their lengths."""

    def __init__(
        self,
        host: PeerHost,
        peer_id: int,
        ssl_context: ssl.SSLContext | None,
        rng: random.Random,
        clock: Callable[[], float] = time.monotonic,
        no_address: Callable[[int], None] | None = None,
    ) -> None:
        self._host = host
        self._peer_id = peer_id
        # Told when there are messages for the peer and no address for it (peer_lookup.py).
        self._no_address = no_address
        self._ssl = ssl_context
        self._rng = rng
        self._clock = clock
        self._outbox: deque[bytes] = deque()
        self._outbox_bytes = 0
        self.hold = NoticeHold()
        self._hold_timer: asyncio.TimerHandle | None = None
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._snapshot_task: asyncio.Task[None] | None = None
        self._conn: FrameConn | None = None
        # The open connection while :meth:`flush` may write to it directly.
        self._direct: _Direct | None = None
        self._failing_since: float | None = None
        self._failed_streams = 0
        self.dropped = 0  # messages dropped because the outbox was full
        self.streams_broken = 0
        self.outbox_limit = OUTBOX_LIMIT
        self.outbox_bytes_limit = OUTBOX_BYTES

    @property
    def buffered_bytes(self) -> int:
        """What this peer holds in memory: the outbox and the connection's unsent bytes."""
        conn = self._conn
        return self._outbox_bytes + (0 if conn is None else conn.buffered)

    @property
    def queued(self) -> bool:
        """Messages wait in the outbox for the task."""
        return bool(self._outbox)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._hold_timer is not None:
            self._hold_timer.cancel()
        for task in (self._task, self._snapshot_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._conn is not None:
            self._conn.close()

    def send(self, message: Message) -> None:
        """Queue ``message`` for the sender's task (it writes what queued as one batch)."""
        self.offer(message)
        if self._outbox:
            self._wakeup.set()

    def offer(self, message: Message) -> None:
        """Queue ``message``, to be written by :meth:`flush` or the task it wakes."""
        # A commit notice may wait for the next message to this peer (notice_hold.py).
        hold = self.hold
        now, began = hold.offer(message)
        if began or hold.held is None:
            if self._hold_timer is not None:
                self._hold_timer.cancel()
                self._hold_timer = None
            if began:
                self._hold_timer = asyncio.get_running_loop().call_later(
                    COMMIT_NOTICE_HOLD_S, self._hold_due
                )
        for m in now:
            self._enqueue(m)

    def await_commit(self, index: int) -> None:
        """The peer waits to see ``index`` committed: hold no commit notice until it has
        been sent that far (a proposal it forwarded; notice_hold.py)."""
        self.hold.await_commit(index)

    def _hold_due(self) -> None:
        self._hold_timer = None
        held = self.hold.release()
        if held is not None:
            self._enqueue(held)
            self.flush()

    def flush(self) -> None:
        """Write what is queued now, as one batch, when the connection can take it at once:
        it has carried a batch, the socket holds none of our bytes and the peer's address is
        the one dialled. Otherwise (or if the write fails) the task is woken to do it: it
        dials, waits for the socket to drain, or ends the connection and reports the loss.
        Written here, a message leaves in the caller's turn of the event loop instead of the
        task's next one (a follower's ack, a leader's append: one wake-up of the loop fewer
        on a write's way through the members)."""
        if not self._outbox:
            return
        direct = self._direct
        if (
            direct is not None
            and not direct.conn.buffered
            and self._host.peer_address(self._peer_id) == direct.address
        ):
            try:
                direct.conn.write(BATCH, self._take_batch(direct.session))
            except LOST as exc:
                # The messages taken may be lost: the task ends the connection, which
                # reports the peer unreachable.
                self._direct = None
                direct.lost = str(exc) or repr(exc)
            else:
                direct.wrote_at = asyncio.get_running_loop().time()
                if not direct.conn.buffered:
                    return
                self._direct = None  # the task waits for the socket to take the rest
                direct.undrained = True
        self._wakeup.set()

    def _enqueue(self, message: Message) -> None:
        if message.type is MessageType.MsgSnap:
            self._start_snapshot(message)
            return
        encoded = encode_message(message)
        dropped = 0
        while self._outbox and (
            len(self._outbox) >= self.outbox_limit
            or self._outbox_bytes + len(encoded) > self.outbox_bytes_limit
        ):
            self._outbox_bytes -= len(self._outbox.popleft())
            dropped += 1
        if dropped:
            self.dropped += dropped
            self._host.report_unreachable(self._peer_id)
        self._outbox.append(encoded)
        self._outbox_bytes += len(encoded)

    def _take_batch(self, session: OutboundSession) -> bytes:
        taken: list[bytes] = []
        size = 0
        outbox = self._outbox
        while outbox and (not taken or size + len(outbox[0]) <= BATCH_BYTES):
            message = outbox.popleft()
            taken.append(message)
            size += len(message)
        self._outbox_bytes -= size
        host = self._host
        # The MessageBatch's fields, signed and encoded as the record would be (no protobuf
        # object: frames.encode_batch makes the same bytes).
        cluster_id, from_id, to_id = host.cluster_id, host.member_id, self._peer_id
        incarnation, abstaining = host.incarnation, host.abstaining
        stamp = session.stamp(
            BATCH_TAG, batch_parts(cluster_id, from_id, to_id, incarnation, abstaining, taken)
        )
        return encode_batch(
            cluster_id,
            from_id,
            to_id,
            taken,
            incarnation,
            abstaining,
            stamp.mac,
            stamp.challenge,
            stamp.counter,
        )

    async def _run(self) -> None:
        attempt = 0
        while True:
            # A connection is opened only when there is something to send.
            while not self._outbox:
                self._wakeup.clear()
                await self._wakeup.wait()
            address = self._host.peer_address(self._peer_id)
            if address is None:
                lost = len(self._outbox)
                self._outbox.clear()
                self._outbox_bytes = 0
                self._host.report_unreachable(self._peer_id)
                asking = ""
                if self._no_address is not None:
                    self._no_address(self._peer_id)
                    asking = "; asking the other members"
                self._note_failure(f"no address is known for it; {lost} messages dropped{asking}")
                continue
            try:
                opened, reason = await self._connection(address)
            except Exception as exc:
                # Not a network fault but a bug: the sender must outlive it, or every later
                # message to this peer would wait in the outbox, unsent and unreported (a
                # member that can neither vote for nor answer the peer, forever).
                log.error(
                    "member %d: the stream to member %d failed unexpectedly: %r",
                    self._host.member_id,
                    self._peer_id,
                    exc,
                    exc_info=exc,
                )
                opened, reason = False, f"unexpected error: {exc!r}"
            # Whatever the connection carried may be lost: Raft probes again.
            self._host.report_unreachable(self._peer_id)
            self.streams_broken += 1
            self._note_failure(reason, address)
            attempt = 0 if opened else attempt + 1
            await asyncio.sleep(RECONNECT_BACKOFF.delay_s(attempt, self._rng))

    async def _connection(self, address: str) -> tuple[bool, str]:
        """Write batches on one connection until it ends; whether it ever carried one, and
        why it ended."""
        opened = False
        try:
            conn, challenge = await dial(address, KIND_RAFT, self._ssl, session=True)
        except VersionError as exc:
            return False, self._refused(str(exc))
        except PeerError as exc:
            return False, self._refused_by(exc)
        except LOST as exc:
            return False, str(exc)
        self._conn = conn
        session = OutboundSession(self._host.peer_key, challenge)
        heard = [self._clock()]
        loop = asyncio.get_running_loop()
        reader = loop.create_task(self._read(conn, heard))
        reader.add_done_callback(lambda _task: self._wakeup.set())
        # One keepalive timer per connection, not one per idle wait: it wakes the loop below,
        # which pings if the connection has been idle KEEPALIVE_S since its last frame, and
        # otherwise re-arms it for then (a timer armed in an earlier idle spell fires early).
        keepalive: asyncio.TimerHandle | None = None

        def keepalive_due() -> None:
            nonlocal keepalive
            keepalive = None
            self._wakeup.set()

        direct = _Direct(conn, session, address)
        try:
            while True:
                pinged = False
                ping_at = loop.time() + KEEPALIVE_S
                while not self._outbox and not reader.done():
                    if direct.lost is not None:
                        return opened, direct.lost
                    if direct.undrained:
                        direct.undrained = False
                        await conn.drain()
                        continue  # what queued meanwhile goes out first
                    if opened:
                        self._direct = direct  # flush() may write while this task waits
                    self._wakeup.clear()
                    if keepalive is None:
                        keepalive = loop.call_at(ping_at, keepalive_due)
                    await self._wakeup.wait()
                    if self._outbox or reader.done() or direct.lost is not None:
                        continue
                    if direct.wrote_at + KEEPALIVE_S > ping_at:
                        # Batches went out directly since: idle only from the last of them.
                        pinged = False
                        ping_at = direct.wrote_at + KEEPALIVE_S
                    if loop.time() < ping_at:
                        continue
                    if self._clock() - heard[0] > KEEPALIVE_TIMEOUT_S + KEEPALIVE_S and pinged:
                        return opened, "no answer to keepalive pings"
                    conn.write(PING)
                    pinged = True
                    ping_at = loop.time() + KEEPALIVE_S
                if reader.done():
                    reader.result()  # raises what ended it
                    return opened, "the peer closed the connection"
                if direct.lost is not None:
                    return opened, direct.lost
                if self._host.peer_address(self._peer_id) != address:
                    return opened, "its address changed"
                conn.write(BATCH, self._take_batch(session))
                await conn.drain()
                if not opened:
                    opened = True
                    self._note_restored(address)
        except PeerError as exc:
            return opened, self._refused_by(exc)
        except LOST as exc:
            return opened, str(exc)
        finally:
            self._direct = None
            if keepalive is not None:
                keepalive.cancel()
            reader.cancel()
            self._conn = None
            conn.close()

    async def _read(self, conn: FrameConn, heard: list[float]) -> None:
        """What the listener sends on a Raft connection: PONGs, or one ERROR before it
        closes it."""
        while True:
            kind, body = await conn.read()
            heard[0] = self._clock()
            if kind == ERROR:
                raise PeerError(*decode_error(body))
            if kind != PONG:
                raise FrameError(f"a frame of type {kind} from the listener")

    def _refused_by(self, exc: PeerError) -> str:
        if exc.code == "FAILED_PRECONDITION":
            return self._refused(exc.message)
        return f"{exc.code}: {exc.message}"

    def _refused(self, why: str) -> str:
        log.error(
            "member %d: member %d refused our traffic: %s",
            self._host.member_id,
            self._peer_id,
            why,
        )
        return why

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
                "member %d: stream to member %d: %s",
                self._host.member_id,
                self._peer_id,
                reason,
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
            # One transfer at a time; the running one reports its outcome (always), and Raft
            # sends again if it still needs to.
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
                address = self._host.peer_address(self._peer_id)
                if address is None:
                    if self._no_address is not None:
                        self._no_address(self._peer_id)
                    break
                try:
                    ack = await self._snapshot_once(
                        address, snapshot, file_bytes, whole_crc, header, offset
                    )
                except (ConnectionLost, ConnectionError, OSError, PeerError) as exc:
                    # Unreachable for now (a restarting peer): try again shortly; anything
                    # else the receiver said is its verdict on the data.
                    unavailable = not isinstance(exc, PeerError) or exc.code == "UNAVAILABLE"
                    if not unavailable or attempt == SNAPSHOT_ATTEMPTS - 1:
                        raise
                    await asyncio.sleep(SNAPSHOT_BACKOFF.delay_s(attempt, self._rng))
                    continue
                if ack.complete:
                    ok = True
                    break
                offset = ack.next_offset
        except (*LOST, VersionError) as exc:
            log.warning(
                "member %d: snapshot to member %d failed: %s",
                self._host.member_id,
                self._peer_id,
                exc,
            )
        finally:
            self._host.report_snapshot(self._peer_id, ok)

    async def _snapshot_once(
        self,
        address: str,
        snapshot: Snapshot,
        file_bytes: bytes,
        whole_crc: int,
        header: bytes,
        offset: int,
    ) -> peer_pb2.SnapshotAck:
        """One transfer connection from ``offset``: chunks, then the receiver's ack."""
        conn, challenge = await dial(address, KIND_SNAPSHOT, self._ssl, session=True)
        # The receiver may answer before the last chunk (the offset it expects, or a
        # refusal): the answer is read while the chunks go out.
        answer = asyncio.get_running_loop().create_task(conn.read_expecting(SNAPSHOT_ACK, None))
        try:
            session = OutboundSession(self._host.peer_key, challenge)
            for chunk in self._chunks(session, snapshot, file_bytes, whole_crc, header, offset):
                if answer.done():
                    break
                conn.write(CHUNK, encode_record(chunk))
                try:
                    await conn.drain()
                except ConnectionLost:
                    if not answer.done():
                        raise
            body = await answer
            return decode_record(peer_pb2.SnapshotAck, body)
        finally:
            answer.cancel()
            conn.close()

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


class StreamTransport:
    """All of a member's peer senders on the stream protocol, created on demand."""

    def __init__(
        self, host: PeerHost, rng: random.Random, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self._host = host
        self._rng = rng
        self._ssl = ssl_context
        self._senders: dict[int, StreamSender] = {}
        self._report_links: dict[str, StreamLivenessLink] = {}
        self._stopped = False
        self.lookup = AddressLookup(
            host.member_id,
            host.cluster_id,
            host.peer_key,
            self.members,
            host.peer_addresses,
            host.learn_peer_address,
        )

    def sender(self, peer_id: int) -> StreamSender:
        sender = self._senders.get(peer_id)
        if sender is None:
            sender = StreamSender(
                self._host, peer_id, self._ssl, self._rng, no_address=self.lookup.want
            )
            sender.start()
            self._senders[peer_id] = sender
        return sender

    def send(self, messages: tuple[Message, ...] | list[Message]) -> None:
        if self._stopped:
            return  # the member is stopping: a sender started now would outlive stop()
        touched: dict[int, StreamSender] = {}
        for message in messages:
            sender = touched.get(message.to)
            if sender is None:
                sender = touched[message.to] = self.sender(message.to)
            sender.offer(message)
        for sender in touched.values():
            sender.flush()

    def sent_all(self) -> bool:
        """Whether every message sent so far is on a socket (none waits for a sender's
        task: no connection open yet, a socket still full, or a held commit notice aside)."""
        return not any(sender.queued for sender in self._senders.values())

    def await_commit(self, peer_id: int, index: int) -> None:
        """Member ``peer_id`` forwarded a proposal this leader appended up to ``index``: it
        answers its caller once it has applied that far, so no commit notice to it waits
        for company until it has been sent that commit index (notice_hold.py)."""
        sender = self._senders.get(peer_id)
        if sender is None and not self._stopped and self._host.peer_address(peer_id) is not None:
            sender = self.sender(peer_id)
        if sender is not None:
            sender.await_commit(index)

    async def hello(
        self, address: str, request: peer_pb2.HelloRequest, timeout_s: float
    ) -> peer_pb2.HelloAnswer | None:
        """Ask ``address`` Hello; its answer (unverified), or None when there is none."""
        return await self._ask(
            address, KIND_HELLO, HELLO, request, HELLO_ANSWER, peer_pb2.HelloAnswer, timeout_s
        )

    async def members(
        self, address: str, request: peer_pb2.MembersRequest, timeout_s: float
    ) -> peer_pb2.MembersAnswer | None:
        """Ask ``address`` for its member table (peer_lookup.py); its answer (unverified), or
        None when there is none (a member of an earlier release refuses the question)."""
        return await self._ask(
            address,
            KIND_MEMBERS,
            MEMBERS,
            request,
            MEMBERS_ANSWER,
            peer_pb2.MembersAnswer,
            timeout_s,
        )

    async def _ask(
        self,
        address: str,
        kind: int,
        frame_type: int,
        request: ProtoMessage,
        answer_type: int,
        answer_cls: type[P],
        timeout_s: float,
    ) -> P | None:
        """One question on a connection of its own (a hello, a members question): the
        answer, or None when none came in time."""
        try:
            async with asyncio.timeout(timeout_s):
                conn, _ = await dial(address, kind, self._ssl, session=False)
                try:
                    conn.write(frame_type, encode_record(request))
                    body = await conn.read_expecting(answer_type, None)
                    return decode_record(answer_cls, body)
                finally:
                    conn.close()
        except (*LOST, VersionError, TimeoutError) as exc:
            log.debug(
                "member %d: no %s from %s: %s",
                self._host.member_id,
                answer_cls.__name__,
                address,
                exc,
            )
            return None

    async def liveness(self, member_id: int, payload: bytes, timeout_s: float = 2.0) -> bool:
        """Send ``member_id`` (the leader) a liveness report; whether it took it. Raises when
        it fails (the caller says everything again next time)."""
        if self._stopped:
            raise ConnectionLost("this member's peer transport has stopped")
        address = self._host.peer_address(member_id)
        if address is None:
            return False
        link = self._report_links.get(address)
        if link is None:
            link = self._report_links[address] = StreamLivenessLink(self._host, address, self._ssl)
        return await link.report(member_id, payload, timeout_s)

    async def remove_peer(self, member_id: int) -> None:
        sender = self._senders.pop(NodeId(member_id), None)
        if sender is not None:
            await sender.stop()

    async def stop(self) -> None:
        self._stopped = True
        await self.lookup.stop()
        senders, self._senders = list(self._senders.values()), {}
        for sender in senders:
            await sender.stop()
        links, self._report_links = list(self._report_links.values()), {}
        for link in links:
            link.shut()
