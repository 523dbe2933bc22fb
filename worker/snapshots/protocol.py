"""The snapshot servers' wire: one request per TCP connection.

A message is a 4-byte little-endian length, a msgpack map of at most
:data:`MAX_HEADER_BYTES` (the header: ``op``, the world's ``token``, ``round``, ``step`` and
the operation's fields), then the payload the header announces (a blob pushed, the byte
ranges read). The server answers with a header (``{"ok": True}`` or ``{"error": ...}``) and
the bytes asked for. worker/snapshots/server.py serves it; :func:`request` is the client.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from .placement import SnapshotError

# How long a peer's server may take to answer one request (a push of a large blob included).
REQUEST_TIMEOUT_S = 60.0
_HEADER = struct.Struct("<I")
# Socket buffers of blob transfers (the kernel caps them at net.core.[rw]mem_max).
SOCKET_BUFFER_BYTES = 4 << 20
# A request's or answer's header (msgpack) may not be larger than this.
MAX_HEADER_BYTES = 1 << 20


def send(sock: socket.socket, header: Mapping[str, Any], payload: Sequence[Any] = ()) -> None:
    packed = msgpack.packb(dict(header))
    sock.sendall(_HEADER.pack(len(packed)) + packed)
    for part in payload:
        sock.sendall(part)


def recv_exactly(sock: socket.socket, length: int) -> bytearray:
    buffer = bytearray(length)
    recv_into(sock, memoryview(buffer))
    return buffer


def recv_into(sock: socket.socket, sink: memoryview) -> None:
    got, length = 0, len(sink)
    while got < length:
        n = sock.recv_into(sink[got:], length - got)
        if n == 0:
            raise ConnectionError(f"the peer closed the connection after {got} of {length} bytes")
        got += n


def recv_header(sock: socket.socket) -> dict[str, Any]:
    (length,) = _HEADER.unpack(recv_exactly(sock, _HEADER.size))
    if length > MAX_HEADER_BYTES:
        raise ConnectionError(f"a header of {length} bytes is over {MAX_HEADER_BYTES}")
    header = msgpack.unpackb(recv_exactly(sock, length))
    if not isinstance(header, dict):
        raise ConnectionError("a header is not a map")
    return header


def request(
    address: str,
    header: Mapping[str, Any],
    payload: Sequence[Any] = (),
    answer_bytes: int = 0,
) -> bytearray:
    """One request to a snapshot server; the ``answer_bytes`` bytes of its answer."""
    if not answer_bytes:
        request_parts(address, header, [], payload)
        return bytearray()
    (part,) = request_parts(address, header, [answer_bytes], payload)
    assert isinstance(part, bytearray)  # a length's part is read into a new bytearray
    return part


def request_parts(
    address: str,
    header: Mapping[str, Any],
    parts: Sequence[int | memoryview],
    payload: Sequence[Any] = (),
) -> list[Any]:
    """One request to a snapshot server whose answer comes in ``parts``: each a length (read
    into a new bytearray) or a memoryview (read straight into it); what was read, in order."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=REQUEST_TIMEOUT_S) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
        send(sock, header, payload)
        answer = recv_header(sock)
        if "error" in answer:
            raise SnapshotError(f"snapshot server {address}: {answer['error']}")
        read: list[Any] = []
        for part in parts:
            if isinstance(part, memoryview):
                recv_into(sock, part)
                read.append(part)
            else:
                read.append(recv_exactly(sock, part))
        return read
