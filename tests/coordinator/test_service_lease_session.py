"""The Lease and Session services over a real gRPC server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import pytest

from rallypoint.coordinator.state.commands import LeaseGrant, SessionKeepAlive, SessionOpen
from rallypoint.proto.v1 import (
    common_pb2,
    kv_pb2,
    kv_pb2_grpc,
    lease_pb2,
    lease_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)

from .fake_node import FakeNode, fails, rpc_failure, serving

Code = grpc.StatusCode


@dataclass
class Client:
    node: FakeNode
    channel: grpc.aio.Channel
    session_id: int = 0
    sequence: int = 0
    lease: lease_pb2_grpc.LeaseStub = field(init=False)
    session: session_pb2_grpc.SessionStub = field(init=False)

    def __post_init__(self) -> None:
        self.lease = lease_pb2_grpc.LeaseStub(self.channel)
        self.session = session_pb2_grpc.SessionStub(self.channel)

    def header(self) -> common_pb2.RequestHeader:
        self.sequence += 1
        return common_pb2.RequestHeader(session_id=self.session_id, sequence=self.sequence)

    async def grant(self, ttl_ms: int) -> lease_pb2.LeaseGrantResponse:
        request = lease_pb2.LeaseGrantRequest(header=self.header(), ttl_ms=ttl_ms)
        return await self.lease.Grant(request)


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    node = FakeNode()
    async with serving(node) as channel:
        client = Client(node, channel)
        opened = await client.session.Open(session_pb2.SessionOpenRequest(ttl_ms=60_000))
        client.session_id = opened.session_id
        yield client


async def test_session_open_keep_alive_close(client: Client) -> None:
    opened = await client.session.Open(session_pb2.SessionOpenRequest(ttl_ms=5_000))
    assert opened.session_id == client.node.index and opened.ttl_ms == 5_000
    assert client.node.proposals[-1][:4] == (SessionOpen(5_000), 0, 0, 0)

    kept = await client.session.KeepAlive(
        session_pb2.SessionKeepAliveRequest(session_id=opened.session_id, first_unacked=3)
    )
    assert kept.ttl_ms == 5_000
    assert client.node.proposals[-1][:4] == (SessionKeepAlive(), opened.session_id, 0, 3)

    close = session_pb2.SessionCloseRequest(session_id=opened.session_id)
    closed = await client.session.Close(close)
    assert closed.header.member_id == client.node.member_id
    assert client.node.state.session_info(opened.session_id) is None

    again = await fails(client.session.Close(close))
    assert (again.code, again.reason) == (Code.NOT_FOUND, "SESSION_EXPIRED")
    gone = await fails(
        client.session.KeepAlive(session_pb2.SessionKeepAliveRequest(session_id=opened.session_id))
    )
    assert (gone.code, gone.reason) == (Code.NOT_FOUND, "SESSION_EXPIRED")


async def test_session_validation(client: Client) -> None:
    cases = [
        (client.session.Open(session_pb2.SessionOpenRequest()), "ttl_ms: must be > 0, got 0"),
        (
            client.session.Open(session_pb2.SessionOpenRequest(ttl_ms=-1)),
            "ttl_ms: must be > 0, got -1",
        ),
        (
            client.session.KeepAlive(session_pb2.SessionKeepAliveRequest()),
            "session_id: must be non-zero (from Session.Open)",
        ),
        (
            client.session.Close(session_pb2.SessionCloseRequest()),
            "session_id: must be non-zero (from Session.Open)",
        ),
    ]
    proposed = len(client.node.proposals)
    for call, message in cases:
        failure = await fails(call)
        assert (failure.code, failure.details, failure.reason) == (
            Code.INVALID_ARGUMENT,
            message,
            "INVALID_REQUEST",
        )
    assert len(client.node.proposals) == proposed


async def test_grant_list_time_to_live_revoke(client: Client) -> None:
    grant = await client.grant(2_000)
    assert grant.lease_id == grant.fencing_token == client.node.index and grant.ttl_ms == 2_000
    assert client.node.proposals[-1][0] == LeaseGrant(2_000)
    later = await client.grant(9_000)
    assert later.fencing_token > grant.fencing_token

    kv = kv_pb2_grpc.KVStub(client.channel)
    for key in (b"b", b"a"):
        await kv.Put(kv_pb2.PutRequest(header=client.header(), key=key, lease_id=grant.lease_id))

    listed = await client.lease.List(lease_pb2.LeaseListRequest())
    assert [(s.lease_id, s.fencing_token, s.granted_ttl_ms) for s in listed.leases] == [
        (grant.lease_id, grant.fencing_token, 2_000),
        (later.lease_id, later.fencing_token, 9_000),
    ]
    barriers = client.node.read_barriers
    await client.lease.List(lease_pb2.LeaseListRequest(serializable=True))
    assert client.node.read_barriers == barriers

    client.node.clock_ms += 500
    ttl = await client.lease.TimeToLive(
        lease_pb2.LeaseTimeToLiveRequest(lease_id=grant.lease_id, keys=True)
    )
    assert (ttl.granted_ttl_ms, ttl.remaining_ttl_ms, list(ttl.keys)) == (
        2_000,
        1_500,
        [b"a", b"b"],
    )
    assert ttl.fencing_token == grant.fencing_token
    without_keys = await client.lease.TimeToLive(
        lease_pb2.LeaseTimeToLiveRequest(lease_id=grant.lease_id)
    )
    assert not without_keys.keys

    revoked = await client.lease.Revoke(
        lease_pb2.LeaseRevokeRequest(header=client.header(), lease_id=grant.lease_id)
    )
    assert list(revoked.deleted_keys) == [b"a", b"b"]
    missing = await fails(
        client.lease.TimeToLive(lease_pb2.LeaseTimeToLiveRequest(lease_id=grant.lease_id))
    )
    assert (missing.code, missing.reason) == (Code.NOT_FOUND, "LEASE_NOT_FOUND")
    twice = await fails(
        client.lease.Revoke(
            lease_pb2.LeaseRevokeRequest(header=client.header(), lease_id=grant.lease_id)
        )
    )
    assert (twice.code, twice.reason) == (Code.NOT_FOUND, "LEASE_NOT_FOUND")


async def test_lease_validation(client: Client) -> None:
    cases = [
        (client.lease.Grant(lease_pb2.LeaseGrantRequest(ttl_ms=10)), "header: required"),
        (
            client.lease.Grant(lease_pb2.LeaseGrantRequest(header=client.header(), ttl_ms=0)),
            "ttl_ms: must be > 0, got 0",
        ),
        (
            client.lease.Revoke(lease_pb2.LeaseRevokeRequest(header=client.header())),
            "lease_id: must be a lease id (> 0), got 0",
        ),
        (
            client.lease.TimeToLive(lease_pb2.LeaseTimeToLiveRequest(lease_id=-3)),
            "lease_id: must be a lease id (> 0), got -3",
        ),
    ]
    proposed = len(client.node.proposals)
    for call, message in cases:
        failure = await fails(call)
        assert (failure.code, failure.reason) == (Code.INVALID_ARGUMENT, "INVALID_REQUEST")
        assert failure.details.startswith(message), failure.details
    assert len(client.node.proposals) == proposed


async def test_keep_alive_stream_answers_each_request(client: Client) -> None:
    grant = await client.grant(3_000)
    call = client.lease.KeepAlive()
    client.node.clock_ms += 2_000
    await call.write(lease_pb2.LeaseKeepAliveRequest(lease_id=grant.lease_id))
    alive = await call.read()
    assert (alive.lease_id, alive.ttl_ms) == (grant.lease_id, 3_000)
    assert client.node.lease_remaining_ms(grant.lease_id) == 3_000

    await call.write(lease_pb2.LeaseKeepAliveRequest(lease_id=12345))
    unknown = await call.read()
    assert (unknown.lease_id, unknown.ttl_ms) == (12345, 0)

    await call.write(lease_pb2.LeaseKeepAliveRequest(lease_id=grant.lease_id))
    assert (await call.read()).ttl_ms == 3_000
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF
    assert await call.code() == Code.OK


async def test_keep_alive_stream_ends_on_an_invalid_id_and_on_a_follower(client: Client) -> None:
    call = client.lease.KeepAlive()
    await call.write(lease_pb2.LeaseKeepAliveRequest(lease_id=0))
    with pytest.raises(grpc.aio.AioRpcError) as invalid:
        await call.read()
    failure = rpc_failure(invalid.value)
    assert (failure.code, failure.details) == (
        Code.INVALID_ARGUMENT,
        "lease_id: must be a lease id (> 0), got 0",
    )

    grant = await client.grant(3_000)
    client.node.not_leader(2, "10.0.0.2:2379")
    call = client.lease.KeepAlive()
    await call.write(lease_pb2.LeaseKeepAliveRequest(lease_id=grant.lease_id))
    with pytest.raises(grpc.aio.AioRpcError) as follower:
        await call.read()
    failure = rpc_failure(follower.value)
    assert (failure.code, failure.reason, failure.leader) == (
        Code.UNAVAILABLE,
        "NOT_LEADER",
        "10.0.0.2:2379",
    )
