"""A hand-driven connection to a member's peer port (the stream protocol, docs/peer-protocol.md).

Tests play a member, a replaying proxy or an outsider with it: they open a connection of one
kind, take the member's challenge from its ``OPEN`` frame, write frames of their own making
(stamped or not, well-formed or not) and read what the member answers. A refusal (its
``ERROR`` frame) raises :class:`Refused` with the status code's name and message.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

from rallypoint.coordinator.peer_auth import PeerKey
from rallypoint.coordinator.peer_session import OutboundSession
from rallypoint.coordinator.peerwire import frames

TIMEOUT_S = 5.0


class Refused(Exception):
    """The member's ERROR frame."""

    def __init__(self, code: str, message: str, reason: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.reason = reason


class RawPeer:
    """One connection of ``kind`` past its preambles (and, for the kinds bound to a session,
    the member's challenge)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.challenge = b""

    @classmethod
    async def open(cls, address: str, kind: int, *, session: bool = True) -> RawPeer:
        host, port = address.rsplit(":", 1)
        async with asyncio.timeout(TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, int(port))
            peer = cls(reader, writer)
            writer.write(frames.preamble(kind))
            frames.parse_preamble(await reader.readexactly(frames.PREAMBLE.size))
            if session:
                peer.challenge = await peer.expect(frames.OPEN)
        return peer

    def session(self, key: PeerKey) -> OutboundSession:
        """The sending end of this connection's session, as a member holds it."""
        return OutboundSession(key, self.challenge)

    def send(self, frame_type: int, body: bytes) -> None:
        self.writer.write(frames.frame(frame_type, body))

    async def read(self) -> tuple[int, bytes] | None:
        """The next frame (type, body), None when the member closed the connection; an ERROR
        frame raises Refused."""
        async with asyncio.timeout(TIMEOUT_S):
            try:
                header = await self.reader.readexactly(frames.HEADER.size)
            except (asyncio.IncompleteReadError, ConnectionError):
                return None
            length, frame_type = frames.HEADER.unpack(header)
            body = await self.reader.readexactly(length)
        if frame_type == frames.ERROR:
            raise Refused(*frames.decode_error(body))
        return frame_type, body

    async def expect(self, frame_type: int) -> bytes:
        got = await self.read()
        assert got is not None, f"the member closed the connection; expected frame {frame_type}"
        assert got[0] == frame_type, f"expected frame {frame_type}, got {got[0]}"
        return got[1]

    async def refusal(self) -> Refused:
        """The member's refusal of what was sent (skipping keepalive answers)."""
        try:
            while True:
                got = await self.read()
                assert got is not None, "the member closed the connection without refusing"
                assert got[0] == frames.PONG, f"a frame of type {got[0]} instead of a refusal"
        except Refused as refused:
            return refused

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()

    async def __aenter__(self) -> RawPeer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
