"""The receiving side of the peer port (service ``rallypoint.peer.v1.Raft``).

Theory of operation. Every stream (Send, InstallSnapshot, Liveness) opens with this member's
fresh challenge in its initial metadata (peer_session.py). Every request is checked in this
order, and the first failure ends the stream: its MAC (peer_auth.py: a sender without the
cluster's secret is refused with UNAUTHENTICATED and told nothing more; a member running the
previous peer format with FAILED_PRECONDITION, saying so); with TLS, the sender's certificate
must name the member it claims to be; then its ends (this cluster, this member:
FAILED_PRECONDITION otherwise, with both named, since the sender is a member); then its
binding to this stream (made for this stream's challenge, numbered above every request taken
on it: PERMISSION_DENIED as a replay otherwise); then its content, decoded and range-checked
by the codec, and every entry it carries checked to apply (INVALID_ARGUMENT). Only then does
anything reach Raft, and only then can anything reach the disk. Refusals of a member's
traffic (a replay, the previous format) are logged and counted by the host.

The service is registered by :func:`add_peer_service`, which parses each request itself
(grpc_handlers.py): a request that does not even parse cannot be authenticated, and is
refused as any unauthenticated one, with UNAUTHENTICATED and nothing else said (grpc would
answer UNKNOWN with the parser's error).

Snapshots arrive by ``InstallSnapshot`` in chunks (raft/storage/snapshot_transfer.py assembles them
in a partial file, resumable within a member's life). Before a byte is written, the declared
size is checked against a bound and against the free space of the disk; once complete, the
file's checksum, its decoding, and the application's own check of its content
(``verify_snapshot``: the member table and state decode, the configuration is sane) must all
pass before Raft sees it and persists it. A refused or failed transfer leaves no partial
file behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
from collections.abc import AsyncIterator
from typing import Any, NoReturn, Protocol

import grpc
import grpc.aio

from rallypoint.proto.peer.v1 import peer_pb2, peer_pb2_grpc
from rallypoint.raft.codec import CodecError, decode_message
from rallypoint.raft.storage.snapshot_transfer import (
    ChunkOutOfOrderError,
    SnapshotChunk,
    SnapshotReceiver,
    SnapshotTransferError,
)
from rallypoint.raft.storage.snapshotter import SnapshotCorruptionError, decode_snapshot_file
from rallypoint.raft.types import Entry, Message, MessageType, Snapshot

from .grpc_handlers import Parse, Recorder, parse_or_refuse, parsed_stream, taking_bytes
from .peer_auth import (
    BATCH_TAG,
    CHUNK_TAG,
    HELLO_ANSWER_TAG,
    HELLO_TAG,
    LIVENESS_TAG,
    PREVIOUS_BATCH_TAG,
    PREVIOUS_CHUNK_TAG,
    PREVIOUS_LIVENESS_TAG,
    batch_fields,
    chunk_fields,
    liveness_fields,
    member_name,
)
from .peer_hello import advertise, advertised_version, hello_answer_fields, hello_request_fields
from .peer_session import (
    FORMAT_VERSION,
    InboundSession,
    PeerReplayError,
    Stamp,
    challenge_metadata,
    is_previous_format,
)
from .transport import PeerEnd

Context = grpc.aio.ServicerContext[Any, Any]

# What an unauthenticated caller is told, and nothing more.
UNAUTHENTICATED_MESSAGE = "peer authentication failed"
# Free disk space a snapshot transfer must leave behind.
FREE_SPACE_MARGIN_BYTES = 64 * 1024 * 1024


class PeerReceiver(PeerEnd, Protocol):
    """What the peer service needs from its member."""

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


def add_peer_service(server: grpc.aio.Server, host: PeerReceiver) -> None:
    """Register the peer service for ``host`` on ``server``; see the module docstring."""
    recorder = Recorder()
    peer_pb2_grpc.add_RaftServicer_to_server(PeerServicer(host), recorder)  # type: ignore[arg-type]
    for service, handlers in recorder.services:
        wrapped = {name: taking_bytes(h, _refusing_unparsable(h)) for name, h in handlers.items()}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))


def _refusing_unparsable(handler: Any) -> Any:
    """A wrapper for ``taking_bytes``: parse, and end the call UNAUTHENTICATED when a
    request does not parse."""

    def wrap(behaviour: Any, parse: Parse) -> Any:
        async def parsing(data: Any, context: Context) -> Any:
            async def refuse(error: Exception) -> NoReturn:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
                raise AssertionError("abort returned")  # abort always raises

            if handler.request_streaming:
                request = parsed_stream(data, parse, refuse)
            else:
                request = await parse_or_refuse(parse, data, refuse)
            return await behaviour(request, context)

        async def parsing_streamed(data: Any, context: Context) -> AsyncIterator[Any]:
            async def refuse(error: Exception) -> NoReturn:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
                raise AssertionError("abort returned")  # abort always raises

            request = parsed_stream(data, parse, refuse)
            async for response in behaviour(request, context):
                yield response

        if handler.response_streaming:
            if not handler.request_streaming:
                raise AssertionError("the peer service has no server-streaming-only method")
            return parsing_streamed
        return parsing

    return wrap


def remove_partial_snapshots(directory: str) -> int:
    """Delete every partial snapshot file in ``directory`` (at start-up: a restart abandons
    transfers, and the sender starts again from 0); how many there were."""
    found = glob.glob(os.path.join(glob.escape(directory), "*.partial"))
    for path in found:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return len(found)


class PeerServicer(peer_pb2_grpc.RaftServicer):
    """Receives Raft traffic for one member; see the module docstring."""

    def __init__(self, host: PeerReceiver) -> None:
        self._host = host

    async def _refuse(
        self, context: Context, code: grpc.StatusCode, message: str, reason: str = ""
    ) -> NoReturn:
        if reason:
            context.set_trailing_metadata((("rallypoint-error-reason", reason),))
        await context.abort(code, message)
        raise AssertionError("abort returned")  # abort always raises

    async def _check(
        self,
        context: Context,
        tag: bytes,
        fields: list[int | bytes],
        mac: bytes,
        cluster_id: int,
        from_id: int,
        to_id: int,
    ) -> None:
        if not self._host.peer_key.verify(tag, fields, mac):
            await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
        await self._check_ends(context, cluster_id, from_id, to_id)

    async def _open_session(self, context: Context) -> InboundSession:
        """This stream's session: its challenge goes out before any request is read."""
        session = InboundSession(self._host.peer_key)
        await context.send_initial_metadata(challenge_metadata(session.challenge))
        return session

    async def _check_stamped(
        self,
        context: Context,
        session: InboundSession,
        tags: tuple[bytes, bytes],
        fields: list[int | bytes],
        stamp: Stamp,
        cluster_id: int,
        from_id: int,
        to_id: int,
    ) -> None:
        """``_check`` for a request bound to its stream (``tags``: this format's and the
        previous one's), then its binding (peer_session.py)."""
        host = self._host
        tag, previous_tag = tags
        if not session.authentic(tag, fields, stamp):
            if not is_previous_format(host.peer_key, previous_tag, fields, stamp):
                await self._refuse(
                    context, grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE
                )
            detail = (
                f"member {from_id} sent peer messages in format version 1 (not bound to their "
                f"connection); member {host.member_id} speaks version {FORMAT_VERSION} and "
                f"refuses them: upgrade member {from_id}"
            )
            host.note_peer_refusal("old_format", from_id, detail)
            await self._refuse(context, grpc.StatusCode.FAILED_PRECONDITION, detail, "PEER_FORMAT")
        await self._check_ends(context, cluster_id, from_id, to_id)
        try:
            session.accept(stamp)
        except PeerReplayError as exc:
            detail = f"a message from member {from_id} refused: {exc}"
            host.note_peer_refusal("replay", from_id, detail)
            await self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, detail, "REPLAY")

    async def _check_ends(
        self, context: Context, cluster_id: int, from_id: int, to_id: int
    ) -> None:
        host = self._host
        if host.peer_names_required:
            names = _certificate_names(context)
            if member_name(from_id) not in names:
                await self._refuse(
                    context,
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"the peer certificate names {sorted(names) or 'nothing'}, not "
                    f"{member_name(from_id)}",
                )
        if cluster_id != host.cluster_id or to_id != host.member_id:
            await self._refuse(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"traffic for cluster {cluster_id:016x} member {to_id} reached cluster "
                f"{host.cluster_id:016x} member {host.member_id} (from member {from_id}): "
                "check the peer addresses and --cluster-token",
                "CLUSTER_MISMATCH",
            )

    async def _check_ready(self, context: Context) -> None:
        if not self._host.accepts_traffic:
            # Both are temporary for the caller, but a stopping member will not come up by
            # waiting: say which, so the logs of the others do not read "starting" at exit.
            what = "is shutting down" if self._host.stopping else "is starting"
            await self._refuse(
                context, grpc.StatusCode.UNAVAILABLE, f"member {self._host.member_id} {what}"
            )

    async def Send(
        self,
        request_iterator: AsyncIterator[peer_pb2.MessageBatch],
        context: grpc.aio.ServicerContext[peer_pb2.MessageBatch, peer_pb2.SendAck],
    ) -> peer_pb2.SendAck:
        batches = 0
        host = self._host
        session = await self._open_session(context)
        async for batch in request_iterator:
            await self._check_stamped(
                context,
                session,
                (BATCH_TAG, PREVIOUS_BATCH_TAG),
                batch_fields(batch),
                Stamp(batch.challenge, batch.counter, batch.mac),
                batch.cluster_id,
                batch.from_id,
                batch.to_id,
            )
            await self._check_ready(context)
            try:
                messages = [decode_message(m) for m in batch.messages]
            except CodecError as exc:
                await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"bad message: {exc}")
            for m in messages:
                # A proposal or read request may travel on through a follower that is not the
                # leader (any more), keeping its originator: the read's answer goes back there.
                forwarded = m.type in (MessageType.MsgProp, MessageType.MsgReadIndex)
                if (m.from_ != batch.from_id and not forwarded) or m.to != host.member_id:
                    await self._refuse(
                        context,
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"a message's ends differ from its batch's: {m.type.name} from "
                        f"{m.from_} to {m.to} in a batch from {batch.from_id} to "
                        f"{batch.to_id}",
                    )
                if m.type is MessageType.MsgSnap:
                    await self._refuse(
                        context,
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "MsgSnap travels by InstallSnapshot only",
                    )
                # Appends, and proposals a follower forwards, become log entries; a
                # ReadIndex request's one entry is only its context.
                if m.entries and m.type in (MessageType.MsgApp, MessageType.MsgProp):
                    try:
                        host.validate_entries(m.entries)
                    except ValueError as exc:
                        await self._refuse(
                            context, grpc.StatusCode.INVALID_ARGUMENT, f"bad entry: {exc}"
                        )
            host.deliver(messages, batch.incarnation, batch.abstaining)
            batches += 1
        return peer_pb2.SendAck(batches=batches)

    async def InstallSnapshot(
        self,
        request_iterator: AsyncIterator[peer_pb2.SnapshotChunk],
        context: grpc.aio.ServicerContext[peer_pb2.SnapshotChunk, peer_pb2.SnapshotAck],
    ) -> peer_pb2.SnapshotAck:
        receiver: SnapshotReceiver | None = None
        header: Message | None = None
        last: peer_pb2.SnapshotChunk | None = None
        path = ""
        loop = asyncio.get_running_loop()
        session = await self._open_session(context)
        try:
            async for chunk in request_iterator:
                await self._check_stamped(
                    context,
                    session,
                    (CHUNK_TAG, PREVIOUS_CHUNK_TAG),
                    chunk_fields(chunk),
                    Stamp(chunk.challenge, chunk.counter, chunk.mac),
                    chunk.cluster_id,
                    chunk.from_id,
                    chunk.to_id,
                )
                await self._check_ready(context)
                if receiver is None:
                    header = await self._first_chunk(chunk, context)
                    path = os.path.join(
                        self._host.incoming_snapshot_dir(),
                        f"{chunk.snapshot_term:016x}-{chunk.snapshot_index:016x}.snap",
                    )
                    receiver = SnapshotReceiver(path)
                last = chunk
                piece = SnapshotChunk(chunk.offset, chunk.data, chunk.total_size, chunk.crc32c)
                try:
                    done = await loop.run_in_executor(None, receiver.accept, piece)
                except ChunkOutOfOrderError as exc:
                    return peer_pb2.SnapshotAck(
                        snapshot_index=chunk.snapshot_index, next_offset=exc.expected_offset
                    )
                except SnapshotTransferError as exc:
                    await self._refuse(context, grpc.StatusCode.DATA_LOSS, str(exc))
                if done:
                    assert header is not None
                    await self._install(path, header, context)
                    return peer_pb2.SnapshotAck(
                        snapshot_index=chunk.snapshot_index,
                        next_offset=chunk.total_size,
                        complete=True,
                    )
        except grpc.aio.AbortError:
            # Refused: nothing of this transfer stays on disk.
            if path:
                await loop.run_in_executor(None, _remove_transfer, path)
            raise
        next_offset = 0 if last is None else last.offset + len(last.data)
        index = 0 if last is None else last.snapshot_index
        return peer_pb2.SnapshotAck(snapshot_index=index, next_offset=next_offset)

    async def _first_chunk(self, chunk: peer_pb2.SnapshotChunk, context: Context) -> Message:
        """The MsgSnap header of a transfer, once its declared size is acceptable."""
        if not chunk.message:
            await self._refuse(
                context, grpc.StatusCode.INVALID_ARGUMENT, "the first chunk must carry MsgSnap"
            )
        try:
            header = decode_message(chunk.message)
        except CodecError as exc:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"bad MsgSnap: {exc}")
        if header.type is not MessageType.MsgSnap or header.from_ != chunk.from_id:
            await self._refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "the first chunk's message is not its MsgSnap",
            )
        limit = self._host.max_snapshot_bytes
        if chunk.total_size > limit:
            await self._refuse(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"a snapshot of {chunk.total_size} bytes is over this member's limit of {limit}",
            )
        directory = self._host.incoming_snapshot_dir()
        os.makedirs(directory, exist_ok=True)
        free = shutil.disk_usage(directory).free
        if chunk.total_size + FREE_SPACE_MARGIN_BYTES > free:
            await self._refuse(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"a snapshot of {chunk.total_size} bytes does not fit: {free} bytes free in "
                f"{directory}",
            )
        return header

    async def _install(self, path: str, header: Message, context: Context) -> None:
        """Verify the assembled snapshot and hand it to Raft, which persists it."""
        loop = asyncio.get_running_loop()
        try:
            snapshot = await loop.run_in_executor(None, _read_snapshot_file, path)
            await loop.run_in_executor(None, self._host.verify_snapshot, snapshot)
            if snapshot.metadata.term > header.term:
                raise ValueError(
                    f"snapshot term {snapshot.metadata.term} is past its sender's {header.term}"
                )
        except (ValueError, OSError, SnapshotCorruptionError) as exc:
            # SnapshotCorruptionError: the checksum matched, the file's format did not.
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"bad snapshot: {exc}")
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self._host.deliver(
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

    async def Hello(
        self,
        request: peer_pb2.HelloRequest,
        context: grpc.aio.ServicerContext[peer_pb2.HelloRequest, peer_pb2.HelloAnswer],
    ) -> peer_pb2.HelloAnswer:
        await self._check(
            context,
            HELLO_TAG,
            hello_request_fields(request),
            request.mac,
            request.cluster_id,
            request.from_id,
            request.to_id,
        )
        probe = request.version_probe and (
            advertised_version(
                self._host.peer_key,
                request.nonce,
                request.from_id,
                request.record_version,
                request.version_mac,
                probe=True,
            )
            is not None
        )
        established, knows, term, last_index = self._host.hello_answer(request.from_id, probe)
        answer = peer_pb2.HelloAnswer(
            member_id=self._host.member_id,
            incarnation=self._host.incarnation,
            established=established,
            knows_sender=knows,
            term=term,
            last_index=last_index,
        )
        answer.mac = self._host.peer_key.sign(
            HELLO_ANSWER_TAG, hello_answer_fields(answer, request)
        )
        answer.record_version, answer.version_mac = advertise(
            self._host.peer_key, request.nonce, self._host.member_id
        )
        return answer

    async def Liveness(
        self,
        request_iterator: AsyncIterator[peer_pb2.LivenessReport],
        context: grpc.aio.ServicerContext[peer_pb2.LivenessReport, peer_pb2.LivenessAck],
    ) -> AsyncIterator[peer_pb2.LivenessAck]:
        session = await self._open_session(context)
        async for request in request_iterator:
            await self._check_stamped(
                context,
                session,
                (LIVENESS_TAG, PREVIOUS_LIVENESS_TAG),
                liveness_fields(request),
                Stamp(request.challenge, request.counter, request.mac),
                request.cluster_id,
                request.from_id,
                request.to_id,
            )
            await self._check_ready(context)
            try:
                taken = self._host.liveness_report(request.from_id, request.payload)
            except ValueError as exc:
                await self._refuse(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"liveness report from member {request.from_id} refused: {exc}",
                )
            yield peer_pb2.LivenessAck(taken=taken)


def _certificate_names(context: Context) -> set[str]:
    auth = context.auth_context()
    names: set[str] = set()
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in auth.get(key, ()):
            names.add(value.decode() if isinstance(value, bytes) else str(value))
    return names


def _read_snapshot_file(path: str) -> Snapshot:
    with open(path, "rb") as f:
        return decode_snapshot_file(path, f.read())


def _remove_transfer(path: str) -> None:
    """The assembled file and any partial file of the snapshot at ``path``."""
    for found in [path, *glob.glob(glob.escape(path) + ".*.partial")]:
        with contextlib.suppress(OSError):
            os.unlink(found)
