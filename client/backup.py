"""Backups (maintenance.proto, service Maintenance): the cluster's state, streamed from the
leader.

One call of ``SnapshotSave`` brings the bytes of a backup file (the server's
``coordinator/backup_file.py`` format; this module does not read it, ``rallypoint snapshot
status`` does). A follower refuses with the leader's address and the call goes there, as a
unary call does (``Transport.retrying``); a stream cut before its last byte is asked again
from the start, until the call's deadline. The whole call, not each attempt, is bounded by
the deadline: a large state takes longer than one unary attempt's bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from rallypoint.proto.v1 import maintenance_pb2, maintenance_pb2_grpc

from .caller import Caller
from .errors import UnavailableError


@dataclass(frozen=True, slots=True)
class SavedSnapshot:
    """A backup file's bytes, as the leader sent them."""

    endpoint: str
    member_id: int
    index: int
    data: bytes


async def snapshot_save(caller: Caller, timeout_s: float | None) -> SavedSnapshot:
    transport = caller.transport
    deadline = caller.deadline(timeout_s)

    async def attempt(target: str, attempt_timeout_s: float) -> SavedSnapshot:
        del attempt_timeout_s  # the stream is bounded by the whole call's deadline
        stub = maintenance_pb2_grpc.MaintenanceStub(transport.stubs(target).channel)
        call = stub.SnapshotSave(
            maintenance_pb2.SnapshotSaveRequest(),
            timeout=max(0.001, deadline.remaining_s()),
            metadata=transport.metadata,
        )
        chunks: list[bytes] = []
        first: maintenance_pb2.SnapshotSaveResponse | None = None
        async for response in call:
            if first is None:
                first = response
            chunks.append(response.chunk)
        data = b"".join(chunks)
        if first is None or len(data) != first.total_bytes:
            expected = 0 if first is None else first.total_bytes
            raise UnavailableError(
                f"{target} ended the snapshot stream after {len(data)} of {expected} bytes"
            )
        return SavedSnapshot(target, first.header.member_id, first.index, data)

    return await transport.retrying(attempt, deadline)
