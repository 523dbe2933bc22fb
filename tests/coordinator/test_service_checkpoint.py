"""The CheckpointRegistry service over a real gRPC server and the fake member: begin,
shards, commit, abort, latest, fencing by round and token, and every failure."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from rallypoint.coordinator.state import Limits
from rallypoint.coordinator.state.jobs import RendezvousLimits
from rallypoint.proto.v1 import rendezvous_pb2 as pb
from rallypoint.proto.v1 import rendezvous_pb2_grpc

from .fake_node import FakeNode, Headers, fails, join_round, open_session, serving

Code = grpc.StatusCode
LIMITS = Limits(rendezvous=RendezvousLimits(max_layout_bytes=8, max_uri_chars=16))


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
