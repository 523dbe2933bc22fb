"""JoinBatch and ListMembers over a real gRPC server and the fake member, and the heartbeat
of a participant whose id a batch handed out above the applied index."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from rallypoint.client import Client as RallypointClient
from rallypoint.client import (
    InvalidArgumentError,
    InvalidValueError,
    JobConfig,
    JobNotFoundError,
    JoinBatchResult,
    MembersPage,
    NameTakenError,
    RoundState,
    SyncClient,
)
from rallypoint.coordinator.state import Limits
from rallypoint.coordinator.state.jobs import RendezvousLimits
from rallypoint.proto.v1 import rendezvous_pb2 as pb
from rallypoint.proto.v1 import rendezvous_pb2_grpc

from .fake_node import FakeNode, Headers, fails, job_config, open_session, served_at, serving

Code = grpc.StatusCode
LIMITS = Limits(
    rendezvous=RendezvousLimits(
        max_waiting=2,
        max_name_chars=8,
        max_metadata_bytes=8,
        max_batch_joins=6,
        max_batch_bytes=24,
    )
)


@dataclass
class Client:
    node: FakeNode
    headers: Headers
    stub: rendezvous_pb2_grpc.RendezvousStub

    async def batch(
        self,
        names: list[str],
        metadata: list[bytes] | None = None,
        config: pb.JobConfig | None = None,
        headers: Headers | None = None,
    ) -> pb.JoinBatchResponse:
        request = pb.JoinBatchRequest(
            header=(headers or self.headers)(),
            job="j",
            names=names,
            metadata=metadata or [],
            config=config or job_config(3, 4),
        )
        return await self.stub.JoinBatch(request)


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    node = FakeNode(LIMITS)
    async with serving(node) as channel:
        headers = await open_session(node)
        yield Client(node, headers, rendezvous_pb2_grpc.RendezvousStub(channel))


async def test_a_batch_joins_in_order_and_answers_ids_waiting_and_the_round(
    client: Client,
) -> None:
    first = await client.batch(["a", "b"], [b"ma", b"mb"])
    index = client.node.index
    assert list(first.participant_ids) == [index, index + 1]
    assert list(first.waiting) == [False, False]
    assert (first.round, first.state) == (1, pb.ROUND_STATE_JOINING)
    full = await client.batch(["c", "d", "e"])
    ids = list(full.participant_ids)
    assert ids[0] > first.participant_ids[-1] and ids == sorted(ids)
    assert list(full.waiting) == [False, False, True]
    assert (full.round, full.state) == (1, pb.ROUND_STATE_ACTIVE)
    job = client.node.state.rendezvous.jobs["j"]
    assert job.participants[first.participant_ids[1]].metadata == b"mb"
    assert {p.session_id for p in job.participants.values()} == {client.headers.session_id}


async def test_one_refused_entry_refuses_the_batch_with_joins_status(client: Client) -> None:
    await client.batch(["a"])
    other = await open_session(client.node)
    taken = await fails(client.batch(["x", "a"], headers=other))
    assert (taken.code, taken.reason) == (Code.ALREADY_EXISTS, "NAME_TAKEN")
    conflict = await fails(client.batch(["x"], config=job_config(2, 4)))
    assert (conflict.code, conflict.reason) == (Code.FAILED_PRECONDITION, "CONFIG_CONFLICT")
    full = await fails(client.batch(["p", "q", "r", "s", "t", "u"]))
    assert (full.code, full.reason) == (Code.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    assert sorted(p.name for p in client.node.state.rendezvous.jobs["j"].participants.values()) == [
        "a"
    ]


def _bad_batches() -> list[tuple[str, pb.JoinBatchRequest]]:
    def h() -> pb.RequestHeader:
        return Headers(1)()

    def req(names: list[str], **fields: object) -> pb.JoinBatchRequest:
        return pb.JoinBatchRequest(header=h(), job="j", names=names, **fields)  # type: ignore[arg-type]

    return [
        ("names: must hold 1..6 names, got 0", req([])),
        ("names: must hold 1..6 names, got 7", req([f"w{n}" for n in range(7)])),
        ("names[2]: must be 1..8 characters, got 0", req(["a", "b", ""])),
        ("names[1]: must be 1..8 characters, got 9", req(["a", "n" * 9])),
        ("names[2]: 'a' repeats names[0]", req(["a", "b", "a"])),
        (
            "metadata: must be empty or one per name: 1 for 2 names",
            req(["a", "b"], metadata=[b""]),
        ),
        ("job: ", pb.JoinBatchRequest(header=h(), job="a b", names=["a"])),
        ("header: ", pb.JoinBatchRequest(job="j", names=["a"])),
    ]


@pytest.mark.parametrize(
    ("message", "request_"), _bad_batches(), ids=[m for m, _ in _bad_batches()]
)
async def test_malformed_batches_are_refused_naming_the_entry(
    client: Client, message: str, request_: pb.JoinBatchRequest
) -> None:
    failure = await fails(client.stub.JoinBatch(request_))
    assert (failure.code, failure.reason) == (Code.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert failure.details.startswith(message), failure.details
    assert client.node.proposals == []


async def test_oversized_metadata_is_a_limit_naming_the_entry(client: Client) -> None:
    failure = await fails(client.batch(["a", "b"], [b"", b"m" * 9]))
    assert (failure.code, failure.reason) == (Code.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    assert "metadata[1]" in failure.details
    assert client.node.proposals == []
    heavy = await fails(client.batch(["a", "b", "c"], [b"m" * 8] * 3))  # 27 > 24 bytes
    assert (heavy.code, heavy.reason) == (Code.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    assert "bytes of names and metadata in one batch (limit 24)" in heavy.details
    assert client.node.proposals == []


async def test_list_members_pages_in_id_order_and_lists_the_wait_list(client: Client) -> None:
    ids = list(
        (await client.batch(["a", "b", "c", "d", "e"], config=job_config(4, 4))).participant_ids
    )
    barriers = client.node.read_barriers
    page = await client.stub.ListMembers(pb.ListMembersRequest(job="j", limit=3))
    assert client.node.read_barriers == barriers + 1
    assert (page.round, page.state, page.more) == (1, pb.ROUND_STATE_ACTIVE, True)
    assert [(m.participant_id, m.name, m.rank) for m in page.members] == [
        (ids[0], "a", 0),
        (ids[1], "b", 1),
        (ids[2], "c", 2),
    ]
    assert all(m.phi == 0 and m.heartbeat_age_ms == 0 for m in page.members)
    rest = await client.stub.ListMembers(
        pb.ListMembersRequest(job="j", after=page.members[-1].participant_id, serializable=True)
    )
    assert client.node.read_barriers == barriers + 1
    assert [m.participant_id for m in rest.members] == [ids[3]] and not rest.more
    waiting = await client.stub.ListMembers(pb.ListMembersRequest(job="j", waiting=True))
    assert [(m.participant_id, m.name, m.rank) for m in waiting.members] == [(ids[4], "e", -1)]
    assert not waiting.more
    past = await client.stub.ListMembers(pb.ListMembersRequest(job="j", after=ids[-1]))
    assert list(past.members) == [] and not past.more


async def test_list_members_refusals(client: Client) -> None:
    missing = await fails(client.stub.ListMembers(pb.ListMembersRequest(job="nope")))
    assert (missing.code, missing.reason) == (Code.NOT_FOUND, "JOB_NOT_FOUND")
    for limit in (-1, 10_001):
        bad = await fails(client.stub.ListMembers(pb.ListMembersRequest(job="j", limit=limit)))
        assert (bad.code, bad.details) == (
            Code.INVALID_ARGUMENT,
            f"limit: must be 0..10000, got {limit}",
        )


async def test_a_heartbeat_for_an_id_above_the_applied_index_is_not_held_back(
    client: Client,
) -> None:
    """A batch hands out ids above its own raft index; a quiet cluster may never apply that
    far, so the heartbeat must not wait for it (it used to, for two seconds per request)."""
    ids = list((await client.batch(["a", "b", "c"])).participant_ids)
    assert ids[-1] > client.node.state.applied_index
    waits = client.node.apply_waits
    call = client.stub.Heartbeat()
    await call.write(pb.HeartbeatRequest(job="j", participant_id=ids[-1], round=0))
    answer = await call.read()  # the first heartbeat of a stream is answered
    assert isinstance(answer, pb.HeartbeatResponse) and answer.current_round == 1
    assert client.node.apply_waits == waits
    assert client.node.heartbeats == [("j", ids[-1])]
    call.cancel()


# ---------------------------------------------------------------------- through the client


async def test_the_client_joins_a_batch_and_pages_through_the_members() -> None:
    node = FakeNode(LIMITS)
    config = JobConfig(min_nodes=4, max_nodes=4, last_call_ms=0)
    async with served_at(node) as address, RallypointClient([address]) as client:
        result = await client.join_batch("j", ["a", "b", "c", "d", "e"], config=config)
        assert isinstance(result, JoinBatchResult)
        ids = result.participant_ids
        assert list(ids) == sorted(ids) and len(set(ids)) == 5
        assert result.waiting == (False, False, False, False, True)
        assert (result.round, result.state) == (1, RoundState.ACTIVE)
        job = node.state.rendezvous.jobs["j"]
        assert {p.session_id for p in job.participants.values()} == {client.session_id}
        page = await client.list_members("j", limit=3)
        assert isinstance(page, MembersPage) and page.more
        assert [(m.participant_id, m.name, m.rank) for m in page.members] == [
            (ids[0], "a", 0),
            (ids[1], "b", 1),
            (ids[2], "c", 2),
        ]
        rest = await client.list_members("j", after=ids[2])
        assert [m.name for m in rest.members] == ["d"] and not rest.more
        everyone = [m.name async for m in client.all_members("j", page_size=1)]
        assert everyone == ["a", "b", "c", "d"]
        waiting = [m.participant_id async for m in client.all_members("j", waiting=True)]
        assert waiting == [ids[4]]
        again = await client.join_batch("j", ["x", "a"], metadata=[b"mx", b""])
        assert again.participant_ids[1] == ids[0] and again.waiting == (True, False)
        with pytest.raises(NameTakenError, match="'a'"):
            async with RallypointClient([address]) as other:
                await other.join_batch("j", ["y", "a"])
        assert "y" not in job.names
        with pytest.raises(InvalidValueError, match="one entry per name: 1 for 2 names"):
            await client.join_batch("j", ["p", "q"], metadata=[b""])
        with pytest.raises(InvalidArgumentError, match=r"names\[1\]"):
            await client.join_batch("j", ["p", "p"])
        with pytest.raises(JobNotFoundError):
            await client.list_members("nope")


async def test_the_sync_client_has_the_same_calls() -> None:
    node = FakeNode(LIMITS)
    config = JobConfig(min_nodes=2, max_nodes=2, last_call_ms=0)
    async with served_at(node) as address:

        def from_a_thread() -> tuple[JoinBatchResult, MembersPage, list[str]]:
            with SyncClient([address]) as client:
                joined = client.join_batch("j", ["a", "b"], config=config)
                page = client.list_members("j", limit=1)
                names = [m.name for m in client.all_members("j", page_size=1)]
                return joined, page, names

        joined, page, names = await asyncio.to_thread(from_a_thread)
    assert joined.state is RoundState.ACTIVE and len(joined.participant_ids) == 2
    assert [m.name for m in page.members] == ["a"] and page.more
    assert names == ["a", "b"]
