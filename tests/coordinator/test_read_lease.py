"""Leader leases (coordinator/node/reads.py): the lease's clock on its own, the batcher
renewing it, and members in one process answering reads under it, or by ReadIndex when it
does not hold (after a pause, during a transfer, on a follower)."""

from __future__ import annotations

import asyncio

import pytest

from rallypoint.coordinator.node.driver import Node
from rallypoint.coordinator.node.reads import (
    LeaderLease,
    ReadIndexBatcher,
    lease_clock_s,
    lease_duration_s,
)
from rallypoint.coordinator.state.commands import Put
from rallypoint.coordinator.state.results import PutResult
from rallypoint.raft.types import Index, ReadState

from .test_node import Cluster, open_session, wait_until
from .test_node import cluster as cluster  # the fixture
from .test_node_parts import FakeClock


def test_the_lease_is_shorter_than_the_earliest_vote_after_an_ack() -> None:
    # A follower's first tick may come right after it heard from the leader: it may vote
    # after (election_ticks - 1) ticks.
    assert lease_duration_s(tick_ms=100, election_ticks=10) < 0.9
    assert lease_duration_s(tick_ms=100, election_ticks=10) > 0.5


def test_a_lease_runs_from_the_issue_time_and_expires_on_its_clock() -> None:
    clock = FakeClock()
    lease = LeaderLease(0.8, clock)
    assert not lease.held(3) and lease.wants_renewal(3)
    clock.now_s = 10.3
    lease.confirmed(issued_at_s=10.0, leader_term=3)  # answered later, counted from the issue
    assert lease.held(3)
    assert not lease.held(4)  # another term's lease is no lease
    assert not lease.wants_renewal(3)
    clock.now_s = 10.5
    assert lease.held(3) and lease.wants_renewal(3)
    clock.now_s = 10.8  # a pause: the member resumes past the lease
    assert not lease.held(3)
    lease.confirmed(issued_at_s=10.1, leader_term=0)  # issued while not leading: nothing
    assert not lease.held(3)
    lease.confirmed(issued_at_s=9.0, leader_term=3)  # an older round never shortens it
    lease.confirmed(issued_at_s=10.5, leader_term=3)
    assert lease.held(3) and lease.expires_at_s == pytest.approx(11.3)


async def test_the_batcher_reports_each_confirmed_request_with_its_issue_time() -> None:
    asked: list[bytes] = []
    confirmed: list[tuple[float, int]] = []
    clock = FakeClock()
    term = [5]
    reads = ReadIndexBatcher(
        asked.append,
        lambda: None,
        clock,
        leader_term=lambda: term[0],
        on_confirmed=lambda issued, leading: confirmed.append((issued, leading)),
    )
    clock.now_s = 1.0
    reads.renew()  # no read queued: asked anyway, to renew the lease
    assert len(asked) == 1
    reads.renew()  # one in flight already
    assert len(asked) == 1
    term[0] = 0
    clock.now_s = 2.0
    reads.on_read_state(ReadState(Index(4), asked[0]), applied_index=4)
    assert confirmed == [(1.0, 5)]  # the time and term of the issue, not of the answer
    waiting = reads.wait_applied(6, applied_index=4)
    assert not waiting.done()
    reads.on_applied(6)
    assert waiting.done()
    assert reads.wait_applied(3, applied_index=4).done()


def count_read_index(node: Node) -> list[bytes]:
    """Record the ReadIndex requests ``node`` hands its core from now on."""
    asked: list[bytes] = []
    raw = node.raw
    original = raw.read_index

    def read_index(context: bytes) -> None:
        asked.append(context)
        original(context)

    raw.read_index = read_index  # type: ignore[method-assign]
    return asked


async def held_lease(leader: Node) -> None:
    def held() -> bool:
        found = leader.raw.lease_read_index()
        return found is not None and leader._reads.lease.held(int(found[0]))

    await wait_until(held, "the leader never held its lease")


async def test_a_leader_reads_under_its_lease_without_a_round_trip(cluster: Cluster) -> None:
    leader = await cluster.leader()
    session = await open_session(leader)
    result = await leader.propose(Put(b"k", b"v"), session_id=session, sequence=1)
    assert isinstance(result, PutResult)
    await held_lease(leader)
    asked = count_read_index(leader)
    for _ in range(20):
        await leader.read_barrier()
        kv = leader.state.get(b"k")
        assert kv is not None and kv.value == b"v"
    assert asked == []  # no ReadIndex: the lease answered
    follower = next(n for n in cluster.nodes.values() if n is not leader)
    follower_asked = count_read_index(follower)
    await follower.read_barrier()
    assert len(follower_asked) == 1  # followers keep asking the leader


async def test_a_leader_that_was_paused_falls_back_to_read_index(cluster: Cluster) -> None:
    leader = await cluster.leader()
    await held_lease(leader)
    real_clock = lease_clock_s()
    # As if the process had been stopped for 5 s: its lease clock jumped past the lease
    # (the renewal that the tick loop then asks for starts after the pause).
    leader._reads.lease._clock_s = lambda: real_clock() + 5.0
    asked = count_read_index(leader)
    await leader.read_barrier()
    assert len(asked) >= 1  # confirmed by a heartbeat round, not the stale lease


async def test_no_leased_read_once_a_transfer_begins(cluster: Cluster) -> None:
    leader = await cluster.leader()
    await held_lease(leader)
    target = next(n for n in cluster.nodes.values() if n is not leader)
    transfer = asyncio.ensure_future(
        leader.membership.transfer_leader(target.member_id, timeout_s=5.0)
    )
    await asyncio.sleep(0)  # the core sent MsgTimeoutNow (or is catching the target up)
    assert leader.raw.lease_read_index() is None
    await transfer
    assert not leader.is_leader()
    await wait_until(lambda: target.is_leader(), "the transfer did not complete")
