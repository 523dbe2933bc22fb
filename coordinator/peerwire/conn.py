"""One connection of the stream peer protocol: frames over an asyncio stream, with deadlines.

Theory of operation. :class:`FrameConn` reads and writes the frames of ``frames.py`` on an
asyncio (uvloop) stream. Reads never allocate for a length over the connection's limit (the
header is checked first), and a frame once begun must arrive whole within a deadline (a
peer trickling bytes cannot hold a reader forever). Writes go into the transport's buffer
without waiting; :meth:`FrameConn.drain` waits, up to a deadline, only while the buffer is
above its high-water mark, so a busy socket batches what is queued behind it and a stalled
one is found out (the caller ends the connection: Raft hears the peer is unreachable).

The read deadlines are kept by one watchdog timer per connection, not a timer per read: a
read only moves the connection's deadline (a float), and the watchdog, when it fires, either
finds the deadline moved later and sleeps until then, or finds it passed and ends the read
under way by setting an exception on the stream (the connection is finished after that).
On a busy connection that is one timer per idle period instead of two ``asyncio.timeout``
scopes (each a timer scheduled and cancelled) per frame, which were a measurable share of a
member's CPU per put.

:func:`dial` opens a connection of one kind: the preambles are exchanged, and for the kinds
bound to a session the listener's ``OPEN`` frame (its challenge) is awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import ssl
from collections.abc import Set

from ..peer_session import CHALLENGE_BYTES, ChallengeError
from .frames import (
    ERROR,
    HEADER,
    MAX_FRAME_BYTES,
    OPEN,
    PREAMBLE,
    FrameError,
    decode_error,
    frame,
    parse_header,
    parse_preamble,
    preamble,
)

# Bytes a connection's transport may hold unsent before writers wait (its high-water mark).
WRITE_BUFFER_BYTES = 4 * 1024 * 1024
# How long a write may wait for the socket to take the buffer down before the connection is
# taken for lost (a peer that stopped reading, or a partition).
WRITE_STALL_S = 5.0
# How long a frame, once its header arrived, may take to arrive whole.
FRAME_TIMEOUT_S = 30.0
# How long a dial may take: TCP, TLS, the preambles and the OPEN frame.
DIAL_TIMEOUT_S = 5.0


class PeerError(Exception):
    """The other end refused (its ERROR frame): ``code`` is a grpc ``StatusCode`` name."""

    def __init__(self, code: str, message: str, reason: str = "") -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.reason = reason


class ConnectionLost(Exception):
    """The connection ended or stalled; the message says how."""


class _ReadExpired(Exception):
    """Set on a connection's stream by its watchdog: the read under way passed its deadline."""


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class FrameConn:
    """Frames over one stream; see the module docstring."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        limit: int = MAX_FRAME_BYTES,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.limit = limit
        writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        self._loop = asyncio.get_running_loop()
        # The loop time by which the read under way must have its bytes; infinite while no
        # read is under way or the one under way waits without limit.
        self._deadline = math.inf
        # The watchdog's timer, armed at most once at a time, never later than _deadline.
        self._watchdog: asyncio.TimerHandle | None = None
        self.watchdog_timers = 0  # timers the watchdog scheduled (counted for tests)

    @property
    def buffered(self) -> int:
        """Bytes written and not yet taken by the socket."""
        return self.writer.transport.get_write_buffer_size()

    def peer_names(self) -> frozenset[str]:
        """The names of the other end's TLS certificate (CN and DNS subject alt names)."""
        cert = self.writer.get_extra_info("peercert")
        names: set[str] = set()
        if cert:
            for rdn in cert.get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        names.add(value)
            for key, value in cert.get("subjectAltName", ()):
                if key in ("DNS", "IP Address"):
                    names.add(value)
        return frozenset(names)

    def write(self, kind: int, body: bytes = b"") -> None:
        """Queue one frame without waiting. Raises ConnectionLost once the connection has
        failed or is closing: uvloop raises RuntimeError for a write to a transport whose
        socket it closed (a peer's reset seen by the read side while the writer had frames
        to send), where asyncio's own transport drops the bytes; neither is a bug of the
        caller, and a RuntimeError escaping a peer sender once ended it for good."""
        self.write_bytes(frame(kind, body))

    def write_bytes(self, data: bytes) -> None:
        """Queue ``data`` as it is (a preamble); raises as :meth:`write` does."""
        if self.writer.transport.is_closing():
            raise ConnectionLost("the connection was closed")
        try:
            self.writer.write(data)
        except RuntimeError as exc:
            raise ConnectionLost(f"write failed: {exc}") from None

    async def drain(self, timeout_s: float | None = None) -> None:
        transport = self.writer.transport
        if not transport.get_write_buffer_size() and not transport.is_closing():
            # The socket took every byte: nothing to wait for (a transport whose buffer is
            # empty is not paused), so no deadline is armed. The common case, once a frame.
            return
        if timeout_s is None:
            timeout_s = WRITE_STALL_S
        try:
            async with asyncio.timeout(timeout_s):
                await self.writer.drain()
        except TimeoutError:
            raise ConnectionLost(
                f"the peer took none of {self.buffered} buffered bytes for {timeout_s:.0f} s"
            ) from None
        except _ReadExpired:
            raise ConnectionLost("the peer sent nothing in time") from None
        except (ConnectionError, OSError) as exc:
            raise ConnectionLost(f"write failed: {exc}") from None

    async def read(self, idle_s: float | None = None) -> tuple[int, bytes]:
        """The next frame (type, body). Raises ConnectionLost at EOF, when no frame begins
        within ``idle_s`` or a begun one takes over FRAME_TIMEOUT_S (and the connection is
        then finished), FrameError for a bad header."""
        reader = self.reader
        try:
            self._expect_within(idle_s)
            header = await reader.readexactly(HEADER.size)
            length, kind = parse_header(header, self.limit)
            if length:
                self._expect_within(FRAME_TIMEOUT_S)
                body = await reader.readexactly(length)
            else:
                body = b""
        except asyncio.IncompleteReadError as exc:
            raise ConnectionLost(
                "the peer closed the connection" + (" mid-frame" if exc.partial else "")
            ) from None
        except _ReadExpired:
            raise ConnectionLost("the peer sent nothing in time") from None
        except (ConnectionError, OSError) as exc:
            raise ConnectionLost(f"read failed: {exc}") from None
        finally:
            # Also when the read was cancelled from outside: no deadline outlives its read.
            self._deadline = math.inf
        return kind, body

    def _expect_within(self, seconds: float | None) -> None:
        """The read under way must have its bytes within ``seconds`` (None: no limit)."""
        if seconds is None:
            self._deadline = math.inf
            return
        deadline = self._loop.time() + seconds
        self._deadline = deadline
        watchdog = self._watchdog
        if watchdog is None or watchdog.when() > deadline:
            # Deadlines mostly move later, which the armed timer finds when it fires; only an
            # earlier one (a shorter limit than the last) needs a timer of its own.
            if watchdog is not None:
                watchdog.cancel()
            self._arm(deadline)

    def _arm(self, when: float) -> None:
        self._watchdog = self._loop.call_at(when, self._watch)
        self.watchdog_timers += 1

    def _watch(self) -> None:
        self._watchdog = None
        deadline = self._deadline
        if deadline == math.inf:
            return  # no read under way, or none with a limit: the next one arms a timer
        if self._loop.time() < deadline:
            self._arm(deadline)
            return
        # The read under way is over its deadline: it raises, and so does any later one.
        self.reader.set_exception(_ReadExpired())

    async def read_expecting(self, kind: int, idle_s: float | None) -> bytes:
        """The body of the next frame, which must be ``kind`` (an ERROR frame raises
        PeerError; anything else FrameError)."""
        got, body = await self.read(idle_s)
        if got == ERROR:
            raise PeerError(*decode_error(body))
        if got != kind:
            raise FrameError(f"expected a frame of type {kind}, got {got}")
        return body

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        with contextlib.suppress(Exception):
            self.writer.close()

    async def aclose(self) -> None:
        self.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self.writer.wait_closed()


async def dial(
    address: str,
    kind: int,
    ssl_context: ssl.SSLContext | None,
    *,
    session: bool,
    timeout_s: float = DIAL_TIMEOUT_S,
) -> tuple[FrameConn, bytes]:
    """A connection of ``kind`` to ``address`` and, if ``session``, the listener's challenge
    (else b""). Raises ConnectionLost, PeerError, VersionError or ChallengeError."""
    host, port = split_address(address)
    conn: FrameConn | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(
                host,
                port,
                ssl=ssl_context,
                server_hostname=host if ssl_context is not None else None,
            )
            conn = FrameConn(reader, writer)
            conn.write_bytes(preamble(kind))
            theirs = await reader.readexactly(PREAMBLE.size)
            parse_preamble(theirs)
            if not session:
                return conn, b""
            challenge = await conn.read_expecting(OPEN, None)
    except TimeoutError:
        if conn is not None:
            conn.close()
        raise ConnectionLost(f"no answer within {timeout_s:.0f} s") from None
    except asyncio.IncompleteReadError:
        if conn is not None:
            conn.close()
        raise ConnectionLost("the peer closed the connection at its start") from None
    except (ConnectionError, OSError, ssl.SSLError) as exc:
        if conn is not None:
            conn.close()
        raise ConnectionLost(f"cannot connect: {exc}") from None
    except BaseException:
        if conn is not None:
            conn.close()
        raise
    if len(challenge) != CHALLENGE_BYTES:
        conn.close()
        raise ChallengeError(f"a session challenge of {len(challenge)} bytes")
    return conn, challenge


def names_of(conn: FrameConn, required: bool) -> Set[str]:
    return conn.peer_names() if required else frozenset()
