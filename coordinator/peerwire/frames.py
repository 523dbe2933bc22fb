"""The stream peer protocol's wire format (version 1), sans-IO: docs/peer-protocol.md.

Theory of operation. A connection opens with an 8-byte *preamble* from each end: the magic
``RPPW``, the frame-format version (one byte), the connection's kind (one byte: Raft
traffic, a snapshot transfer, a hello, liveness reports, a members question) and two zero
bytes. The dialer sends its preamble first; the listener checks it before reading anything
else and answers with its own. An unknown magic or version is refused at once, with one log
line naming what was found (a member of an older release speaks gRPC on this port, whose
first bytes are HTTP/2's ``PRI * HTTP/2.0``: said so).

After the preambles, each end sends *frames*: a 5-byte header (the body's length, 4 bytes
big-endian, then the frame's type, 1 byte) and the body. A length over ``MAX_FRAME_BYTES``
is refused from the header alone: nothing is allocated for it. Bodies are msgpack arrays of
the peer messages' fields (``encode_record``: in the order of the fields of the
``rallypoint.peer.v1`` message of the same name, so the MAC encodings of peer_auth.py apply
unchanged); a ``BATCH`` carries the Raft codec's bytes of each message as they are.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack
from google.protobuf.message import Message as ProtoMessage

from rallypoint.proto.peer.v1 import peer_pb2

MAGIC = b"RPPW"
FRAME_VERSION = 1
PREAMBLE = struct.Struct(">4sBBH")
HEADER = struct.Struct(">IB")
# The largest frame body: a batch of large entries, as gRPC's peer limit was.
MAX_FRAME_BYTES = 64 * 1024 * 1024
# HTTP/2's connection preface: what a member of an older release sends on this port.
_HTTP2_PREFACE = b"PRI * HT"

# Connection kinds (the preamble's fourth byte).
KIND_RAFT = 1
KIND_SNAPSHOT = 2
KIND_HELLO = 3
KIND_LIVENESS = 4
# Added within frame version 1: a member of an earlier release refuses the kind (it closes the
# connection, logging an unknown kind) and the asker goes without an answer.
KIND_MEMBERS = 5
KINDS = frozenset({KIND_RAFT, KIND_SNAPSHOT, KIND_HELLO, KIND_LIVENESS, KIND_MEMBERS})

# Frame types.
OPEN = 1  # listener -> dialer: the session challenge (16 bytes, raw)
BATCH = 2  # MessageBatch
CHUNK = 3  # SnapshotChunk
SNAPSHOT_ACK = 4  # SnapshotAck
HELLO = 5  # HelloRequest
HELLO_ANSWER = 6  # HelloAnswer
LIVENESS = 7  # LivenessReport
LIVENESS_ACK = 8  # LivenessAck
ERROR = 9  # [status code name, message, reason]: the sender closes the connection after it
PING = 10  # empty; answered with PONG (keepalive)
PONG = 11  # empty
MEMBERS = 12  # MembersRequest
MEMBERS_ANSWER = 13  # MembersAnswer
FRAME_TYPES = frozenset(range(OPEN, MEMBERS_ANSWER + 1))


class FrameError(ValueError):
    """Bytes that are not this protocol (the message says what was found)."""


class VersionError(FrameError):
    """A peer speaking another frame-format version (or not this protocol at all)."""


def preamble(kind: int, version: int = FRAME_VERSION) -> bytes:
    return PREAMBLE.pack(MAGIC, version, kind, 0)


def parse_preamble(data: bytes) -> int:
    """The kind of a connection whose first 8 bytes are ``data``; raises VersionError for
    another version or protocol, FrameError for an unknown kind."""
    if data.startswith(_HTTP2_PREFACE):
        raise VersionError(
            "it speaks gRPC (HTTP/2) on the peer port: a member of a release on the gRPC "
            "peer transport (docs/operations.md, 'Upgrading'), or a client given the peer "
            "port for the client port"
        )
    magic, version, kind, reserved = PREAMBLE.unpack(data)
    if magic != MAGIC:
        raise VersionError(
            f"it does not speak the stream peer protocol (first bytes {data!r}): a member on "
            "the gRPC peer transport, or not a member"
        )
    if version != FRAME_VERSION:
        raise VersionError(
            f"it speaks peer frame version {version}; this member speaks {FRAME_VERSION} "
            "(docs/peer-protocol.md)"
        )
    if kind not in KINDS or reserved:
        raise FrameError(f"a preamble of unknown kind {kind} (reserved {reserved})")
    return int(kind)


def frame(kind: int, body: bytes) -> bytes:
    return HEADER.pack(len(body), kind) + body


def parse_header(data: bytes, limit: int = MAX_FRAME_BYTES) -> tuple[int, int]:
    """(body length, frame type) of a 5-byte header; FrameError for a length over ``limit``
    (refused before anything is read or allocated for it) or an unknown type."""
    length, kind = HEADER.unpack(data)
    if length > limit:
        raise FrameError(f"a frame of {length} bytes is over the limit of {limit}")
    if kind not in FRAME_TYPES:
        raise FrameError(f"a frame of unknown type {kind}")
    return int(length), int(kind)


P = TypeVar("P", bound=ProtoMessage)
# A field's value that msgpack takes as it is (a repeated field's is a container: a list).
_SCALARS = (int, bytes, str, bool, float)


def encode_record(message: ProtoMessage) -> bytes:
    """A peer message's fields as a msgpack array, in the order its descriptor lists them."""
    values = [getattr(message, f.name) for f in message.DESCRIPTOR.fields]
    packed: bytes = msgpack.packb(
        [v if isinstance(v, _SCALARS) else list(v) for v in values], use_bin_type=True
    )
    return packed


def decode_record(cls: type[P], body: bytes) -> P:
    """The message ``encode_record`` made; FrameError for anything else."""
    try:
        values = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise FrameError(f"a {cls.__name__} that is not msgpack: {exc}") from None
    names = [f.name for f in cls.DESCRIPTOR.fields]
    if not isinstance(values, list) or len(values) != len(names):
        raise FrameError(f"a {cls.__name__} that is not an array of {len(names)} fields")
    try:
        return cls(**dict(zip(names, values, strict=True)))
    except (TypeError, ValueError) as exc:
        raise FrameError(f"a {cls.__name__} with a field of the wrong type: {exc}") from None


def encode_error(code: str, message: str, reason: str = "") -> bytes:
    packed: bytes = msgpack.packb([code, message, reason], use_bin_type=True)
    return packed


def decode_error(body: bytes) -> tuple[str, str, str]:
    try:
        code, message, reason = msgpack.unpackb(body, raw=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return "UNKNOWN", f"an error frame that does not parse ({len(body)} bytes)", ""
    return str(code), str(message), str(reason)


# --- BATCH, the one record of the hot path, without a protobuf object ---------------------------
#
# A BATCH body is ``encode_record`` of a MessageBatch; these two make and read the same bytes
# straight from and into the fields (a protobuf object cost more than the rest of a frame's
# framing, on every member, for a record that lives only until it is checked and stepped).

_BATCH_FIELD_NAMES = (
    "cluster_id",
    "from_id",
    "to_id",
    "messages",
    "incarnation",
    "abstaining",
    "mac",
    "challenge",
    "counter",
)
if tuple(f.name for f in peer_pb2.MessageBatch.DESCRIPTOR.fields) != _BATCH_FIELD_NAMES:
    raise ImportError("MessageBatch's fields changed: encode_batch/decode_batch must follow")
_U64_LIMIT = 1 << 64
# A protobuf bool takes an int that fits a C long.
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class ReceivedBatch:
    """A received MessageBatch's fields (the names and values a MessageBatch would hold)."""

    cluster_id: int
    from_id: int
    to_id: int
    messages: list[bytes]
    incarnation: int
    abstaining: bool
    mac: bytes
    challenge: bytes
    counter: int


def encode_batch(
    cluster_id: int,
    from_id: int,
    to_id: int,
    messages: list[bytes],
    incarnation: int,
    abstaining: bool,
    mac: bytes,
    challenge: bytes,
    counter: int,
) -> bytes:
    """The bytes ``encode_record`` gives for a MessageBatch of these fields."""
    packed: bytes = msgpack.packb(
        [
            cluster_id,
            from_id,
            to_id,
            messages,
            incarnation,
            bool(abstaining),
            mac,
            challenge,
            counter,
        ],
        use_bin_type=True,
    )
    return packed


def decode_batch(body: bytes) -> ReceivedBatch:
    """The fields of the MessageBatch ``body`` holds; FrameError for any body that
    ``decode_record(MessageBatch, body)`` refuses (and for a boolean too large for a C long,
    on which it raised OverflowError)."""
    try:
        values = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise FrameError(f"a MessageBatch that is not msgpack: {exc}") from None
    if not isinstance(values, list) or len(values) != len(_BATCH_FIELD_NAMES):
        raise FrameError(f"a MessageBatch that is not an array of {len(_BATCH_FIELD_NAMES)} fields")
    cluster_id, from_id, to_id, messages, incarnation, abstaining, mac, challenge, counter = values
    if messages is None:
        messages = []
    elif type(messages) is not list:
        # A protobuf repeated field takes any iterable of bytes: of what msgpack gives, an
        # empty string or a map whose keys are bytes too.
        if type(messages) not in (bytes, str, dict):
            raise FrameError("a MessageBatch with a field of the wrong type: messages")
        messages = list(messages)
    if any(type(m) is not bytes for m in messages):
        raise FrameError("a MessageBatch with a field of the wrong type: messages")
    return ReceivedBatch(
        _u64(cluster_id, "cluster_id"),
        _u64(from_id, "from_id"),
        _u64(to_id, "to_id"),
        messages,
        _u64(incarnation, "incarnation"),
        _bool(abstaining),
        _bytes(mac, "mac"),
        _bytes(challenge, "challenge"),
        _u64(counter, "counter"),
    )


def _u64(value: Any, name: str) -> int:
    # An absent (nil) field is its default, as for a protobuf field given None.
    if value is None:
        return 0
    if type(value) is not int or not 0 <= value < _U64_LIMIT:
        raise FrameError(f"a MessageBatch with a field of the wrong type: {name}")
    return value


def _bool(value: Any) -> bool:
    if value is None:
        return False
    if type(value) is bool:
        return value
    if type(value) is not int or not _LONG_MIN <= value <= _LONG_MAX:
        raise FrameError("a MessageBatch with a field of the wrong type: abstaining")
    return bool(value)


def _bytes(value: Any, name: str) -> bytes:
    if value is None:
        return b""
    if type(value) is not bytes:
        raise FrameError(f"a MessageBatch with a field of the wrong type: {name}")
    return value
