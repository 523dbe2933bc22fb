"""The listening side of the stream peer protocol: docs/peer-protocol.md.

Theory of operation. Each accepted connection must send its preamble within
``HANDSHAKE_TIMEOUT_S``; one of another version or protocol is refused with one log line
(at most one a second for each kind of refusal: a misconfigured peer retries fast) and
closed. The listener answers with its own preamble, then serves the connection's kind:

- Raft traffic and liveness reports: an ``OPEN`` frame with a fresh session challenge
  (peer_session.py), then each ``BATCH`` (or ``LIVENESS``, answered with ``LIVENESS_ACK``)
  is checked by :class:`~rallypoint.coordinator.peer_gate.PeerGate`, the checks the gRPC
  transport made. ``PING`` is answered with ``PONG`` (the dialer's keepalive);
- a snapshot transfer: ``OPEN``, then ``CHUNK`` frames into a
  :class:`~rallypoint.coordinator.peer_gate.SnapshotIntake`, answered with one
  ``SNAPSHOT_ACK`` (complete, or the offset it expects);
- a hello: one ``HELLO``, answered with ``HELLO_ANSWER``;
- a members question: one ``MEMBERS``, answered with ``MEMBERS_ANSWER`` (peer_lookup.py).

A refusal is an ``ERROR`` frame (the status code's name, the message, the reason), after
which the listener closes the connection (having taken, for up to ``LINGER_S``, what the
sender still sent, so that a reset cannot overtake the ERROR frame). A frame that does not
parse before its sender is
authenticated is refused as any unauthenticated request: UNAUTHENTICATED, nothing else
said. Until a connection's first frame is authenticated it has ``HANDSHAKE_TIMEOUT_S`` in
all (a slow sender of bytes cannot hold it open), and at most ``MAX_CONNECTIONS`` are served
at once: past that, new connections are closed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time

import grpc

from rallypoint.proto.peer.v1 import peer_pb2

from ..peer_gate import UNAUTHENTICATED_MESSAGE, PeerGate, PeerReceiver, PeerRefused, SnapshotIntake
from ..peer_session import InboundSession
from .conn import ConnectionLost, FrameConn, names_of, split_address
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
    LIVENESS,
    LIVENESS_ACK,
    MEMBERS,
    MEMBERS_ANSWER,
    OPEN,
    PING,
    PONG,
    PREAMBLE,
    SNAPSHOT_ACK,
    FrameError,
    P,
    VersionError,
    decode_batch,
    decode_record,
    encode_error,
    encode_record,
    parse_preamble,
    preamble,
)

log = logging.getLogger("rallypoint.transport")

HANDSHAKE_TIMEOUT_S = 5.0
# A connection with nothing to say for this long is closed (a dialer pings every second).
IDLE_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 512
# How long a refused connection is kept to take what its sender still sends (_linger).
LINGER_S = 1.0


class PeerListener:
    """Serves the peer port with the stream protocol; see the module docstring."""

    def __init__(self, host: PeerReceiver, ssl_context: ssl.SSLContext | None = None) -> None:
        self._gate = PeerGate(host)
        self._host = host
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        # Per kind of refused connection: when it was last logged, and how many since.
        self._logged: dict[str, tuple[float, int]] = {}
        self.refused = 0  # connections refused before their first frame (counted for tests)
        self._stopping = False

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, address: str) -> None:
        host, port = split_address(address)
        self._server = await asyncio.start_server(
            self._connected, host or None, port, ssl=self._ssl, reuse_address=True
        )

    def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Each connection's writer is known from its first moment, so that stop() closes
        it even if its task is cancelled before it ran."""
        if self._stopping:
            # Accepted by the loop before stop() closed the listening socket.
            writer.close()
            return
        self._writers.add(writer)
        task = asyncio.get_running_loop().create_task(self._accept(reader, writer))
        self._conns.add(task)
        task.add_done_callback(self._conns.discard)
        task.add_done_callback(lambda _task: self._closed(writer))

    def _closed(self, writer: asyncio.StreamWriter) -> None:
        """A connection's task is done: its writer is closed, even if the task was cancelled
        before it ran (and so never reached its own ``finally``)."""
        writer.close()
        self._writers.discard(writer)

    async def stop(self, grace: float | None = None) -> None:
        """Stop listening and end every connection (``grace``: accepted for the gRPC
        server's signature; connections carry nothing that waiting would save)."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        tasks = list(self._conns)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = FrameConn(reader, writer)
        if len(self._conns) > MAX_CONNECTIONS:
            self._note("too_many", f"over {MAX_CONNECTIONS} peer connections: one closed")
            await conn.aclose()
            return
        try:
            await self._serve(conn)
        except (ConnectionLost, ConnectionError, OSError) as exc:
            log.debug("member %d: peer connection ended: %s", self._host.member_id, exc)
        except asyncio.CancelledError:
            # Only stop() cancels these; asyncio's stream callback would log the
            # cancellation as an error (Python 3.11).
            pass
        finally:
            await conn.aclose()

    async def _serve(self, conn: FrameConn) -> None:
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                data = await conn.reader.readexactly(PREAMBLE.size)
        except (TimeoutError, asyncio.IncompleteReadError):
            self.refused += 1
            return
        try:
            kind = parse_preamble(data)
        except VersionError as exc:
            self.refused += 1
            self._note("version", f"refused a peer connection from {_peer(conn)}: {exc}")
            return
        except FrameError as exc:
            self.refused += 1
            self._note("preamble", f"refused a peer connection from {_peer(conn)}: {exc}")
            return
        conn.write_bytes(preamble(kind))
        try:
            if kind == KIND_HELLO:
                await self._hello(conn)
            elif kind == KIND_MEMBERS:
                await self._members(conn)
            elif kind == KIND_SNAPSHOT:
                await self._snapshot(conn)
            else:
                await self._stream(conn, kind)
        except PeerRefused as refused:
            conn.write(ERROR, encode_error(refused.code.name, refused.message, refused.reason))
            with contextlib.suppress(ConnectionLost):
                await conn.drain(1.0)
            await _linger(conn)

    def _open(self, conn: FrameConn) -> InboundSession:
        session = InboundSession(self._host.peer_key)
        conn.write(OPEN, session.challenge)
        return session

    async def _first(self, conn: FrameConn) -> tuple[int, bytes]:
        """The first frame after the preambles, within what is left of the handshake."""
        try:
            # Whole within the handshake's time: the sender is not yet known to be a member.
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                return await conn.read()
        except TimeoutError:
            raise ConnectionLost("no whole first frame in time") from None
        except FrameError:
            raise PeerRefused(_UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE) from None

    async def _stream(self, conn: FrameConn, kind: int) -> None:
        """Raft traffic or liveness reports, until the dialer goes."""
        session = self._open(conn)
        names = names_of(conn, self._host.peer_names_required)
        authenticated = False
        want = BATCH if kind == KIND_RAFT else LIVENESS
        while True:
            if authenticated:
                try:
                    frame_type, body = await conn.read(IDLE_TIMEOUT_S)
                except FrameError as exc:
                    raise PeerRefused(_INVALID, f"bad frame: {exc}") from None
            else:
                frame_type, body = await self._first(conn)
            if frame_type == PING:
                conn.write(PONG)
                continue
            if frame_type != want:
                raise PeerRefused(
                    _INVALID if authenticated else _UNAUTHENTICATED,
                    f"a frame of type {frame_type} on this connection"
                    if authenticated
                    else UNAUTHENTICATED_MESSAGE,
                )
            if want == BATCH:
                try:
                    batch = decode_batch(body)
                except FrameError:
                    # Unparsable, so not authenticated: refused as any unauthenticated one.
                    raise PeerRefused(_UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE) from None
                self._gate.take_batch(session, batch, names)
            else:
                report = _parse(peer_pb2.LivenessReport, body)
                taken = self._gate.liveness(session, report, names)
                conn.write(LIVENESS_ACK, encode_record(peer_pb2.LivenessAck(taken=taken)))
            authenticated = True

    async def _snapshot(self, conn: FrameConn) -> None:
        session = self._open(conn)
        intake = SnapshotIntake(self._gate, session, names_of(conn, self._host.peer_names_required))
        first = True
        try:
            while True:
                if first:
                    frame_type, body = await self._first(conn)
                else:
                    frame_type, body = await conn.read(IDLE_TIMEOUT_S)
                if frame_type != CHUNK:
                    raise PeerRefused(_INVALID, f"a frame of type {frame_type} in a transfer")
                ack = await intake.take(_parse(peer_pb2.SnapshotChunk, body))
                first = False
                if ack is not None:
                    conn.write(SNAPSHOT_ACK, encode_record(ack))
                    await conn.drain()
                    return
        except PeerRefused:
            await intake.discard()
            raise
        except ConnectionLost:
            # The sender went: the partial file stays for it to resume (as with gRPC).
            raise

    async def _hello(self, conn: FrameConn) -> None:
        request = await self._question(conn, HELLO, peer_pb2.HelloRequest)
        answer = self._gate.hello(request, names_of(conn, self._host.peer_names_required))
        conn.write(HELLO_ANSWER, encode_record(answer))
        await conn.drain()

    async def _members(self, conn: FrameConn) -> None:
        request = await self._question(conn, MEMBERS, peer_pb2.MembersRequest)
        answer = self._gate.members(request, names_of(conn, self._host.peer_names_required))
        conn.write(MEMBERS_ANSWER, encode_record(answer))
        await conn.drain()

    async def _question(self, conn: FrameConn, frame_type: int, cls: type[P]) -> P:
        """The one request of a question's connection (a hello, a members question)."""
        got, body = await self._first(conn)
        if got != frame_type:
            raise PeerRefused(_UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
        return _parse(cls, body)

    def _note(self, what: str, line: str) -> None:
        """One warning a second per kind of refused connection; the rest counted in it."""
        now = time.monotonic()
        at, since = self._logged.get(what, (-1.0, 0))
        if at >= 0 and now - at < 1.0:
            self._logged[what] = (at, since + 1)
            return
        self._logged[what] = (now, 0)
        more = f" ({since} more since the last line)" if since else ""
        log.warning("member %d: %s%s", self._host.member_id, line, more)


def _parse(cls: type[P], body: bytes) -> P:
    """A request's record; one that does not parse cannot be authenticated, and is refused
    as any unauthenticated one."""
    try:
        return decode_record(cls, body)
    except FrameError:
        raise PeerRefused(_UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE) from None


async def _linger(conn: FrameConn) -> None:
    """Take, and drop, what the refused sender still sends, for at most ``LINGER_S``: a
    socket closed with unread bytes sends a reset, which can overtake the ERROR frame and
    leave the sender knowing only that the connection broke."""
    with contextlib.suppress(TimeoutError, ConnectionError, OSError):
        if conn.writer.can_write_eof():
            conn.writer.write_eof()
        async with asyncio.timeout(LINGER_S):
            while await conn.reader.read(64 * 1024):
                pass


def _peer(conn: FrameConn) -> str:
    peername = conn.writer.get_extra_info("peername")
    return f"{peername[0]}:{peername[1]}" if peername else "an unknown address"


_UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
_INVALID = grpc.StatusCode.INVALID_ARGUMENT
