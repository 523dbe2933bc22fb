"""The Maintenance service: a backup of the cluster's state, streamed from the leader.

The leader answers after a linearizable read barrier, so every write acknowledged before the
request is in the backup; the state is captured between two applies and encoded on the
member's snapshot encoder thread (``node/snapshots.py``), never on its event loop, and sent
in chunks of ``CHUNK_BYTES``, one per message, so no message nears gRPC's size limit and the
loop runs between chunks. A follower answers NOT_LEADER with the leader's address; the
client asks the leader.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from rallypoint.proto.v1 import maintenance_pb2, maintenance_pb2_grpc

from ..backup_file import encode_header, file_chunks
from ..node.api import ServerNode
from .common import Context, header_pb, read_barrier

CHUNK_BYTES = 1024 * 1024


class MaintenanceServicer(maintenance_pb2_grpc.MaintenanceServicer):
    def __init__(self, node: ServerNode) -> None:
        self.node = node

    async def SnapshotSave(
        self, request: maintenance_pb2.SnapshotSaveRequest, context: Context
    ) -> AsyncIterator[maintenance_pb2.SnapshotSaveResponse]:
        self.node.require_leader()
        await read_barrier(self.node, context, serializable=False)
        header, payload = await self.node.backup()
        total_bytes = len(encode_header(header)) + len(payload)
        for number, chunk in enumerate(file_chunks(header, payload, CHUNK_BYTES)):
            if number == 0:
                yield maintenance_pb2.SnapshotSaveResponse(
                    header=header_pb(self.node.header()),
                    chunk=chunk,
                    index=header.index,
                    total_bytes=total_bytes,
                )
            else:
                yield maintenance_pb2.SnapshotSaveResponse(chunk=chunk)
