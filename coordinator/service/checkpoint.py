"""The CheckpointRegistry service. Begin, ShardDone, Commit, Abort and CommitMemorySnapshot
are replicated commands carrying the round and its fencing token; the state machine refuses
them (STALE_ROUND, STALE_TOKEN) unless they name the job's current ACTIVE round, so a zombie
cannot commit a checkpoint or record a memory snapshot. Latest and LatestMemorySnapshot are
reads of the applied state, after a read barrier unless the client asked for a serializable
read."""

from __future__ import annotations

from rallypoint.proto.v1 import rendezvous_pb2, rendezvous_pb2_grpc

from ..node.api import ServerNode
from ..state.commands import (
    CheckpointAbort,
    CheckpointBegin,
    CheckpointCommit,
    CheckpointShardDone,
    MemorySnapshotCommit,
)
from ..state.errors import JobNotFound, LimitExceeded
from ..state.jobs import CheckpointInfo, MemorySnapshotInfo
from ..state.results import (
    CheckpointAbortResult,
    CheckpointBeginResult,
    CheckpointCommitResult,
    MemorySnapshotCommitResult,
    ShardDoneResult,
)
from ..state.view import CheckpointsView
from . import validate
from .common import Context, header_pb, propose, read_barrier
from .errors import RequestFailed


def checkpoint_pb(info: CheckpointInfo) -> rendezvous_pb2.CheckpointInfo:
    return rendezvous_pb2.CheckpointInfo(
        checkpoint_id=info.checkpoint_id,
        step=info.step,
        round=info.round,
        world_size=info.world_size,
        layout=info.layout,
        uri=info.uri,
        committed_ms=info.committed_ms,
    )


def memory_snapshot_pb(info: MemorySnapshotInfo) -> rendezvous_pb2.MemorySnapshotInfo:
    return rendezvous_pb2.MemorySnapshotInfo(
        snapshot_id=info.snapshot_id,
        step=info.step,
        round=info.round,
        world_size=info.world_size,
        layout=info.layout,
        placement=info.placement,
        committed_ms=info.committed_ms,
    )


class CheckpointServicer(rendezvous_pb2_grpc.CheckpointRegistryServicer):
    def __init__(self, node: ServerNode) -> None:
        self.node = node

    async def _registry(self, job: str, serializable: bool, context: Context) -> CheckpointsView:
        """The registry of ``job`` for a read: after a read barrier unless ``serializable``."""
        job_id = validate.job_id(job)
        await read_barrier(self.node, context, serializable)
        found = self.node.state.rendezvous.jobs.get(job_id)
        if found is None:
            raise RequestFailed(JobNotFound(job_id))
        return found.checkpoints

    async def Begin(
        self, request: rendezvous_pb2.CheckpointBeginRequest, context: Context
    ) -> rendezvous_pb2.CheckpointBeginResponse:
        limits = self.node.state.limits.rendezvous
        header = validate.session_header(request.HasField("header"), request.header)
        fence = validate.checkpoint_fence(request.HasField("fence"), request.fence)
        if len(request.layout) > limits.max_layout_bytes:
            raise RequestFailed(LimitExceeded("checkpoint layout bytes", limits.max_layout_bytes))
        if len(request.uri) > limits.max_uri_chars:
            raise RequestFailed(LimitExceeded("checkpoint uri characters", limits.max_uri_chars))
        command = CheckpointBegin(
            job=fence.job,
            round=fence.round,
            fencing_token=fence.fencing_token,
            step=validate.non_negative(request.step, "step"),
            world_size=validate.positive(request.world_size, "world_size"),
            layout=request.layout,
            uri=request.uri,
        )
        result = await propose(self.node, command, context, CheckpointBeginResult, header)
        return rendezvous_pb2.CheckpointBeginResponse(
            header=header_pb(self.node.header()), checkpoint_id=result.checkpoint_id
        )

    async def ShardDone(
        self, request: rendezvous_pb2.CheckpointShardDoneRequest, context: Context
    ) -> rendezvous_pb2.CheckpointShardDoneResponse:
        header = validate.session_header(request.HasField("header"), request.header)
        fence = validate.checkpoint_fence(request.HasField("fence"), request.fence)
        command = CheckpointShardDone(
            job=fence.job,
            round=fence.round,
            fencing_token=fence.fencing_token,
            checkpoint_id=validate.positive(request.checkpoint_id, "checkpoint_id"),
            rank=validate.non_negative(request.rank, "rank"),
        )
        result = await propose(self.node, command, context, ShardDoneResult, header)
        return rendezvous_pb2.CheckpointShardDoneResponse(
            header=header_pb(self.node.header()),
            reported=result.reported,
            world_size=result.world_size,
        )

    async def Commit(
        self, request: rendezvous_pb2.CheckpointCommitRequest, context: Context
    ) -> rendezvous_pb2.CheckpointCommitResponse:
        header = validate.session_header(request.HasField("header"), request.header)
        fence = validate.checkpoint_fence(request.HasField("fence"), request.fence)
        command = CheckpointCommit(
            job=fence.job,
            round=fence.round,
            fencing_token=fence.fencing_token,
            checkpoint_id=validate.positive(request.checkpoint_id, "checkpoint_id"),
        )
        result = await propose(self.node, command, context, CheckpointCommitResult, header)
        return rendezvous_pb2.CheckpointCommitResponse(
            header=header_pb(self.node.header()),
            checkpoint=checkpoint_pb(result.checkpoint),
            retired=[checkpoint_pb(info) for info in result.retired],
        )

    async def Abort(
        self, request: rendezvous_pb2.CheckpointAbortRequest, context: Context
    ) -> rendezvous_pb2.CheckpointAbortResponse:
        header = validate.session_header(request.HasField("header"), request.header)
        fence = validate.checkpoint_fence(request.HasField("fence"), request.fence)
        command = CheckpointAbort(
            job=fence.job,
            round=fence.round,
            fencing_token=fence.fencing_token,
            checkpoint_id=validate.positive(request.checkpoint_id, "checkpoint_id"),
        )
        await propose(self.node, command, context, CheckpointAbortResult, header)
        return rendezvous_pb2.CheckpointAbortResponse(header=header_pb(self.node.header()))

    async def Latest(
        self, request: rendezvous_pb2.CheckpointLatestRequest, context: Context
    ) -> rendezvous_pb2.CheckpointLatestResponse:
        registry = await self._registry(request.job, request.serializable, context)
        response = rendezvous_pb2.CheckpointLatestResponse(header=header_pb(self.node.header()))
        latest = registry.latest()
        if latest is not None:
            response.checkpoint.CopyFrom(checkpoint_pb(latest))
        return response

    async def CommitMemorySnapshot(
        self, request: rendezvous_pb2.MemorySnapshotCommitRequest, context: Context
    ) -> rendezvous_pb2.MemorySnapshotCommitResponse:
        limits = self.node.state.limits.rendezvous
        header = validate.session_header(request.HasField("header"), request.header)
        fence = validate.checkpoint_fence(request.HasField("fence"), request.fence)
        if len(request.layout) > limits.max_layout_bytes:
            raise RequestFailed(
                LimitExceeded("memory snapshot layout bytes", limits.max_layout_bytes)
            )
        if len(request.placement) > limits.max_placement_bytes:
            raise RequestFailed(
                LimitExceeded("memory snapshot placement bytes", limits.max_placement_bytes)
            )
        command = MemorySnapshotCommit(
            job=fence.job,
            round=fence.round,
            fencing_token=fence.fencing_token,
            step=validate.non_negative(request.step, "step"),
            world_size=validate.positive(request.world_size, "world_size"),
            layout=request.layout,
            placement=request.placement,
            planned_end=request.planned_end,
        )
        result = await propose(self.node, command, context, MemorySnapshotCommitResult, header)
        return rendezvous_pb2.MemorySnapshotCommitResponse(
            header=header_pb(self.node.header()), snapshot=memory_snapshot_pb(result.snapshot)
        )

    async def LatestMemorySnapshot(
        self, request: rendezvous_pb2.MemorySnapshotLatestRequest, context: Context
    ) -> rendezvous_pb2.MemorySnapshotLatestResponse:
        registry = await self._registry(request.job, request.serializable, context)
        response = rendezvous_pb2.MemorySnapshotLatestResponse(header=header_pb(self.node.header()))
        latest = registry.latest_memory_snapshot()
        if latest is not None:
            response.snapshot.CopyFrom(memory_snapshot_pb(latest))
        return response
