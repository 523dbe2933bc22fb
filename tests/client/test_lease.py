"""Leases: keep-alive over the stream, following the leader, loss detection, fencing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from rallypoint.client import Client, Lease, StaleFenceError

from .fake_server import FakeCluster


async def eventually(condition: Callable[[], bool], what: str, within_s: float = 5.0) -> None:
    """Wait for ``condition`` with a deadline (never a bare sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_grant_gives_a_fence_and_keeps_the_lease_alive(
    cluster: FakeCluster, client: Client
) -> None:
    lease = await client.grant_lease(0.3)
    assert lease.alive
    assert lease.ttl_s == pytest.approx(0.3)
    assert lease.fence.lease_id == lease.lease_id
    assert lease.fence.token == lease.fencing_token
    await client.put("owner", b"me", lease=lease, fence=lease.fence)
    # Well past the TTL, still alive, because keep-alives flow every TTL/3.
    await eventually(lambda: cluster.store.lease_keepalives[lease.lease_id] >= 6, "keep-alives")
    assert lease.alive
    assert lease.lease_id in cluster.store.leases
    kv = await client.get("owner")
    assert kv is not None and kv.lease_id == lease.lease_id


async def test_server_side_expiry_is_reported_and_fences_off_writes(
    cluster: FakeCluster, client: Client
) -> None:
    # A TTL long enough that a loaded machine's late keep-alive cannot time out first: the
    # loss must come from the server's answer.
    lease = await client.grant_lease(1.5)
    lost: list[Lease] = []
    lease.on_lost(lost.append)
    await client.put("owner", b"me", lease=lease, fence=lease.fence)
    await cluster.store.expire_lease(lease.lease_id)
    reason = await asyncio.wait_for(lease.wait_lost(), 5.0)
    assert "expired or was revoked" in reason
    assert not lease.alive
    await eventually(lambda: lost == [lease], "the loss callback")
    with pytest.raises(StaleFenceError, match="stale"):
        await client.put("owner", b"late", fence=lease.fence)
    assert await client.get("owner") is None


async def test_keep_alive_follows_the_leader(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    follower, leader, _ = cluster.members
    client = await make_client([follower.address, leader.address]).connect()
    lease = await client.grant_lease(0.3)
    follower.switches.not_leader = leader.address
    start = cluster.store.lease_keepalives[lease.lease_id]
    await eventually(
        lambda: (
            leader.calls["KeepAlive"] >= 1
            and cluster.store.lease_keepalives[lease.lease_id] >= start + 6
        ),
        "keep-alives at the leader",
    )
    assert lease.alive


async def test_an_unanswered_lease_is_lost_within_its_ttl(
    cluster: FakeCluster, client: Client
) -> None:
    lease = await client.grant_lease(0.3)
    for member in cluster.members:
        member.switches.hang = True
    reason = await asyncio.wait_for(lease.wait_lost(), 5.0)
    assert "within its 0.3 s TTL" in reason
    assert not lease.alive


async def test_lease_context_revokes_on_exit(cluster: FakeCluster, client: Client) -> None:
    async with client.lease(5.0) as lease:
        await client.put("held", b"x", lease=lease)
        assert lease.lease_id in cluster.store.leases
    assert lease.lease_id not in cluster.store.leases
    assert not lease.alive
    assert lease.lost_reason is not None and "revoked" in lease.lost_reason
    assert await client.get("held") is None


async def test_list_time_to_live_and_take_over(cluster: FakeCluster, client: Client) -> None:
    lease = await client.grant_lease(2.0, keep_alive=False)
    await client.put("a", b"1", lease=lease)
    listed = await client.lease_list()
    assert [info.lease_id for info in listed] == [lease.lease_id]
    info = await client.lease_time_to_live(lease.lease_id, keys=True)
    assert info.keys == (b"a",)
    assert info.fencing_token == lease.fencing_token
    taken = await client.keep_alive_lease(lease.lease_id)
    assert taken.fencing_token == lease.fencing_token
    await eventually(lambda: cluster.store.lease_keepalives[lease.lease_id] >= 1, "keep-alive")
    deleted = await client.revoke_lease(lease.lease_id)
    assert deleted == [b"a"]
