"""A backup file: the application state of a cluster at one applied index, checked.

Theory of operation. ``rallypoint snapshot save FILE`` asks the leader for its state at one
applied index (after a linearizable read barrier, so every write acknowledged before the
request is in it); the leader captures it between two applies, encodes it off its event loop
and streams these bytes in chunks (``service/maintenance.py``). The file is::

    MAGIC | u32 header length | header (msgpack map) | u32 CRC32 of the header | payload

The payload is exactly a Raft snapshot's data (``member_table.encode_app_snapshot``: the
member table and the state machine's own snapshot, in whatever format the state machine
writes), so a backup holds nothing a member does not already know how to read. The header
says where it came from (cluster id, the leader that wrote it, the configuration at that
index), the index and term, the payload's size and its SHA-256. ``read`` checks all of it
and refuses a truncated, corrupt or foreign file with one line naming what is wrong; nothing
is decoded on trust. ``snapshot restore`` (``node/recovery.py``) builds new members' data
directories from it.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack

from .member_table import MemberTable, MemberTableError, decode_app_snapshot
from .state.codec import StateCodecError
from .state.machine import Limits, StateMachine

__all__ = [
    "FORMAT",
    "MAGIC",
    "Backup",
    "BackupError",
    "BackupHeader",
    "BackupSummary",
    "encode_header",
    "read",
    "summarize",
]

MAGIC = b"RALLYPOINT-BACKUP\n"
FORMAT = 1
_U32 = struct.Struct(">I")
# A header is a few hundred bytes; a larger length is a damaged or foreign file.
_MAX_HEADER_BYTES = 1 << 20


class BackupError(ValueError):
    """A backup file that cannot be used: its one-line message says why."""


@dataclass(frozen=True, slots=True)
class BackupHeader:
    index: int
    term: int
    cluster_id: int
    # The member that wrote it (the leader at the time).
    member_id: int
    voters: tuple[int, ...]
    learners: tuple[int, ...]
    size_bytes: int
    sha256: bytes
    created_ms: int

    def to_obj(self) -> dict[str, object]:
        return {
            "format": FORMAT,
            "index": self.index,
            "term": self.term,
            "cluster_id": self.cluster_id,
            "member_id": self.member_id,
            "voters": list(self.voters),
            "learners": list(self.learners),
            "size_bytes": self.size_bytes,
            "sha256": self.sha256,
            "created_ms": self.created_ms,
        }

    @staticmethod
    def from_obj(obj: object, path: str) -> BackupHeader:
        if not isinstance(obj, dict):
            raise BackupError(f"{path}: malformed backup header")
        found = obj.get("format")
        if found != FORMAT:
            raise BackupError(
                f"{path}: backup format {found!r} is not one this version reads ({FORMAT})"
            )
        try:
            header = BackupHeader(
                index=_int(obj["index"]),
                term=_int(obj["term"]),
                cluster_id=_int(obj["cluster_id"]),
                member_id=_int(obj["member_id"]),
                voters=tuple(_int(v) for v in obj["voters"]),
                learners=tuple(_int(v) for v in obj["learners"]),
                size_bytes=_int(obj["size_bytes"]),
                sha256=obj["sha256"],
                created_ms=_int(obj["created_ms"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BackupError(f"{path}: malformed backup header ({exc!r})"[:300]) from None
        if not isinstance(header.sha256, bytes) or len(header.sha256) != 32:
            raise BackupError(f"{path}: malformed backup header (checksum)")
        return header


def _int(value: object) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"not a non-negative integer: {value!r}"[:100])
    return value


@dataclass(frozen=True, slots=True)
class Backup:
    header: BackupHeader
    # The Raft snapshot data (member table and state machine), checked against the header.
    payload: bytes


def encode_header(header: BackupHeader) -> bytes:
    """Everything before the payload: the magic, the header and its CRC."""
    packed = msgpack.packb(header.to_obj(), use_bin_type=True)
    assert isinstance(packed, bytes)
    return b"".join([MAGIC, _U32.pack(len(packed)), packed, _U32.pack(zlib.crc32(packed))])


def file_chunks(header: BackupHeader, payload: bytes, chunk_bytes: int) -> Iterator[bytes]:
    """The file's bytes in pieces of at most ``chunk_bytes`` (the header in the first)."""
    yield encode_header(header)
    view = memoryview(payload)
    for start in range(0, len(payload), chunk_bytes):
        yield bytes(view[start : start + chunk_bytes])


def parse(data: bytes, path: str) -> Backup:
    """Check a whole backup file's bytes; BackupError, naming ``path``, if unusable."""
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):
            raise BackupError(f"{path}: truncated: it ends inside the backup's first bytes")
        raise BackupError(f"{path}: not a rallypoint backup (it does not start with one's mark)")
    at = len(MAGIC)
    if len(data) < at + _U32.size:
        raise BackupError(f"{path}: truncated: it ends before the backup's header")
    (length,) = _U32.unpack_from(data, at)
    at += _U32.size
    if length > _MAX_HEADER_BYTES:
        raise BackupError(f"{path}: corrupt: a header of {length} bytes")
    if len(data) < at + length + _U32.size:
        raise BackupError(f"{path}: truncated: it ends inside the backup's header")
    packed = data[at : at + length]
    at += length
    (crc,) = _U32.unpack_from(data, at)
    at += _U32.size
    if zlib.crc32(packed) != crc:
        raise BackupError(f"{path}: corrupt: the header's checksum does not match")
    try:
        obj = msgpack.unpackb(packed, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise BackupError(f"{path}: corrupt header ({exc})"[:300]) from None
    header = BackupHeader.from_obj(obj, path)
    payload = data[at:]
    if len(payload) < header.size_bytes:
        raise BackupError(
            f"{path}: truncated: it holds {len(payload)} of the snapshot's "
            f"{header.size_bytes} bytes"
        )
    if len(payload) > header.size_bytes:
        raise BackupError(
            f"{path}: corrupt: {len(payload) - header.size_bytes} bytes after the snapshot"
        )
    if hashlib.sha256(payload).digest() != header.sha256:
        raise BackupError(f"{path}: corrupt: the snapshot's SHA-256 does not match its header")
    return Backup(header, payload)


def read(path: str) -> Backup:
    """Read and check a backup file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise BackupError(f"{path}: {exc.strerror or exc}") from None
    return parse(data, path)


@dataclass(frozen=True, slots=True)
class BackupSummary:
    index: int
    term: int
    cluster_id: int
    member_id: int
    voters: tuple[int, ...]
    learners: tuple[int, ...]
    size_bytes: int
    sha256: str
    created_ms: int
    revision: int
    keys: int
    leases: int
    sessions: int
    jobs: tuple[str, ...]
    members: tuple[tuple[int, str, str], ...]


def decode(backup: Backup, limits: Limits | None = None) -> tuple[MemberTable, StateMachine]:
    """The member table and state machine a checked backup holds; BackupError if they do
    not decode (a payload that checks but was written by a newer version, say)."""
    try:
        members, state_bytes = decode_app_snapshot(backup.payload)
        machine = StateMachine(limits)
        machine.restore(state_bytes)
    except (MemberTableError, StateCodecError) as exc:
        raise BackupError(f"the backup's state does not decode: {exc}"[:300]) from None
    if machine.applied_index != backup.header.index:
        raise BackupError(
            f"the backup's state is at index {machine.applied_index}, its header says "
            f"{backup.header.index}"
        )
    return members, machine


def summarize(backup: Backup) -> BackupSummary:
    members, machine = decode(backup)
    header = backup.header
    return BackupSummary(
        index=header.index,
        term=header.term,
        cluster_id=header.cluster_id,
        member_id=header.member_id,
        voters=header.voters,
        learners=header.learners,
        size_bytes=header.size_bytes,
        sha256=header.sha256.hex(),
        created_ms=header.created_ms,
        revision=machine.revision,
        keys=len(machine.kv),
        leases=len(machine.leases.in_order()),
        sessions=len(machine.sessions.in_order()),
        jobs=tuple(sorted(machine.rendezvous.jobs)),
        members=tuple((i, a.peer_address, a.client_address) for i, a in members.items()),
    )
