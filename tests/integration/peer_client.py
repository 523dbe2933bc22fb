"""A hand-driven peer: sends raw requests to a member's peer port, signed or not.

Tests play an outsider (no secret, or a wrong one) and a member gone wrong (the right secret,
malformed content) with it; the fuzzer builds on it. It speaks the stream peer protocol
(coordinator/peerwire/, docs/peer-protocol.md) with blocking sockets: requests on a
connection are stamped as a member stamps them (coordinator/peer_session.py): the member's
challenge arrives in the connection's OPEN frame, then each request carries it and the next
counter under its MAC. A refusal's status code is its ERROR frame's, and a connection the
member ended without one (or a transfer it left unfinished) reads as OK. A question (a
hello, a members question) is bound to no connection: no challenge comes first, and the
member's one answer ends it.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc

from rallypoint.coordinator.peer_auth import (
    BATCH_TAG,
    CHUNK_TAG,
    PeerKey,
    batch_fields,
    chunk_fields,
    cluster_id_for,
)
from rallypoint.coordinator.peer_session import OutboundSession
from rallypoint.coordinator.peerwire import frames
from rallypoint.proto.peer.v1 import peer_pb2
from rallypoint.raft.codec import encode_message
from rallypoint.raft.types import Message

SEND = "/rallypoint.peer.v1.Raft/Send"
INSTALL_SNAPSHOT = "/rallypoint.peer.v1.Raft/InstallSnapshot"
LIVENESS = "/rallypoint.peer.v1.Raft/Liveness"
HELLO = "/rallypoint.peer.v1.Raft/Hello"
MEMBERS = "/rallypoint.peer.v1.Raft/Members"
# Each path's connection kind and the frame type of its requests.
EXCHANGES = {
    SEND: (frames.KIND_RAFT, frames.BATCH),
    INSTALL_SNAPSHOT: (frames.KIND_SNAPSHOT, frames.CHUNK),
    LIVENESS: (frames.KIND_LIVENESS, frames.LIVENESS),
    HELLO: (frames.KIND_HELLO, frames.HELLO),
    MEMBERS: (frames.KIND_MEMBERS, frames.MEMBERS),
}
# The questions' kinds: bound to no session, so the member sends no challenge for them.
QUESTION_KINDS = frozenset({frames.KIND_HELLO, frames.KIND_MEMBERS})
# Builds a stream's requests (serialized) once its challenge is known (None: none came).
Build = Callable[[bytes | None], Sequence[bytes]]


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        more = sock.recv(n - len(data))
        if not more:
            return None
        data += more
    return data


def stream_frames_in_session(
    address: str,
    path: str,
    build: Build,
    timeout_s: float,
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[grpc.StatusCode, str, list[bytes]]:
    """Open a connection of the kind ``path`` names, wait for the member's challenge (none
    for a question: a hello, a members question), send what ``build`` makes of it (record
    bodies, frames.encode_record) as frames of the matching type, and wait for the end:
    (status, its message, the bodies of the member's answers)."""
    kind, frame_type = EXCHANGES[path]
    host, port = address.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=timeout_s)
    sock = raw if ssl_context is None else ssl_context.wrap_socket(raw, server_hostname=host)
    responses: list[bytes] = []
    try:
        sock.sendall(frames.preamble(kind))
        theirs = _read_exactly(sock, frames.PREAMBLE.size)
        if theirs is None:
            return grpc.StatusCode.UNAVAILABLE, "closed at its start", responses
        frames.parse_preamble(theirs)
        challenge = None
        # A question is not bound to a session: no challenge comes first.
        header = None if kind in QUESTION_KINDS else _read_exactly(sock, frames.HEADER.size)
        if header is not None:
            length, got = frames.HEADER.unpack(header)
            body = _read_exactly(sock, length) or b""
            if got == frames.OPEN:
                challenge = body
        for payload in build(challenge):
            try:
                sock.sendall(frames.frame(frame_type, payload))
            except OSError:
                break  # the member ended the connection: what it said follows
        try:
            if ssl_context is None:
                sock.shutdown(socket.SHUT_WR)
            else:
                sock.sendall(frames.frame(frames.PING, b""))  # TLS: no half-close; a last ping
        except OSError:
            pass  # the member ended the connection: what it said follows
        while True:
            try:
                header = _read_exactly(sock, frames.HEADER.size)
            except (OSError, TimeoutError):
                header = None
            if header is None:
                return grpc.StatusCode.OK, "", responses
            length, got = frames.HEADER.unpack(header)
            body = _read_exactly(sock, length) or b""
            if got == frames.ERROR:
                code, message, _reason = frames.decode_error(body)
                return grpc.StatusCode[code], message, responses
            if got == frames.PONG:
                return grpc.StatusCode.OK, "", responses
            responses.append(body)
            if got == frames.SNAPSHOT_ACK:
                return grpc.StatusCode.OK, "", responses
    except ConnectionError:
        return grpc.StatusCode.OK, "", responses
    finally:
        sock.close()


class PeerClient:
    def __init__(
        self,
        address: str,
        secret: bytes | None,
        cluster_name: str = "rallypoint",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.address = address
        self.ssl_context = ssl_context
        self.key = PeerKey(secret) if secret is not None else None
        self.cluster_id = cluster_id_for(secret, cluster_name) if secret is not None else 1
        # Every request sent, serialized as it went (tests replay them).
        self.sent: list[bytes] = []

    def batch(
        self,
        from_id: int,
        to_id: int,
        messages: Sequence[Message | bytes],
        *,
        incarnation: int = 99,
    ) -> peer_pb2.MessageBatch:
        """A batch; ``send`` stamps it (with the secret, if this client has it)."""
        encoded = [m if isinstance(m, bytes) else encode_message(m) for m in messages]
        return peer_pb2.MessageBatch(
            cluster_id=self.cluster_id,
            from_id=from_id,
            to_id=to_id,
            messages=encoded,
            incarnation=incarnation,
        )

    def _stamped(
        self, challenge: bytes | None, requests: Iterable[Any], tag: bytes, fields: Any
    ) -> list[bytes]:
        session = (
            OutboundSession(self.key, challenge)
            if self.key is not None and challenge is not None
            else None
        )
        out = []
        for request in requests:
            if session is not None:
                stamp = session.stamp(tag, fields(request))
                request.challenge, request.counter = stamp.challenge, stamp.counter
                request.mac = stamp.mac
            out.append(frames.encode_record(request))
        self.sent.extend(out)
        return out

    def _in_session(self, path: str, build: Build, timeout_s: float) -> tuple[grpc.StatusCode, str]:
        code, details, _ = stream_frames_in_session(
            self.address, path, build, timeout_s, self.ssl_context
        )
        return code, details

    def send(
        self, batches: Iterable[peer_pb2.MessageBatch], timeout_s: float = 5.0
    ) -> tuple[grpc.StatusCode, str]:
        """The status the member ends the connection with (OK when it took every batch),
        and its message."""
        batches = list(batches)
        return self._in_session(
            SEND,
            lambda challenge: self._stamped(challenge, batches, BATCH_TAG, batch_fields),
            timeout_s,
        )

    def send_raw(
        self, payloads: Sequence[bytes], path: str = SEND, timeout_s: float = 5.0
    ) -> tuple[grpc.StatusCode, str]:
        """Send serialized requests as they are (a replay) on a new connection."""
        return self._in_session(path, lambda _: payloads, timeout_s)

    def install(
        self, chunks: Iterable[peer_pb2.SnapshotChunk], timeout_s: float = 10.0
    ) -> tuple[grpc.StatusCode, str]:
        chunks = list(chunks)
        return self._in_session(
            INSTALL_SNAPSHOT,
            lambda challenge: self._stamped(challenge, chunks, CHUNK_TAG, chunk_fields),
            timeout_s,
        )
