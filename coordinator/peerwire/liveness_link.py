"""A member's connection for liveness reports to the leader (kind ``LIVENESS``): the stream
peer protocol's sending side for them (``transport.StreamTransport.liveness``)."""

from __future__ import annotations

import asyncio
import ssl
import time

from rallypoint.proto.peer.v1 import peer_pb2

from ..peer_auth import LIVENESS_TAG, liveness_fields
from ..peer_session import OutboundSession
from ..transport import PeerEnd
from .conn import ConnectionLost, FrameConn, dial
from .frames import KIND_LIVENESS, LIVENESS, LIVENESS_ACK, decode_record, encode_record

# A liveness connection unused for this long is dialled again (the listener closes idle
# connections after 30 s).
LIVENESS_IDLE_S = 15.0


class StreamLivenessLink:
    """One long-lived ``LIVENESS`` connection to a member, dialled on demand and again after
    it fails or idles: one report at a time, each answered by one ack in order."""

    def __init__(self, host: PeerEnd, address: str, ssl_context: ssl.SSLContext | None) -> None:
        self._host = host
        self._address = address
        self._ssl = ssl_context
        self._conn: FrameConn | None = None
        self._session: OutboundSession | None = None
        self._used = 0.0
        self._lock = asyncio.Lock()
        # Set by shut(): a report under way then (its member stopping) dials no more.
        self._shut = False

    async def report(self, member_id: int, payload: bytes, timeout_s: float) -> bool:
        async with self._lock:
            try:
                async with asyncio.timeout(timeout_s):
                    return await self._report(member_id, payload)
            except BaseException:
                self.close()
                raise

    async def _report(self, member_id: int, payload: bytes) -> bool:
        host = self._host
        now = time.monotonic()
        if (
            self._conn is None
            or self._session is None
            or self._conn.reader.at_eof()
            or now - self._used > LIVENESS_IDLE_S
        ):
            self.close()
            if self._shut:
                raise ConnectionLost("this member's peer transport has stopped")
            conn, challenge = await dial(self._address, KIND_LIVENESS, self._ssl, session=True)
            if self._shut:  # shut while it dialled: nothing else would close it
                conn.close()
                raise ConnectionLost("this member's peer transport has stopped")
            self._conn = conn
            self._session = OutboundSession(host.peer_key, challenge)
        self._used = now
        request = peer_pb2.LivenessReport(
            cluster_id=host.cluster_id, from_id=host.member_id, to_id=member_id, payload=payload
        )
        stamp = self._session.stamp(LIVENESS_TAG, liveness_fields(request))
        request.challenge, request.counter, request.mac = stamp.challenge, stamp.counter, stamp.mac
        self._conn.write(LIVENESS, encode_record(request))
        body = await self._conn.read_expecting(LIVENESS_ACK, None)
        return bool(decode_record(peer_pb2.LivenessAck, body).taken)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._session = None

    def shut(self) -> None:
        """Close for good (the transport stops)."""
        self._shut = True
        self.close()
