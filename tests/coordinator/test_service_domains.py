"""Failure domains through the Rendezvous servicer on an in-process member (FakeNode):
domains go in with Join and JoinBatch and come out in ListMembers and GetJob; the shape of a
JobConfig goes both ways; Drain, Undrain and ListDrained answer from the replicated state;
bad input is INVALID_ARGUMENT naming the field, before anything is proposed. (Roles and
the real cluster: tests/integration/test_domains.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from rallypoint.proto.v1 import rendezvous_pb2 as pb
from rallypoint.proto.v1 import rendezvous_pb2_grpc

from .fake_node import FakeNode, Headers, fails, job_config, open_session, serving, until

Code = grpc.StatusCode


@pytest.fixture
async def service() -> AsyncIterator[tuple[FakeNode, Headers, rendezvous_pb2_grpc.RendezvousStub]]:
    node = FakeNode()
    async with serving(node) as channel:
        yield node, await open_session(node), rendezvous_pb2_grpc.RendezvousStub(channel)


async def test_domains_go_in_with_joins_and_come_out_in_members_and_status(
    service: tuple[FakeNode, Headers, rendezvous_pb2_grpc.RendezvousStub],
) -> None:
    _, headers, stub = service
    shaped = job_config(2, 4, unit_size=2, domain_size=2, units_within_domains=True)
    await stub.Join(
        pb.JoinRequest(header=headers(), job="j", name="a0", config=shaped, domain="h1")
    )
    await stub.JoinBatch(
        pb.JoinBatchRequest(
            header=headers(), job="j", names=["a1", "b0"], domains=["h1", "h2"], config=shaped
        )
    )
    # Members or waiting, as the shape places them: every one says its domain.
    pages = [
        await stub.ListMembers(pb.ListMembersRequest(job="j", waiting=waiting))
        for waiting in (False, True)
    ]
    listed = {m.name: m.domain for page in pages for m in page.members}
    assert listed == {"a0": "h1", "a1": "h1", "b0": "h2"}
    status = await stub.GetJob(pb.GetJobRequest(job="j"))
    assert (status.config.unit_size, status.config.domain_size) == (2, 2)
    assert status.config.units_within_domains
    everyone = list(status.round.members) + list(status.round.waiting)
    assert {m.name: m.domain for m in everyone} == listed


async def test_drain_undrain_and_list_drained(
    service: tuple[FakeNode, Headers, rendezvous_pb2_grpc.RendezvousStub],
) -> None:
    _, headers, stub = service
    drained = await stub.Drain(pb.DrainRequest(header=headers(), domain="h9", reason="ECC"))
    assert drained.changed and list(drained.ended) == []
    again = await stub.Drain(pb.DrainRequest(header=headers(), domain="h9"))
    assert not again.changed
    listed = await stub.ListDrained(pb.ListDrainedRequest())
    assert [(d.domain, d.reason) for d in listed.domains] == [("h9", "ECC")]
    assert (await stub.Undrain(pb.UndrainRequest(header=headers(), domain="h9"))).changed
    assert not (await stub.Undrain(pb.UndrainRequest(header=headers(), domain="h9"))).changed
    assert list((await stub.ListDrained(pb.ListDrainedRequest())).domains) == []


async def test_bad_domains_and_shapes_are_invalid_arguments_naming_the_field(
    service: tuple[FakeNode, Headers, rendezvous_pb2_grpc.RendezvousStub],
) -> None:
    node, headers, stub = service
    applied = node.state.applied_index
    cases = [
        (
            stub.Drain(pb.DrainRequest(header=headers(), domain="")),
            "domain: must name a failure domain",
        ),
        (
            stub.Drain(pb.DrainRequest(header=headers(), domain="h" * 257)),
            "domain: must be at most 256 characters, got 257",
        ),
        (
            stub.Drain(pb.DrainRequest(header=headers(), domain="h", reason="r" * 1025)),
            "reason: at most 1024 characters",
        ),
        (stub.Undrain(pb.UndrainRequest(header=headers(), domain="")), "domain: must name"),
        (
            stub.Join(
                pb.JoinRequest(
                    header=headers(), job="j", name="n", config=job_config(1, 1), domain="x" * 300
                )
            ),
            "domain: must be at most 256 characters, got 300",
        ),
        (
            stub.JoinBatch(
                pb.JoinBatchRequest(header=headers(), job="j", names=["a", "b"], domains=["h"])
            ),
            "domains: must be empty or one per name: 1 for 2 names",
        ),
        (
            stub.JoinBatch(
                pb.JoinBatchRequest(header=headers(), job="j", names=["a"], domains=["h" * 257])
            ),
            "domains[0]: must be at most 256 characters",
        ),
        (
            stub.Configure(
                pb.ConfigureRequest(header=headers(), job="j", config=job_config(6, 8, unit_size=4))
            ),
            "config.unit_size: unit_size 4 does not divide min_nodes 6",
        ),
        (
            stub.Configure(
                pb.ConfigureRequest(
                    header=headers(), job="j", config=job_config(4, 10, unit_size=4)
                )
            ),
            "config.unit_size: unit_size 4 does not divide max_nodes 10",
        ),
        (
            stub.Configure(
                pb.ConfigureRequest(
                    header=headers(), job="j", config=job_config(4, 8, unit_size=-4)
                )
            ),
            "config.unit_size: must be >= 0",
        ),
        (
            stub.Configure(
                pb.ConfigureRequest(
                    header=headers(),
                    job="j",
                    config=job_config(4, 8, unit_size=4, domain_size=6, units_within_domains=True),
                )
            ),
            "config.domain_size: a domain of 6 holds 1 unit of 4 and strands 2 ranks",
        ),
    ]
    for call, said in cases:
        refused = await fails(call)
        assert refused.code is Code.INVALID_ARGUMENT, (said, refused)
        assert said in refused.details and "\n" not in refused.details, refused.details
    assert node.state.applied_index == applied  # nothing was proposed


async def test_a_watch_hears_a_drain_that_changes_only_the_spares(
    service: tuple[FakeNode, Headers, rendezvous_pb2_grpc.RendezvousStub],
) -> None:
    """Draining the domain of a job's only waiter ends no round and changes nothing else of
    the job, but its spares: the watch still says so, and again when it is undrained."""
    node, headers, stub = service
    solo = job_config(1, 1)
    await stub.Join(pb.JoinRequest(header=headers(), job="j", name="a0", config=solo, domain="h1"))
    await stub.Join(pb.JoinRequest(header=headers(), job="j", name="b0", config=solo, domain="h2"))
    call = stub.WatchJob(pb.WatchJobRequest(job="j"))
    first = await call.read()
    assert isinstance(first, pb.WatchJobResponse)
    assert [m.name for m in first.round.waiting] == ["b0"] and first.round.spares == 1
    await until(lambda: node.apply_waits > 0)
    await stub.Drain(pb.DrainRequest(header=headers(), domain="h2"))
    drained = await asyncio.wait_for(call.read(), 10)
    assert isinstance(drained, pb.WatchJobResponse)
    assert drained.round.spares == 0 and drained.round.job_revision == first.round.job_revision
    await stub.Undrain(pb.UndrainRequest(header=headers(), domain="h2"))
    undrained = await asyncio.wait_for(call.read(), 10)
    assert isinstance(undrained, pb.WatchJobResponse) and undrained.round.spares == 1
    call.cancel()
