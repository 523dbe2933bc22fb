"""Leader discovery, retries, deadlines and exactly-once writes, over real gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from rallypoint.client import (
    Client,
    DeadlineExceededError,
    OutcomeUnknownError,
    UnauthenticatedError,
    UnavailableError,
)

from .fake_server import FakeCluster


async def test_follows_the_leader_hint(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    follower, leader, _ = cluster.members
    follower.switches.not_leader = leader.address
    client = await make_client([follower.address]).connect()
    await client.put("k", b"v")
    assert leader.calls["Put"] == 1
    assert follower.calls["Put"] == 0
    # The leader is remembered: the next call goes straight to it.
    await client.get("k")
    assert follower.calls["Get"] == 0
    assert leader.calls["Get"] == 1
    # A hinted leader that was not among the endpoints is now one.
    assert leader.address in client.endpoints


async def test_moves_on_from_an_unreachable_endpoint(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    client = await make_client(["127.0.0.1:1", cluster.members[2].address]).connect()
    await client.put("k", b"v")
    assert await client.get("k") is not None


async def test_retries_until_the_cluster_answers(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    client = await make_client().connect()
    for member in cluster.members:
        member.switches.refuse_next = 3
    result = await client.put("k", b"v")
    assert result.kv.value == b"v"
    refused = sum(member.calls["Put"] for member in cluster.members) - 1
    assert refused >= 3
    assert cluster.store.applies["Put"] == 1


async def test_no_leader_within_the_deadline_is_unavailable(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    client = await make_client(timeout_s=5.0).connect()
    for member in cluster.members:
        member.switches.not_leader = ""
    with pytest.raises(UnavailableError) as raised:
        await client.put("k", b"v", timeout_s=0.3)
    assert "no member could serve the request within 0.3 s" in str(raised.value)
    assert raised.value.reason == "NO_LEADER"
    assert cluster.store.applies["Put"] == 0


async def test_nothing_reachable_is_unavailable(make_client: Callable[..., Client]) -> None:
    client = make_client(["127.0.0.1:1", "127.0.0.1:2"], timeout_s=0.5)
    with pytest.raises(UnavailableError) as raised:
        await client.connect()
    # Each endpoint and what happened there, in words; gRPC's own words only on the error.
    message = str(raised.value)
    assert message.startswith("no member answered within 0.5 s (127.0.0.1:1: connection ")
    assert "127.0.0.1:2: connection refused" in message
    assert "is a member running there, and is that its client port?" in message
    assert "ipv4:" not in message and "failed to connect" not in message
    assert "Connection refused" in raised.value.grpc_detail


async def test_a_member_that_never_answers_raises_deadline_exceeded(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    client = await make_client().connect()
    for member in cluster.members:
        member.switches.hang = True
    with pytest.raises(DeadlineExceededError, match=r"no answer within 0\.3 s"):
        await client.get("k", timeout_s=0.3)


async def test_a_paused_member_costs_one_attempt_not_the_whole_call(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    paused, healthy, _ = cluster.members
    paused.switches.hang = True
    client = await make_client([paused.address, healthy.address], attempt_timeout_s=0.2).connect()
    assert await client.get("k", timeout_s=5.0) is None
    assert healthy.calls["Get"] == 1


async def test_a_lost_reply_is_retried_and_applied_once(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    member = cluster.members[0]
    client = await make_client([member.address]).connect()
    member.switches.drop_reply_next = 2
    result = await client.add("counter", 1)
    assert result.value == 1
    assert cluster.store.applies["Add"] == 1
    assert member.calls["Add"] == 3


async def test_concurrent_writes_with_lost_replies_each_apply_once(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    client = await make_client().connect()
    for member in cluster.members:
        member.switches.drop_reply_next = 4
    results = await asyncio.gather(*(client.add("counter", 1) for _ in range(25)))
    assert sorted(r.value for r in results) == list(range(1, 26))
    assert cluster.store.applies["Add"] == 25
    current = await client.get("counter")
    assert current is not None and current.value == b"25"


async def test_first_unacked_lets_the_server_drop_answers(
    cluster: FakeCluster, client: Client
) -> None:
    for i in range(5):
        await client.put("k", str(i))
    session_id = client.session_id
    assert cluster.store.first_unacked[session_id] == 5
    assert sorted(cluster.store.sessions[session_id]) == [5]


async def test_an_expired_session_is_replaced_transparently(
    cluster: FakeCluster, client: Client
) -> None:
    first = client.session_id
    await client.put("k", b"1")
    cluster.store.expire_session(first)
    await client.put("k", b"2")
    assert client.session_id not in (0, first)
    assert cluster.store.applies["Put"] == 2
    got = await client.get("k")
    assert got is not None and got.value == b"2"


async def test_session_expiry_after_a_lost_reply_is_an_unknown_outcome(
    cluster: FakeCluster, client: Client
) -> None:
    session_id = client.session_id
    member = cluster.members[0]
    for each in cluster.members:
        each.switches.drop_reply_next = 1
        each.switches.after_drop = lambda: cluster.store.expire_session(session_id)
    with pytest.raises(OutcomeUnknownError, match="may or may not have been applied"):
        await client.put("k", b"v")
    # It was in fact applied, once; the client could not know.
    assert cluster.store.applies["Put"] == 1
    # The client moved on to a new session, and later writes work.
    for each in cluster.members:
        each.switches.drop_reply_next = 0
    await client.put("k", b"w")
    assert client.session_id != session_id
    assert member.store.applies["Put"] == 2


async def test_the_session_is_kept_alive(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    client = await make_client(session_ttl_s=0.15).connect()
    deadline = asyncio.get_running_loop().time() + 5.0
    while cluster.store.session_keepalives < 3:
        assert asyncio.get_running_loop().time() < deadline, "no session keep-alives"
        await asyncio.sleep(0.01)
    assert client.session_id in cluster.store.sessions


async def test_close_ends_the_session(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    client = await make_client().connect()
    session_id = client.session_id
    await client.close()
    assert session_id not in cluster.store.sessions


async def test_bearer_token_is_sent(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    for member in cluster.members:
        member.token = "s3cret"
    with pytest.raises(UnauthenticatedError, match="requires a token and none was sent"):
        await make_client().connect()
    client = await make_client(token="s3cret").connect()
    await client.put("k", b"v")


async def test_members_added_later_become_endpoints(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    # Given one member; the others and a new one are learned from membership answers, so the
    # client still reaches the cluster once the members it started with are gone.
    client = await make_client([cluster.members[0].address]).connect()
    await client.member_list()
    assert sorted(client.endpoints) == sorted(cluster.addresses)
    await client.member_add("10.0.0.9:2380", "10.0.0.9:2379")
    assert "10.0.0.9:2379" in client.endpoints
