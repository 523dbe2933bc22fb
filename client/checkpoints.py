"""The checkpoint registry of a job, fenced by one round (rendezvous.proto, service
CheckpointRegistry).

Begin, ShardDone, Commit and Abort carry the round and its fencing token, and are refused
with :class:`StaleRoundError` once that round is not the job's current ACTIVE round, or
:class:`StaleTokenError` when the token is not the round's: a worker paused past its failure
detection cannot commit into a world it has left. Pending checkpoints are dropped when their
round ends. ``latest`` reads the job's most recent committed checkpoint, linearizably.

``commit_memory_snapshot`` records a complete in-memory snapshot (every rank's state of a
step protected in peers' memory), fenced the same way, so a zombie cannot record one; the
job keeps only the newest, across round ends, and ``latest_memory_snapshot`` reads it, so
every rank of a later round restores from the same one.
"""

from __future__ import annotations

from rallypoint.proto.v1 import rendezvous_pb2

from .caller import Caller
from .jobs import latest_checkpoint, latest_memory_snapshot, services
from .rendezvous_errors import refined
from .rendezvous_values import (
    CheckpointInfo,
    CommitResult,
    MemorySnapshotInfo,
    RoundInfo,
    ShardProgress,
)


class CheckpointRegistry:
    """Checkpoint operations of ``job`` under round ``round_number`` and its token."""

    def __init__(
        self,
        caller: Caller,
        job: str,
        round_number: int,
        fencing_token: int,
        world_size: int,
    ) -> None:
        self.caller = caller
        self.fence = rendezvous_pb2.CheckpointFence(
            job=job, round=round_number, fencing_token=fencing_token
        )
        self.world_size = world_size

    @staticmethod
    def for_round(caller: Caller, info: RoundInfo) -> CheckpointRegistry:
        return CheckpointRegistry(caller, info.job, info.round, info.fencing_token, info.world_size)

    @property
    def job(self) -> str:
        return self.fence.job

    def __repr__(self) -> str:
        return (
            f"CheckpointRegistry({self.fence.job}, round={self.fence.round}, "
            f"token={self.fence.fencing_token})"
        )

    async def begin(
        self,
        step: int,
        *,
        uri: str = "",
        layout: bytes = b"",
        world_size: int | None = None,
        timeout_s: float | None = None,
    ) -> int:
        """Start checkpoint ``step`` (``world_size`` defaults to the round's); its id."""
        size = self.world_size if world_size is None else world_size
        response = await refined(
            self.caller.write(
                lambda s: services(s).checkpoints.Begin,
                lambda header: rendezvous_pb2.CheckpointBeginRequest(
                    header=header,
                    fence=self.fence,
                    step=step,
                    world_size=size,
                    layout=layout,
                    uri=uri,
                ),
                timeout_s,
            )
        )
        return response.checkpoint_id

    async def shard_done(
        self, checkpoint_id: int, rank: int, *, timeout_s: float | None = None
    ) -> ShardProgress:
        """Report ``rank``'s shard written (reporting twice is not an error)."""
        response = await refined(
            self.caller.write(
                lambda s: services(s).checkpoints.ShardDone,
                lambda header: rendezvous_pb2.CheckpointShardDoneRequest(
                    header=header, fence=self.fence, checkpoint_id=checkpoint_id, rank=rank
                ),
                timeout_s,
            )
        )
        return ShardProgress(response.reported, response.world_size)

    async def commit(self, checkpoint_id: int, *, timeout_s: float | None = None) -> CommitResult:
        """Commit once every rank reported (else CheckpointIncompleteError)."""
        response = await refined(
            self.caller.write(
                lambda s: services(s).checkpoints.Commit,
                lambda header: rendezvous_pb2.CheckpointCommitRequest(
                    header=header, fence=self.fence, checkpoint_id=checkpoint_id
                ),
                timeout_s,
            )
        )
        return CommitResult(
            CheckpointInfo.from_proto(response.checkpoint),
            tuple(CheckpointInfo.from_proto(info) for info in response.retired),
        )

    async def abort(self, checkpoint_id: int, *, timeout_s: float | None = None) -> None:
        await refined(
            self.caller.write(
                lambda s: services(s).checkpoints.Abort,
                lambda header: rendezvous_pb2.CheckpointAbortRequest(
                    header=header, fence=self.fence, checkpoint_id=checkpoint_id
                ),
                timeout_s,
            )
        )

    async def latest(
        self, *, serializable: bool = False, timeout_s: float | None = None
    ) -> CheckpointInfo | None:
        """The job's most recent committed checkpoint (any round); None when there is none."""
        return await latest_checkpoint(
            self.caller, self.fence.job, serializable=serializable, timeout_s=timeout_s
        )

    async def commit_memory_snapshot(
        self,
        step: int,
        world_size: int | None = None,
        layout: bytes = b"",
        placement: bytes = b"",
        *,
        planned_end: bool = False,
        timeout_s: float | None = None,
    ) -> MemorySnapshotInfo:
        """Record the in-memory snapshot of ``step`` as complete (every rank's state is
        protected on peers), replacing the job's previous one; what was recorded.
        ``world_size`` defaults to the round's and must equal it (else InvalidArgumentError);
        StaleRoundError or StaleTokenError once this round is over. ``planned_end``: this
        round is the one that ended last, by a planned change (a drain, a scale-up), and
        this is its final snapshot, registered before its ranks form the next round;
        refused (StaleRoundError) if the round ended otherwise or a later round has
        registered one."""
        size = self.world_size if world_size is None else world_size
        response = await refined(
            self.caller.write(
                lambda s: services(s).checkpoints.CommitMemorySnapshot,
                lambda header: rendezvous_pb2.MemorySnapshotCommitRequest(
                    header=header,
                    fence=self.fence,
                    step=step,
                    world_size=size,
                    layout=layout,
                    placement=placement,
                    planned_end=planned_end,
                ),
                timeout_s,
            )
        )
        return MemorySnapshotInfo.from_proto(response.snapshot)

    async def latest_memory_snapshot(
        self, *, serializable: bool = False, timeout_s: float | None = None
    ) -> MemorySnapshotInfo | None:
        """The job's latest complete in-memory snapshot (any round); None when there is
        none."""
        return await latest_memory_snapshot(
            self.caller, self.fence.job, serializable=serializable, timeout_s=timeout_s
        )
