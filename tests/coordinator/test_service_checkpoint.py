"""The CheckpointRegistry service over a real gRPC server and the fake member: begin,
shards, commit, abort, latest, fencing by round and token, and every failure; and the
latest in-memory snapshot (commit, read, fencing, a zombie), raw and through the client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import grpc
import pytest

from rallypoint.client import Client as RallypointClient
from rallypoint.client import (
    InvalidArgumentError,
    LimitExceededError,
    MemorySnapshotInfo,
    StaleRoundError,
    StaleTokenError,
    SyncClient,
)
from rallypoint.coordinator.cli.jobs import job_document
from rallypoint.coordinator.state import Limits
from rallypoint.coordinator.state.jobs import RendezvousLimits
from rallypoint.proto.v1 import rendezvous_pb2 as pb
from rallypoint.proto.v1 import rendezvous_pb2_grpc

from .fake_node import FakeNode, Headers, fails, join_round, open_session, served_at, serving

Code = grpc.StatusCode
LIMITS = Limits(
    rendezvous=RendezvousLimits(max_layout_bytes=8, max_uri_chars=16, max_placement_bytes=12)
)


@dataclass
class Client:
    node: FakeNode
    headers: Headers
    registry: rendezvous_pb2_grpc.CheckpointRegistryStub
    rendezvous: rendezvous_pb2_grpc.RendezvousStub
    fence: pb.CheckpointFence
    members: list[int]

    async def begin(self, step: int = 100, **fields: object) -> pb.CheckpointBeginResponse:
        values: dict[str, object] = {"world_size": 2, "layout": b"dp2", "uri": "s3://c/100"}
        values.update(fields)
        return await self.registry.Begin(
            pb.CheckpointBeginRequest(header=self.headers(), fence=self.fence, step=step, **values)  # type: ignore[arg-type]
        )

    async def shard(self, checkpoint_id: int, rank: int) -> pb.CheckpointShardDoneResponse:
        return await self.registry.ShardDone(
            pb.CheckpointShardDoneRequest(
                header=self.headers(), fence=self.fence, checkpoint_id=checkpoint_id, rank=rank
            )
        )

    async def commit(
        self, checkpoint_id: int, fence: pb.CheckpointFence | None = None
    ) -> pb.CheckpointCommitResponse:
        return await self.registry.Commit(
            pb.CheckpointCommitRequest(
                header=self.headers(), fence=fence or self.fence, checkpoint_id=checkpoint_id
            )
        )

    async def latest(self, job: str = "j") -> pb.CheckpointLatestResponse:
        return await self.registry.Latest(pb.CheckpointLatestRequest(job=job))

    async def commit_memory(
        self, step: int = 7, fence: pb.CheckpointFence | None = None, **fields: object
    ) -> pb.MemorySnapshotCommitResponse:
        values: dict[str, object] = {"world_size": 2, "layout": b"dp2", "placement": b"r0@h1"}
        values.update(fields)
        return await self.registry.CommitMemorySnapshot(
            pb.MemorySnapshotCommitRequest(
                header=self.headers(),
                fence=fence or self.fence,
                step=step,
                **values,  # type: ignore[arg-type]
            )
        )

    async def latest_memory(
        self, job: str = "j", serializable: bool = False
    ) -> pb.MemorySnapshotLatestResponse:
        return await self.registry.LatestMemorySnapshot(
            pb.MemorySnapshotLatestRequest(job=job, serializable=serializable)
        )


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    node = FakeNode(LIMITS)
    async with serving(node) as channel:
        headers = await open_session(node)
        joined = await join_round(channel, headers, "j", 2, keep_checkpoints=1)
        info = joined[-1].round
        yield Client(
            node,
            headers,
            rendezvous_pb2_grpc.CheckpointRegistryStub(channel),
            rendezvous_pb2_grpc.RendezvousStub(channel),
            pb.CheckpointFence(job="j", round=info.round, fencing_token=info.fencing_token),
            [j.participant_id for j in joined],
        )


async def test_begin_shards_commit_then_latest_and_retired(client: Client) -> None:
    assert not (await client.latest()).HasField("checkpoint")
    begun = await client.begin()
    assert begun.checkpoint_id == client.node.index
    first = await client.shard(begun.checkpoint_id, 1)
    twice = await client.shard(begun.checkpoint_id, 1)
    assert (first.reported, first.world_size) == (1, 2) and twice.reported == 1
    await client.shard(begun.checkpoint_id, 0)
    committed = await client.commit(begun.checkpoint_id)
    info = committed.checkpoint
    assert (info.checkpoint_id, info.step, info.round, info.world_size, info.layout, info.uri) == (
        begun.checkpoint_id,
        100,
        1,
        2,
        b"dp2",
        "s3://c/100",
    )
    assert info.committed_ms == client.node.clock_ms and not committed.retired
    barriers = client.node.read_barriers
    assert (await client.latest()).checkpoint == info
    assert client.node.read_barriers == barriers + 1
    # keep_checkpoints = 1: the next commit retires this one.
    second = await client.begin(step=200)
    for rank in (0, 1):
        await client.shard(second.checkpoint_id, rank)
    newer = await client.commit(second.checkpoint_id)
    assert list(newer.retired) == [info]
    served = await client.registry.Latest(pb.CheckpointLatestRequest(job="j", serializable=True))
    assert served.checkpoint.step == 200
    assert client.node.read_barriers == barriers + 1
    job = await client.rendezvous.GetJob(pb.GetJobRequest(job="j"))
    assert job.latest_checkpoint == newer.checkpoint


async def test_incomplete_aborted_and_unknown_checkpoints_are_refused(client: Client) -> None:
    begun = await client.begin()
    await client.shard(begun.checkpoint_id, 1)
    incomplete = await fails(client.commit(begun.checkpoint_id))
    assert (incomplete.code, incomplete.reason) == (
        Code.FAILED_PRECONDITION,
        "CHECKPOINT_INCOMPLETE",
    )
    assert "ranks 0 have not reported" in incomplete.details
    out_of_range = await fails(client.shard(begun.checkpoint_id, 2))
    assert out_of_range.code == Code.INVALID_ARGUMENT
    await client.registry.Abort(
        pb.CheckpointAbortRequest(
            header=client.headers(), fence=client.fence, checkpoint_id=begun.checkpoint_id
        )
    )
    for call in (client.commit(begun.checkpoint_id), client.shard(begun.checkpoint_id, 0)):
        gone = await fails(call)
        assert (gone.code, gone.reason) == (Code.NOT_FOUND, "CHECKPOINT_NOT_FOUND")
    wrong_world = await fails(client.begin(world_size=3))
    assert wrong_world.code == Code.INVALID_ARGUMENT and "not the round's 2" in wrong_world.details
    for fields in ({"layout": b"x" * 9}, {"uri": "u" * 17}):
        too_big = await fails(client.begin(**fields))
        assert (too_big.code, too_big.reason) == (Code.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    missing = await fails(client.latest("nope"))
    assert (missing.code, missing.reason) == (Code.NOT_FOUND, "JOB_NOT_FOUND")


async def test_an_old_round_or_token_cannot_commit(client: Client) -> None:
    begun = await client.begin()
    for rank in (0, 1):
        await client.shard(begun.checkpoint_id, rank)
    wrong_token = pb.CheckpointFence(job="j", round=1, fencing_token=client.fence.fencing_token - 1)
    stale_token = await fails(client.commit(begun.checkpoint_id, wrong_token))
    assert (stale_token.code, stale_token.reason) == (Code.FAILED_PRECONDITION, "STALE_TOKEN")
    # A member leaves: round 1 ends, its pending checkpoint is dropped, and its fence is stale.
    await client.rendezvous.Leave(
        pb.LeaveRequest(header=client.headers(), job="j", participant_id=client.members[1])
    )
    stale_round = await fails(client.commit(begun.checkpoint_id))
    assert (stale_round.code, stale_round.reason) == (Code.FAILED_PRECONDITION, "STALE_ROUND")
    assert "round 1 has ended" in stale_round.details
    assert not (await client.latest()).HasField("checkpoint")


def _bad_requests() -> list[tuple[str, str, object]]:
    h = Headers(1)
    fence = pb.CheckpointFence(job="j", round=1, fencing_token=3)
    return [
        ("Begin", "header", pb.CheckpointBeginRequest(fence=fence, world_size=1)),
        ("Begin", "fence", pb.CheckpointBeginRequest(header=h(), world_size=1)),
        ("Begin", "fence.job", pb.CheckpointBeginRequest(header=h(), fence=pb.CheckpointFence(job="", round=1, fencing_token=3), world_size=1)),  # noqa: E501
        ("Begin", "fence.round", pb.CheckpointBeginRequest(header=h(), fence=pb.CheckpointFence(job="j", fencing_token=3), world_size=1)),  # noqa: E501
        ("Begin", "fence.fencing_token", pb.CheckpointBeginRequest(header=h(), fence=pb.CheckpointFence(job="j", round=1), world_size=1)),  # noqa: E501
        ("Begin", "step", pb.CheckpointBeginRequest(header=h(), fence=fence, step=-1, world_size=1)),  # noqa: E501
        ("Begin", "world_size", pb.CheckpointBeginRequest(header=h(), fence=fence)),
        ("ShardDone", "checkpoint_id", pb.CheckpointShardDoneRequest(header=h(), fence=fence)),
        ("ShardDone", "rank", pb.CheckpointShardDoneRequest(header=h(), fence=fence, checkpoint_id=4, rank=-1)),  # noqa: E501
        ("Commit", "checkpoint_id", pb.CheckpointCommitRequest(header=h(), fence=fence)),
        ("Commit", "fence", pb.CheckpointCommitRequest(header=h(), checkpoint_id=4)),
        ("Abort", "checkpoint_id", pb.CheckpointAbortRequest(header=h(), fence=fence)),
        ("Latest", "job", pb.CheckpointLatestRequest(job="a/b")),
        ("CommitMemorySnapshot", "header", pb.MemorySnapshotCommitRequest(fence=fence, world_size=1)),  # noqa: E501
        ("CommitMemorySnapshot", "fence", pb.MemorySnapshotCommitRequest(header=h(), world_size=1)),
        ("CommitMemorySnapshot", "fence.fencing_token", pb.MemorySnapshotCommitRequest(header=h(), fence=pb.CheckpointFence(job="j", round=1), world_size=1)),  # noqa: E501
        ("CommitMemorySnapshot", "step", pb.MemorySnapshotCommitRequest(header=h(), fence=fence, step=-1, world_size=1)),  # noqa: E501
        ("CommitMemorySnapshot", "world_size", pb.MemorySnapshotCommitRequest(header=h(), fence=fence)),  # noqa: E501
        ("LatestMemorySnapshot", "job", pb.MemorySnapshotLatestRequest(job="a/b")),
    ]  # fmt: skip


@pytest.mark.parametrize(("method", "field", "request_"), _bad_requests())
async def test_malformed_requests_are_refused_naming_the_field(
    client: Client, method: str, field: str, request_: object
) -> None:
    proposals = len(client.node.proposals)
    failure = await fails(getattr(client.registry, method)(request_))
    assert (failure.code, failure.reason) == (Code.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert failure.details.startswith(f"{field}: "), failure.details
    assert len(client.node.proposals) == proposals


# ---------------------------------------------------------------------- memory snapshots


async def test_a_memory_snapshot_is_committed_read_and_replaced(client: Client) -> None:
    assert not (await client.latest_memory()).HasField("snapshot")
    client.node.clock_ms += 250
    committed = (await client.commit_memory(step=7)).snapshot
    assert committed.snapshot_id == client.node.index
    assert (committed.step, committed.round, committed.world_size) == (7, 1, 2)
    assert (committed.layout, committed.placement) == (b"dp2", b"r0@h1")
    assert committed.committed_ms == client.node.clock_ms
    barriers = client.node.read_barriers
    assert (await client.latest_memory()).snapshot == committed
    assert client.node.read_barriers == barriers + 1
    newer = (await client.commit_memory(step=8, placement=b"r0@h2")).snapshot
    assert newer.snapshot_id > committed.snapshot_id
    served = await client.latest_memory(serializable=True)
    assert served.snapshot == newer and client.node.read_barriers == barriers + 1
    job = await client.rendezvous.GetJob(pb.GetJobRequest(job="j"))
    assert job.latest_memory_snapshot == newer
    assert not job.HasField("latest_checkpoint")  # a memory snapshot is no disk checkpoint


async def test_a_memory_snapshot_retried_under_one_header_is_recorded_once(
    client: Client,
) -> None:
    header = client.headers()
    request = pb.MemorySnapshotCommitRequest(
        header=header, fence=client.fence, step=3, world_size=2, layout=b"", placement=b""
    )
    first = await client.registry.CommitMemorySnapshot(request)
    proposals = len(client.node.proposals)
    again = await client.registry.CommitMemorySnapshot(request)
    assert again.snapshot == first.snapshot
    assert client.node.state.rendezvous.jobs["j"].checkpoints.latest_memory_snapshot() is not None
    assert len(client.node.proposals) == proposals + 1  # proposed, answered from the cache
    assert (await client.latest_memory()).snapshot.snapshot_id == first.snapshot.snapshot_id


async def test_memory_snapshot_refusals(client: Client) -> None:
    wrong_world = await fails(client.commit_memory(world_size=3))
    assert wrong_world.code == Code.INVALID_ARGUMENT and "not the round's 2" in wrong_world.details
    for fields in ({"layout": b"x" * 9}, {"placement": b"p" * 13}):
        too_big = await fails(client.commit_memory(**fields))
        assert (too_big.code, too_big.reason) == (Code.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    wrong_token = pb.CheckpointFence(job="j", round=1, fencing_token=client.fence.fencing_token - 1)
    stale_token = await fails(client.commit_memory(fence=wrong_token))
    assert (stale_token.code, stale_token.reason) == (Code.FAILED_PRECONDITION, "STALE_TOKEN")
    missing = await fails(client.latest_memory("nope"))
    assert (missing.code, missing.reason) == (Code.NOT_FOUND, "JOB_NOT_FOUND")
    unknown = await fails(
        client.commit_memory(fence=pb.CheckpointFence(job="nope", round=1, fencing_token=3))
    )
    assert (unknown.code, unknown.reason) == (Code.NOT_FOUND, "JOB_NOT_FOUND")
    assert not (await client.latest_memory()).HasField("snapshot")


async def test_a_zombie_cannot_record_a_memory_snapshot_after_its_round_ended(
    client: Client,
) -> None:
    kept = (await client.commit_memory(step=10)).snapshot
    # A member leaves: round 1 ends. Its snapshot stays: the next round restores from it.
    await client.rendezvous.Leave(
        pb.LeaveRequest(header=client.headers(), job="j", participant_id=client.members[1])
    )
    zombie = await fails(client.commit_memory(step=11))
    assert (zombie.code, zombie.reason) == (Code.FAILED_PRECONDITION, "STALE_ROUND")
    assert "round 1 has ended" in zombie.details
    assert (await client.latest_memory()).snapshot == kept


# ---------------------------------------------------------------------- through the client


async def test_the_client_commits_and_reads_memory_snapshots_fenced_by_its_round() -> None:
    node = FakeNode(LIMITS)
    async with (
        served_at(node) as address,
        RallypointClient([address]) as client,
        serving(node) as channel,
    ):
        headers = await open_session(node)
        joined = await join_round(channel, headers, "j", 2)
        status = await client.get_job("j")
        registry = client.checkpoint_registry(status.round)
        assert await registry.latest_memory_snapshot() is None
        assert status.latest_memory_snapshot is None
        info = await registry.commit_memory_snapshot(5, layout=b"dp2", placement=b"r1@h0")
        assert isinstance(info, MemorySnapshotInfo)
        assert (info.step, info.round, info.world_size) == (5, status.round.round, 2)
        assert (info.layout, info.placement) == (b"dp2", b"r1@h0")
        assert info.snapshot_id == node.index and info.committed_ms == node.clock_ms
        assert await registry.latest_memory_snapshot() == info
        assert await client.latest_memory_snapshot("j", serializable=True) == info
        status_now = await client.get_job("j")
        assert status_now.latest_memory_snapshot == info
        # `rallypoint rounds JOB --json` (and the dashboard) show it beside the checkpoint.
        assert job_document(status_now)["latest_memory_snapshot"] == {
            "snapshot_id": info.snapshot_id,
            "step": 5,
            "round": status.round.round,
            "world_size": 2,
            "committed_ms": info.committed_ms,
        }
        assert job_document(status)["latest_memory_snapshot"] is None
        with pytest.raises(InvalidArgumentError, match="not the round's 2"):
            await registry.commit_memory_snapshot(6, 3)
        with pytest.raises(LimitExceededError):
            await registry.commit_memory_snapshot(6, placement=b"p" * 13)
        old_token = replace(status.round, fencing_token=status.round.fencing_token - 1)
        stale = client.checkpoint_registry(old_token)
        with pytest.raises(StaleTokenError):
            await stale.commit_memory_snapshot(6)
        # The round ends under the registry: a zombie's commit is refused.
        await rendezvous_pb2_grpc.RendezvousStub(channel).Leave(
            pb.LeaveRequest(header=headers(), job="j", participant_id=joined[0].participant_id)
        )
        with pytest.raises(StaleRoundError, match="has ended"):
            await registry.commit_memory_snapshot(6)
        assert await registry.latest_memory_snapshot() == info


async def test_the_sync_client_has_the_memory_snapshot_calls() -> None:
    node = FakeNode(LIMITS)
    async with served_at(node) as address, serving(node) as channel:
        headers = await open_session(node)
        await join_round(channel, headers, "j", 2)

        def from_a_thread() -> tuple[MemorySnapshotInfo, object, object]:
            with SyncClient([address]) as client:
                registry = client.checkpoint_registry(client.get_job("j").round)
                committed = registry.commit_memory_snapshot(9, 2, b"L", b"P")
                return (
                    committed,
                    registry.latest_memory_snapshot(),
                    client.latest_memory_snapshot("j"),
                )

        committed, latest, via_client = await asyncio.to_thread(from_a_thread)
    assert committed.step == 9 and (committed.layout, committed.placement) == (b"L", b"P")
    assert latest == committed and via_client == committed
