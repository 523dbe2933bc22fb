"""The leader's cache leases on round-store keys and the gate of round-store writes
(coordinator/service/store_cache.py): a write never applies while a lease on its key lasts,
a key being written is never leased, a new leader waits out its predecessor's leases, a
write that lost its term is dropped, and only the leader serves writes or grants leases."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from rallypoint.coordinator.node.api import (
    NoLeaderError,
    NotLeaderError,
    ProposalDroppedError,
    ProposalTimeoutError,
)
from rallypoint.coordinator.service.store_cache import DRIFT, StoreCacheLeases
from rallypoint.coordinator.service.validate import Scope

SCOPE = Scope("job", 3, 7)
OTHER_ROUND = Scope("job", 4, 7)
LEASE_S = 1.0


class Leading:
    """The node as the gate sees it: whether (and in which term) it leads."""

    def __init__(self) -> None:
        self.term: int | None = 5
        self.leader_id = 1
        # When it saw itself elected in self.term (None: not yet).
        self.since: float | None = -100.0

    def leader_term(self) -> int | None:
        return self.term

    def leader_since(self, term: int) -> float | None:
        return self.since if term == self.term else None

    def require_leader(self) -> None:
        if self.term is None:
            raise NotLeaderError(2, "10.0.0.2:2379") if self.leader_id else NoLeaderError()


class Clock:
    """Virtual time: a write's wait for a lease advances it, so what happened when is exact
    whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def leases(node: Leading, lease_s: float = LEASE_S) -> StoreCacheLeases:
    """The node's cache leases on virtual time (its term begun long ago: writes go at once)."""
    clock = Clock()
    return StoreCacheLeases(
        node,  # type: ignore[arg-type]
        lease_s=lease_s,
        clock=clock,
        sleep=clock.sleep,
    )


async def test_a_write_proposes_only_once_the_lease_on_its_key_ended() -> None:
    node = Leading()
    cache = leases(node)
    assert cache.grant(SCOPE, [b"a", b"b"]) == int(LEASE_S * 1000)
    ends = cache._leased[("job", 3)][b"a"]
    proposed_at: list[float] = []

    async def propose(term: int) -> str:
        assert term == 5
        proposed_at.append(cache._clock())
        return "applied"

    # Another key, and the same key in another round: not held.
    assert await cache.write(SCOPE, b"c", propose) == "applied"
    assert await cache.write(OTHER_ROUND, b"a", propose) == "applied"
    assert proposed_at[-1] < ends
    assert await cache.write(SCOPE, b"a", propose) == "applied"
    assert proposed_at[-1] >= ends
    assert not cache._writing


async def test_a_key_being_written_is_not_leased_until_its_write_applied() -> None:
    node = Leading()
    cache = leases(node)
    release = asyncio.Event()

    async def propose(term: int) -> None:
        await release.wait()

    write = asyncio.create_task(cache.write(SCOPE, b"a", propose))
    await asyncio.sleep(0)
    assert cache.grant(SCOPE, [b"a"]) == 0
    assert cache.grant(SCOPE, [b"a", b"b"]) == 0  # a group's lease is all of it or nothing
    assert cache.grant(SCOPE, [b"b"]) > 0
    release.set()
    await write
    assert cache.grant(SCOPE, [b"a"]) > 0


async def test_a_write_that_may_still_apply_keeps_its_key_unleased_for_the_term() -> None:
    node = Leading()
    cache = leases(node)

    async def times_out(term: int) -> None:
        raise ProposalTimeoutError("not confirmed")

    async def dropped(term: int) -> None:
        raise ProposalDroppedError("dropped")

    with pytest.raises(ProposalTimeoutError):
        await cache.write(SCOPE, b"a", times_out)
    assert cache.grant(SCOPE, [b"a"]) == 0  # it may still apply
    with pytest.raises(ProposalDroppedError):
        await cache.write(SCOPE, b"b", dropped)
    assert cache.grant(SCOPE, [b"b"]) > 0  # it never applies
    # A write whose caller went away while it was proposed may still apply, too.
    started = asyncio.Event()

    async def held(term: int) -> None:
        started.set()
        await asyncio.Event().wait()

    cancelled = asyncio.create_task(cache.write(SCOPE, b"c", held))
    await started.wait()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert cache.grant(SCOPE, [b"c"]) == 0
    node.term = 6  # a new term: the earlier term's entries apply before its reads
    assert cache.grant(SCOPE, [b"a"]) > 0


async def test_a_new_leader_writes_only_once_its_predecessor_s_leases_ended() -> None:
    node = Leading()
    cache = leases(node)
    proposed_at: list[float] = []

    async def propose(term: int) -> None:
        proposed_at.append(cache._clock())

    # Elected just now: its first write waits out the predecessor's leases, counted from
    # the election (not from the write).
    node.term, node.since = 8, cache._clock() - 0.25
    await cache.write(SCOPE, b"fresh", propose)
    assert proposed_at[-1] == pytest.approx(node.since + LEASE_S * (1 + DRIFT))
    # Elected long ago (its first write comes much later): no wait.
    node.term, node.since = 9, cache._clock() - 10 * LEASE_S
    asked = cache._clock()
    await cache.write(SCOPE, b"fresh", propose)
    assert proposed_at[-1] == asked
    # Leads in a term it has not seen itself elected in yet: counted from now.
    node.term, node.since = 10, None
    asked = cache._clock()
    await cache.write(SCOPE, b"fresh", propose)
    assert proposed_at[-1] == pytest.approx(asked + LEASE_S * (1 + DRIFT))


async def test_only_the_leader_grants_or_writes() -> None:
    node = Leading()
    cache = leases(node)
    node.term = None

    async def propose(term: int) -> None:
        raise AssertionError("a member that does not lead proposed a store write")

    assert cache.grant(SCOPE, [b"a"]) == 0
    with pytest.raises(NotLeaderError) as refused:
        await cache.write(SCOPE, b"a", propose)
    assert refused.value.leader_address == "10.0.0.2:2379"


async def test_a_write_whose_leader_lost_its_term_while_waiting_is_not_proposed() -> None:
    node = Leading()
    cache = leases(node)
    cache.grant(SCOPE, [b"a"])

    async def propose(term: int) -> None:
        raise AssertionError("proposed after its term ended")

    write = asyncio.create_task(cache.write(SCOPE, b"a", propose))
    await asyncio.sleep(0)  # it waits for the lease
    node.term = None
    with pytest.raises(NotLeaderError):
        await write
    node.term = 9  # leads again, in a later term: the old write still is not proposed
    cache.grant(SCOPE, [b"b"])
    write = asyncio.create_task(cache.write(SCOPE, b"b", propose))
    await asyncio.sleep(0)
    node.term = 10
    with pytest.raises(ProposalDroppedError):
        await write


async def test_ended_leases_are_swept() -> None:
    node = Leading()
    cache = leases(node)
    clock = cache._clock
    assert isinstance(clock, Clock)
    for i in range(5000):
        cache.grant(Scope("job", i, 1), [b"k"])
        if i == 0:
            clock.now += 2 * LEASE_S
    assert len(cache._leased) < 5000


async def test_a_write_that_leaves_the_value_as_it_is_does_not_wait_for_the_lease() -> None:
    """c10d's store-based barrier: every rank that reads the full count sets the last-worker
    key, which others already read (and a bridge holds under a lease), to the same value."""
    node = Leading()
    cache = leases(node)
    cache.grant(SCOPE, [b"last"])
    ends = cache._leased[("job", 3)][b"last"]
    proposed_at: list[float] = []

    async def propose(term: int) -> None:
        proposed_at.append(cache._clock())

    await cache.write(SCOPE, b"last", propose, unchanged=lambda: True)
    assert proposed_at[-1] < ends
    # Nor while other writes of the key are in flight: one that keeps the value too (every
    # rank seeing the full count sets the key at once), and one that changes it, which waits
    # for the lease (here until the test lets it) and so is proposed after.
    cache = leases(node)
    clock = cache._clock
    assert isinstance(clock, Clock)
    lease_over = asyncio.Event()

    async def sleep(seconds: float) -> None:
        await lease_over.wait()
        clock.now += seconds

    cache._sleep = sleep
    cache.grant(SCOPE, [b"last"])
    release = asyncio.Event()
    order: list[str] = []

    def proposing(name: str, hold: bool = False) -> Callable[[int], Awaitable[None]]:
        async def propose(term: int) -> None:
            order.append(name)
            if hold:
                await release.wait()

        return propose

    keeping = asyncio.create_task(
        cache.write(SCOPE, b"last", proposing("keeps", hold=True), unchanged=lambda: True)
    )
    changes = asyncio.create_task(cache.write(SCOPE, b"last", proposing("changes")))
    again = asyncio.create_task(
        cache.write(SCOPE, b"last", proposing("keeps again"), unchanged=lambda: True)
    )
    await asyncio.sleep(0.01)
    assert again.done() and order == ["keeps", "keeps again"]
    assert not changes.done()  # waits for the lease
    lease_over.set()
    await changes
    assert order == ["keeps", "keeps again", "changes"]
    release.set()
    await keeping


async def test_a_key_being_set_to_the_value_it_holds_is_leased_that_value() -> None:
    """c10d's barrier has every node that reads the full count set the last-worker key to
    the same value at once: while only such sets of the key are in flight, a lease on that
    value (for a read, or for the answer of one of those sets) is granted; with a write in
    flight that may change the value, none is."""
    node = Leading()
    cache = leases(node)
    release = asyncio.Event()

    async def propose(term: int) -> None:
        await release.wait()

    def setting(value: bytes) -> asyncio.Task[None]:
        return asyncio.create_task(cache.write(SCOPE, b"last", propose, sets=value))

    sets = [setting(b"1"), setting(b"1")]
    await asyncio.sleep(0)
    assert cache.grant(SCOPE, [b"last"], [b"1"]) == int(LEASE_S * 1000)
    assert cache.grant(SCOPE, [b"last"], [b"2"]) == 0  # they would change that value
    assert cache.grant(SCOPE, [b"last"]) == 0  # values not given: any write refuses
    # A set of another value in flight, or a write that is not a set: no lease on "1".
    other = setting(b"2")
    await asyncio.sleep(0)
    assert cache.grant(SCOPE, [b"last"], [b"1"]) == 0
    release.set()
    await asyncio.gather(*sets, other)
    assert not cache._writing and not cache._setting
    release.clear()
    add = asyncio.create_task(cache.write(SCOPE, b"last", propose))
    await asyncio.sleep(0)
    assert cache.grant(SCOPE, [b"last"], [b"1"]) == 0
    release.set()
    await add
    # A group is leased only if each of its keys is.
    release.clear()
    held = setting(b"1")
    await asyncio.sleep(0)
    assert cache.grant(SCOPE, [b"last", b"x"], [b"1", b"y"]) > 0
    assert cache.grant(SCOPE, [b"x", b"last"], [b"y", b"2"]) == 0
    release.set()
    await held


async def test_a_set_that_may_still_apply_keeps_its_value_leasable_and_no_other() -> None:
    node = Leading()
    cache = leases(node)

    async def times_out(term: int) -> None:
        raise ProposalTimeoutError("not confirmed")

    with pytest.raises(ProposalTimeoutError):
        await cache.write(SCOPE, b"k", times_out, sets=b"v")
    # Marked for the term as a set of "v": a lease on "v" stays right if it applies later.
    assert cache.grant(SCOPE, [b"k"], [b"v"]) > 0
    assert cache.grant(SCOPE, [b"k"], [b"w"]) == 0
    node.term = 6  # a new term forgets the marks
    assert cache.grant(SCOPE, [b"k"], [b"w"]) > 0
