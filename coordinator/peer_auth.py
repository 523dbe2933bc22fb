"""Authenticating the peer port: a cluster secret that every member holds.

Theory of operation. Nothing reaches Raft from a sender that cannot prove it is a member.
Every member is given the same secret (``--peer-secret-file``; ``rallypoint secret`` makes
one). From it, with HMAC-SHA256 as the key-derivation function, come:

- the *MAC key*: every peer request (each ``MessageBatch``, each ``SnapshotChunk``, each
  ``Hello``, each ``LivenessReport``) carries an HMAC-SHA256 over all of its fields, in a
  fixed encoding (below), so a sender without the secret can neither forge a message nor
  alter one in flight. Batches, chunks and liveness reports are also bound to their
  connection (peer_session.py: the receiver's challenge and a counter, under the MAC), so a
  recorded one cannot be replayed; a replayed ``Hello`` only asks again, and its answer is
  bound to the asker's nonce;
- the *cluster id*: a one-way function of the secret and the cluster's name
  (``--cluster-token``), so members of differently named clusters sharing a secret still
  refuse each other's traffic, and the id reveals nothing of the secret.

A request whose MAC does not verify is refused with UNAUTHENTICATED and a message that says
nothing about this cluster. Only then are its ends checked (cluster id, destination member),
and a mismatch is answered with both named: the sender is a member, so nothing leaks.

The MAC input is a domain tag, then each field as a fixed-width big-endian integer or a
length-prefixed byte string, in the order given by each ``*_fields`` function. The tags
carry the format version: a change of encoding is a new tag, never a silent reinterpretation.

The secret authenticates *membership*, not *which* member: any holder could claim any member
id (Raft does not defend against a member that lies). With TLS on the peer port, each
member's certificate also names it (``rallypoint-member-<id>``), and the receiver checks the
name against the sender's claimed id.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections.abc import Iterable, Sequence
from typing import Protocol

from rallypoint.proto.peer.v1 import peer_pb2

MIN_SECRET_BYTES = 16
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")


class PeerSecretError(ValueError):
    """A peer secret that cannot be used; the message says why."""


def new_secret() -> str:
    """A fresh random secret, as text (64 hex digits: 256 bits)."""
    return os.urandom(32).hex()


def read_secret_file(path: str) -> bytes:
    """The secret in ``path`` (surrounding whitespace ignored)."""
    try:
        with open(path, "rb") as f:
            secret = f.read().strip()
    except OSError as exc:
        raise PeerSecretError(f"peer secret file {path}: {exc.strerror or exc}") from None
    check_secret(secret, f"peer secret file {path}")
    return secret


def check_secret(secret: bytes, where: str) -> None:
    if len(secret) < MIN_SECRET_BYTES:
        raise PeerSecretError(
            f"{where} holds {len(secret)} bytes; a peer secret needs at least "
            f"{MIN_SECRET_BYTES} (make one with: rallypoint secret > FILE)"
        )


def _derive(secret: bytes, label: bytes) -> bytes:
    return hmac.new(secret, b"rallypoint/v1/" + label, hashlib.sha256).digest()


def cluster_id_for(secret: bytes, cluster_name: str) -> int:
    """The 64-bit cluster id of ``cluster_name`` under ``secret`` (never 0)."""
    digest = hmac.new(
        _derive(secret, b"cluster-id"), cluster_name.encode(), hashlib.sha256
    ).digest()
    return int.from_bytes(digest[:8], "big") or 1


def _encode(parts: Iterable[int | bytes]) -> bytes:
    out = bytearray()
    for part in parts:
        if isinstance(part, bytes):
            out += _U32.pack(len(part))
            out += part
        else:
            out += _U64.pack(part & 0xFFFF_FFFF_FFFF_FFFF)
    return bytes(out)


class PeerKey:
    """Signs and verifies peer requests; made once per member from the secret."""

    def __init__(self, secret: bytes) -> None:
        check_secret(secret, "the peer secret")
        self._key = _derive(secret, b"peer-mac")

    def sign(self, tag: bytes, parts: Sequence[int | bytes]) -> bytes:
        return hmac.new(self._key, tag + _encode(parts), hashlib.sha256).digest()

    def verify(self, tag: bytes, parts: Sequence[int | bytes], mac: bytes) -> bool:
        return hmac.compare_digest(self.sign(tag, parts), mac)


# Version 2: the MAC covers the session's challenge and counter first (peer_session.py).
BATCH_TAG = b"rallypoint/peer/batch/v2"
CHUNK_TAG = b"rallypoint/peer/chunk/v2"
LIVENESS_TAG = b"rallypoint/peer/liveness/v2"
# Version 1 (no session), recognised only to refuse an older member with a clear message.
PREVIOUS_BATCH_TAG = b"rallypoint/peer/batch/v1"
PREVIOUS_CHUNK_TAG = b"rallypoint/peer/chunk/v1"
PREVIOUS_LIVENESS_TAG = b"rallypoint/peer/liveness/v1"
# Hello is a question that changes nothing; its answer is bound to the asker's nonce.
HELLO_TAG = b"rallypoint/peer/hello/v1"
HELLO_ANSWER_TAG = b"rallypoint/peer/hello-answer/v1"
# A hello's record version (peer_hello.advertise), signed apart from the hello's own fields.
HELLO_VERSION_TAG = b"rallypoint/peer/hello-version/v1"
# The members question (peer_lookup.py), a question like Hello, its answer bound to the nonce.
MEMBERS_TAG = b"rallypoint/peer/members/v1"
MEMBERS_ANSWER_TAG = b"rallypoint/peer/members-answer/v1"


class BatchRecord(Protocol):
    """A MessageBatch's fields: the protobuf message, or the stream transport's decoded
    ``ReceivedBatch`` (peerwire/frames.py)."""

    @property
    def cluster_id(self) -> int: ...

    @property
    def from_id(self) -> int: ...

    @property
    def to_id(self) -> int: ...

    @property
    def messages(self) -> Sequence[bytes]: ...

    @property
    def incarnation(self) -> int: ...

    @property
    def abstaining(self) -> bool: ...

    @property
    def mac(self) -> bytes: ...

    @property
    def challenge(self) -> bytes: ...

    @property
    def counter(self) -> int: ...


def batch_fields(batch: BatchRecord) -> list[int | bytes]:
    """What a ``MessageBatch``'s MAC covers after its session stamp (peer_session.py): every
    field but the stamp (``challenge``, ``counter``, ``mac``)."""
    return batch_parts(
        batch.cluster_id,
        batch.from_id,
        batch.to_id,
        batch.incarnation,
        batch.abstaining,
        batch.messages,
    )


def batch_parts(
    cluster_id: int,
    from_id: int,
    to_id: int,
    incarnation: int,
    abstaining: bool,
    messages: Sequence[bytes],
) -> list[int | bytes]:
    """``batch_fields`` of a batch of these fields (for a sender that builds no record)."""
    return [cluster_id, from_id, to_id, incarnation, int(abstaining), len(messages), *messages]


def chunk_fields(chunk: peer_pb2.SnapshotChunk) -> list[int | bytes]:
    """What a ``SnapshotChunk``'s MAC covers after its session stamp (peer_session.py): every
    field but the stamp (``challenge``, ``counter``, ``mac``)."""
    return [
        chunk.cluster_id,
        chunk.from_id,
        chunk.to_id,
        chunk.incarnation,
        chunk.snapshot_index,
        chunk.snapshot_term,
        chunk.offset,
        chunk.data,
        chunk.total_size,
        chunk.crc32c,
        chunk.message,
    ]


def liveness_fields(report: peer_pb2.LivenessReport) -> list[int | bytes]:
    """What a ``LivenessReport``'s MAC covers after its session stamp (peer_session.py): every
    field but the stamp (``challenge``, ``counter``, ``mac``)."""
    return [report.cluster_id, report.from_id, report.to_id, report.payload]


def member_name(member_id: int) -> str:
    """The name a member's peer TLS certificate carries (CN or a DNS subject alt name)."""
    return f"rallypoint-member-{member_id}"
