"""What the receiving side of the peer port checks in every request.

Theory of operation. The peer listener (``peerwire/server.py``) hands each request here,
with the session of its connection and the names of the sender's TLS certificate. Every
request is checked in this order, and the first failure
raises :class:`PeerRefused`, which ends the connection: its MAC (peer_auth.py: a sender
without the cluster's secret is refused with UNAUTHENTICATED and told nothing more; a member
running the previous peer format with FAILED_PRECONDITION, saying so); with TLS, the
sender's certificate must name the member it claims to be; then its ends (this cluster,
this member: FAILED_PRECONDITION otherwise, with both named, since the sender is a member);
then its binding to this connection (made for this connection's challenge, numbered above
every request taken on it: PERMISSION_DENIED as a replay otherwise); then its content,
decoded and range-checked by the codec, and every entry it carries checked to apply
(INVALID_ARGUMENT). Only then does anything reach Raft, and only then can anything reach the
disk. Refusals of a member's traffic (a replay, the previous format) are logged and counted
by the host.

Snapshots arrive in chunks (raft/storage/snapshot_transfer.py assembles them in a partial
file, resumable within a member's life). Before a byte is written, the declared size is
checked against a bound and against the free space of the disk; once complete, the file's
checksum, its decoding, and the application's own check of its content
(``verify_snapshot``) must all pass before Raft sees it and persists it. A refused or failed
transfer leaves no partial file behind (:meth:`SnapshotIntake.discard`).

Status codes are grpc's ``StatusCode`` names (the listener sends the name in its ERROR
frame), so a refusal reads as the client API's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
from collections.abc import Set
from typing import NoReturn, Protocol

import grpc

from rallypoint.proto.peer.v1 import peer_pb2
from rallypoint.raft.codec import CodecError, decode_message
from rallypoint.raft.storage.snapshot_transfer import (
    ChunkOutOfOrderError,
    SnapshotChunk,
    SnapshotReceiver,
    SnapshotTransferError,
)
from rallypoint.raft.storage.snapshotter import SnapshotCorruptionError, decode_snapshot_file
from rallypoint.raft.types import Entry, Message, MessageType, Snapshot

from .member_table import MemberTable
from .peer_auth import (
    BATCH_TAG,
    CHUNK_TAG,
    HELLO_ANSWER_TAG,
    HELLO_TAG,
    LIVENESS_TAG,
    MEMBERS_TAG,
    PREVIOUS_BATCH_TAG,
    PREVIOUS_CHUNK_TAG,
    PREVIOUS_LIVENESS_TAG,
    BatchRecord,
    batch_fields,
    chunk_fields,
    liveness_fields,
    member_name,
)
from .peer_hello import advertise, advertised_version, hello_answer_fields, hello_request_fields
from .peer_lookup import answer_members, members_request_fields
from .peer_session import (
    FORMAT_VERSION,
    InboundSession,
    PeerReplayError,
    Stamp,
    is_previous_format,
)
from .transport import PeerEnd

# What an unauthenticated caller is told, and nothing more.
UNAUTHENTICATED_MESSAGE = "peer authentication failed"
# Free disk space a snapshot transfer must leave behind.
FREE_SPACE_MARGIN_BYTES = 64 * 1024 * 1024


class PeerRefused(Exception):
    """A request refused: the connection ends with ``code`` and ``message`` (and, for a
    member's traffic, a machine-readable ``reason``)."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason


def _refuse(code: grpc.StatusCode, message: str, reason: str = "") -> NoReturn:
    raise PeerRefused(code, message, reason)


class PeerReceiver(PeerEnd, Protocol):
    """What the receiving side needs from its member."""

    @property
    def accepts_traffic(self) -> bool: ...

    @property
    def stopping(self) -> bool:
        """The member is shutting down (it no longer accepts traffic, and never will)."""
        ...

    @property
    def peer_names_required(self) -> bool: ...

    @property
    def max_snapshot_bytes(self) -> int: ...

    def deliver(self, messages: list[Message], incarnation: int, abstaining: bool) -> None: ...

    def hello_answer(self, from_id: int, probe: bool = False) -> tuple[bool, bool, int, int]: ...

    def members_answer(self) -> tuple[int, MemberTable]:
        """(applied index, member table) for a member that asks (peer_lookup.py)."""
        ...

    def liveness_report(self, from_id: int, payload: bytes) -> bool:
        """Take a member's liveness report; False if this member is not the leader. Raise
        ValueError, saying why, for a report that cannot be read."""
        ...

    def validate_entries(self, entries: tuple[Entry, ...]) -> None:
        """Raise ValueError, saying why, unless every entry would apply."""
        ...

    def verify_snapshot(self, snapshot: Snapshot) -> None:
        """Raise ValueError, saying why, unless ``snapshot`` is fit to install."""
        ...

    def incoming_snapshot_dir(self) -> str: ...

    def note_peer_refusal(self, reason: str, from_id: int, detail: str) -> None:
        """Log and count refused traffic of a member (``reason``: ``replay``,
        ``old_format``)."""
        ...


def remove_partial_snapshots(directory: str) -> int:
    """Delete every partial snapshot file in ``directory`` (at start-up: a restart abandons
    transfers, and the sender starts again from 0); how many there were."""
    found = glob.glob(os.path.join(glob.escape(directory), "*.partial"))
    for path in found:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return len(found)


class PeerGate:
    """The checks of every peer request for one member; see the module docstring."""

    def __init__(self, host: PeerReceiver) -> None:
        self.host = host

    def check(
        self,
        tag: bytes,
        fields: list[int | bytes],
        mac: bytes,
        cluster_id: int,
        from_id: int,
        to_id: int,
        names: Set[str],
    ) -> None:
        """A request not bound to a connection (Hello): its MAC, then its ends."""
        if not self.host.peer_key.verify(tag, fields, mac):
            _refuse(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
        self.check_ends(cluster_id, from_id, to_id, names)

    def check_stamped(
        self,
        session: InboundSession,
        tags: tuple[bytes, bytes],
        fields: list[int | bytes],
        stamp: Stamp,
        cluster_id: int,
        from_id: int,
        to_id: int,
        names: Set[str],
    ) -> None:
        """``check`` for a request bound to its connection (``tags``: this format's and the
        previous one's), then its binding (peer_session.py)."""
        host = self.host
        tag, previous_tag = tags
        if not session.authentic(tag, fields, stamp):
            if not is_previous_format(host.peer_key, previous_tag, fields, stamp):
                _refuse(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
            detail = (
                f"member {from_id} sent peer messages in format version 1 (not bound to their "
                f"connection); member {host.member_id} speaks version {FORMAT_VERSION} and "
                f"refuses them: upgrade member {from_id}"
            )
            host.note_peer_refusal("old_format", from_id, detail)
            _refuse(grpc.StatusCode.FAILED_PRECONDITION, detail, "PEER_FORMAT")
        self.check_ends(cluster_id, from_id, to_id, names)
        try:
            session.accept(stamp)
        except PeerReplayError as exc:
            detail = f"a message from member {from_id} refused: {exc}"
            host.note_peer_refusal("replay", from_id, detail)
            _refuse(grpc.StatusCode.PERMISSION_DENIED, detail, "REPLAY")

    def check_ends(self, cluster_id: int, from_id: int, to_id: int, names: Set[str]) -> None:
        host = self.host
        if host.peer_names_required and member_name(from_id) not in names:
            _refuse(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the peer certificate names {sorted(names) or 'nothing'}, not "
                f"{member_name(from_id)}",
            )
        if cluster_id != host.cluster_id or to_id != host.member_id:
            _refuse(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"traffic for cluster {cluster_id:016x} member {to_id} reached cluster "
                f"{host.cluster_id:016x} member {host.member_id} (from member {from_id}): "
                "check the peer addresses and --cluster-token",
                "CLUSTER_MISMATCH",
            )

    def check_ready(self) -> None:
        if not self.host.accepts_traffic:
            # Both are temporary for the caller, but a stopping member will not come up by
            # waiting: say which, so the logs of the others do not read "starting" at exit.
            what = "is shutting down" if self.host.stopping else "is starting"
            _refuse(grpc.StatusCode.UNAVAILABLE, f"member {self.host.member_id} {what}")

    def take_batch(self, session: InboundSession, batch: BatchRecord, names: Set[str]) -> None:
        """Check one batch of Raft messages and step them into Raft."""
        host = self.host
        self.check_stamped(
            session,
            (BATCH_TAG, PREVIOUS_BATCH_TAG),
            batch_fields(batch),
            Stamp(batch.challenge, batch.counter, batch.mac),
            batch.cluster_id,
            batch.from_id,
            batch.to_id,
            names,
        )
        self.check_ready()
        try:
            messages = [decode_message(m) for m in batch.messages]
        except CodecError as exc:
            _refuse(grpc.StatusCode.INVALID_ARGUMENT, f"bad message: {exc}")
        for m in messages:
            # A proposal or read request may travel on through a follower that is not the
            # leader (any more), keeping its originator: the read's answer goes back there.
            forwarded = m.type in (MessageType.MsgProp, MessageType.MsgReadIndex)
            if (m.from_ != batch.from_id and not forwarded) or m.to != host.member_id:
                _refuse(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"a message's ends differ from its batch's: {m.type.name} from "
                    f"{m.from_} to {m.to} in a batch from {batch.from_id} to {batch.to_id}",
                )
            if m.type is MessageType.MsgSnap:
                _refuse(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "MsgSnap travels on a snapshot connection only",
                )
            # Appends, and proposals a follower forwards, become log entries; a ReadIndex
            # request's one entry is only its context.
            if m.entries and m.type in (MessageType.MsgApp, MessageType.MsgProp):
                try:
                    host.validate_entries(m.entries)
                except ValueError as exc:
                    _refuse(grpc.StatusCode.INVALID_ARGUMENT, f"bad entry: {exc}")
        host.deliver(messages, batch.incarnation, batch.abstaining)

    def hello(self, request: peer_pb2.HelloRequest, names: Set[str]) -> peer_pb2.HelloAnswer:
        host = self.host
        self.check(
            HELLO_TAG,
            hello_request_fields(request),
            request.mac,
            request.cluster_id,
            request.from_id,
            request.to_id,
            names,
        )
        probe = request.version_probe and (
            advertised_version(
                host.peer_key,
                request.nonce,
                request.from_id,
                request.record_version,
                request.version_mac,
                probe=True,
            )
            is not None
        )
        established, knows, term, last_index = host.hello_answer(request.from_id, probe)
        answer = peer_pb2.HelloAnswer(
            member_id=host.member_id,
            incarnation=host.incarnation,
            established=established,
            knows_sender=knows,
            term=term,
            last_index=last_index,
        )
        answer.mac = host.peer_key.sign(HELLO_ANSWER_TAG, hello_answer_fields(answer, request))
        answer.record_version, answer.version_mac = advertise(
            host.peer_key, request.nonce, host.member_id
        )
        return answer

    def members(self, request: peer_pb2.MembersRequest, names: Set[str]) -> peer_pb2.MembersAnswer:
        """A member asks for this member's member table (peer_lookup.py)."""
        host = self.host
        self.check(
            MEMBERS_TAG,
            members_request_fields(request),
            request.mac,
            request.cluster_id,
            request.from_id,
            request.to_id,
            names,
        )
        applied, table = host.members_answer()
        return answer_members(host.peer_key, request, host.member_id, applied, table)

    def liveness(
        self, session: InboundSession, request: peer_pb2.LivenessReport, names: Set[str]
    ) -> bool:
        self.check_stamped(
            session,
            (LIVENESS_TAG, PREVIOUS_LIVENESS_TAG),
            liveness_fields(request),
            Stamp(request.challenge, request.counter, request.mac),
            request.cluster_id,
            request.from_id,
            request.to_id,
            names,
        )
        self.check_ready()
        try:
            return self.host.liveness_report(request.from_id, request.payload)
        except ValueError as exc:
            _refuse(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"liveness report from member {request.from_id} refused: {exc}",
            )


class SnapshotIntake:
    """One connection's snapshot transfer: chunks in, then an ack (see the module
    docstring). ``take`` returns the ack that ends the transfer, or None for more."""

    def __init__(self, gate: PeerGate, session: InboundSession, names: Set[str]) -> None:
        self._gate = gate
        self._session = session
        self._names = names
        self._receiver: SnapshotReceiver | None = None
        self._header: Message | None = None
        self._last: peer_pb2.SnapshotChunk | None = None
        self.path = ""

    async def take(self, chunk: peer_pb2.SnapshotChunk) -> peer_pb2.SnapshotAck | None:
        gate = self._gate
        gate.check_stamped(
            self._session,
            (CHUNK_TAG, PREVIOUS_CHUNK_TAG),
            chunk_fields(chunk),
            Stamp(chunk.challenge, chunk.counter, chunk.mac),
            chunk.cluster_id,
            chunk.from_id,
            chunk.to_id,
            self._names,
        )
        gate.check_ready()
        loop = asyncio.get_running_loop()
        if self._receiver is None:
            self._header = self._first_chunk(chunk)
            self.path = os.path.join(
                gate.host.incoming_snapshot_dir(),
                f"{chunk.snapshot_term:016x}-{chunk.snapshot_index:016x}.snap",
            )
            self._receiver = SnapshotReceiver(self.path)
        self._last = chunk
        piece = SnapshotChunk(chunk.offset, chunk.data, chunk.total_size, chunk.crc32c)
        try:
            done = await loop.run_in_executor(None, self._receiver.accept, piece)
        except ChunkOutOfOrderError as exc:
            return peer_pb2.SnapshotAck(
                snapshot_index=chunk.snapshot_index, next_offset=exc.expected_offset
            )
        except SnapshotTransferError as exc:
            _refuse(grpc.StatusCode.DATA_LOSS, str(exc))
        if not done:
            return None
        assert self._header is not None
        await self._install(self._header)
        return peer_pb2.SnapshotAck(
            snapshot_index=chunk.snapshot_index, next_offset=chunk.total_size, complete=True
        )

    def ended(self) -> peer_pb2.SnapshotAck:
        """The ack for a stream the sender ended before the snapshot was whole."""
        last = self._last
        next_offset = 0 if last is None else last.offset + len(last.data)
        index = 0 if last is None else last.snapshot_index
        return peer_pb2.SnapshotAck(snapshot_index=index, next_offset=next_offset)

    async def discard(self) -> None:
        """Refused: nothing of this transfer stays on disk."""
        if self.path:
            await asyncio.get_running_loop().run_in_executor(None, _remove_transfer, self.path)

    def _first_chunk(self, chunk: peer_pb2.SnapshotChunk) -> Message:
        """The MsgSnap header of a transfer, once its declared size is acceptable."""
        host = self._gate.host
        if not chunk.message:
            _refuse(grpc.StatusCode.INVALID_ARGUMENT, "the first chunk must carry MsgSnap")
        try:
            header = decode_message(chunk.message)
        except CodecError as exc:
            _refuse(grpc.StatusCode.INVALID_ARGUMENT, f"bad MsgSnap: {exc}")
        if header.type is not MessageType.MsgSnap or header.from_ != chunk.from_id:
            _refuse(
                grpc.StatusCode.INVALID_ARGUMENT, "the first chunk's message is not its MsgSnap"
            )
        limit = host.max_snapshot_bytes
        if chunk.total_size > limit:
            _refuse(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"a snapshot of {chunk.total_size} bytes is over this member's limit of {limit}",
            )
        directory = host.incoming_snapshot_dir()
        os.makedirs(directory, exist_ok=True)
        free = shutil.disk_usage(directory).free
        if chunk.total_size + FREE_SPACE_MARGIN_BYTES > free:
            _refuse(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"a snapshot of {chunk.total_size} bytes does not fit: {free} bytes free in "
                f"{directory}",
            )
        return header

    async def _install(self, header: Message) -> None:
        """Verify the assembled snapshot and hand it to Raft, which persists it."""
        host = self._gate.host
        loop = asyncio.get_running_loop()
        path = self.path
        try:
            snapshot = await loop.run_in_executor(None, _read_snapshot_file, path)
            await loop.run_in_executor(None, host.verify_snapshot, snapshot)
            if snapshot.metadata.term > header.term:
                raise ValueError(
                    f"snapshot term {snapshot.metadata.term} is past its sender's {header.term}"
                )
        except (ValueError, OSError, SnapshotCorruptionError) as exc:
            # SnapshotCorruptionError: the checksum matched, the file's format did not.
            _refuse(grpc.StatusCode.INVALID_ARGUMENT, f"bad snapshot: {exc}")
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        host.deliver(
            [
                Message(
                    type=MessageType.MsgSnap,
                    to=header.to,
                    from_=header.from_,
                    term=header.term,
                    snapshot=snapshot,
                )
            ],
            0,
            False,
        )


def _read_snapshot_file(path: str) -> Snapshot:
    with open(path, "rb") as f:
        return decode_snapshot_file(path, f.read())


def _remove_transfer(path: str) -> None:
    """The assembled file and any partial file of the snapshot at ``path``."""
    for found in [path, *glob.glob(glob.escape(path) + ".*.partial")]:
        with contextlib.suppress(OSError):
            os.unlink(found)
