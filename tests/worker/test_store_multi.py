"""CoordinatorStore's multi_get and multi_set over a fake member on a real gRPC server:
multi_get is one call behind one read barrier that waits for every key at once (a key
missing at the timeout names the keys), and multi_set writes every pair."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest

from rallypoint.coordinator.service.store_cache import StoreCacheLeases
from rallypoint.worker import CoordinatorStore, StoreTimeoutError
from rallypoint.worker import store as store_module
from tests.coordinator.fake_node import FakeNode, join_round, open_session, served_at, serving


@dataclass
class Served:
    node: FakeNode
    store: CoordinatorStore


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    node = FakeNode()
    async with served_at(node) as address, serving(node) as channel:
        headers = await open_session(node)
        (joined,) = await join_round(channel, headers, "j", 1)
        store = await asyncio.to_thread(
            CoordinatorStore, [address], "j", 1, joined.participant_id,
            timeout=timedelta(seconds=20),
        )  # fmt: skip
        try:
            yield Served(node, store)
        finally:
            await asyncio.to_thread(store.close)


async def test_multi_get_is_one_read_and_waits_for_every_key(served: Served) -> None:
    store, node = served.store, served.node

    def run() -> None:
        store.multi_set(["a", "b", "a2"], [b"1", b"2", "3"])
        barriers = node.read_barriers
        assert store.multi_get(["b", "a", "a2", "a"]) == [b"2", b"1", b"3", b"1"]
        assert node.read_barriers == barriers + 1
        assert store.multi_get([]) == []
        # A multi_get blocks until another thread sets its missing keys.
        got: list[list[bytes]] = []
        reader = threading.Thread(target=lambda: got.append(store.multi_get(["a", "x", "y"])))
        reader.start()
        store.set("x", b"X")
        assert not got
        store.set("y", b"Y")
        reader.join(timeout=30)
        assert got == [[b"1", b"X", b"Y"]]
        store.multi_set(["z", "z"], [b"first", b"last"])  # a repeated key: in order
        assert store.get("z") == b"last"
        store.set_timeout(timedelta(seconds=0.3))
        with pytest.raises(StoreTimeoutError, match=r"multi_get timed out .* never"):
            store.multi_get(["a", "never"])
        with pytest.raises(ValueError, match="2 keys but 1 values"):
            store.multi_set(["p", "q"], [b"1"])

    await asyncio.to_thread(run)


async def test_a_get_right_after_a_wait_for_its_key_reads_nothing_again(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gloo connects a group by waiting for each peer's key and then reading it: one read."""
    store, node = served.store, served.node
    # gloo's get follows its wait at once; a loaded machine may hold this thread longer.
    monkeypatch.setattr(store_module, "_WAITED_VALUE_S", 60.0)

    def run() -> None:
        store.set("addr/1", b"one")
        reads = node.read_barriers
        store.wait(["addr/1"])
        assert store.get("addr/1") == b"one"
        assert node.read_barriers == reads + 1
        # Only the next call, and only for that key: a second get, a get after another
        # call, a get of another key read again (and see later writes).
        store.set("addr/1", b"two")
        assert store.get("addr/1") == b"two"
        store.wait(["addr/1"])
        store.set("addr/2", b"x")
        store.set("addr/1", b"three")
        assert store.get("addr/1") == b"three"
        store.wait(["addr/1"])
        assert store.get("addr/2") == b"x"
        # A wait for several keys reads no values; a wait on another thread answers only
        # that thread's get.
        store.wait(["addr/1", "addr/2"])
        other = threading.Thread(target=lambda: store.wait(["addr/2"]))
        other.start()
        other.join(timeout=30)
        reads = node.read_barriers
        assert store.get("addr/2") == b"x"
        assert node.read_barriers == reads + 1
        # A get that comes later than the window after its wait reads again.
        monkeypatch.setattr(store_module, "_WAITED_VALUE_S", 0.0)
        store.wait(["addr/1"])
        reads = node.read_barriers
        assert store.get("addr/1") == b"three"
        assert node.read_barriers == reads + 1
        # A key that never comes still times out, naming it.
        store.set_timeout(timedelta(seconds=0.3))
        with pytest.raises(StoreTimeoutError, match=r"wait timed out .* never"):
            store.wait(["never"])

    await asyncio.to_thread(run)


@contextlib.contextmanager
def _store_of(served: Served, world_size: int) -> Iterator[CoordinatorStore]:
    """Another store of the fixture's round and participant (its own client), that reads
    exchanges of up to ``world_size`` ranks ahead."""
    address = served.store._store.store.caller.transport.endpoints[0]
    store = CoordinatorStore(
        [address],
        "j",
        1,
        served.store.participant_id,
        timeout=timedelta(seconds=20),
        world_size=world_size,
    )
    try:
        yield store
    finally:
        store.close()


def _connect(store: CoordinatorStore, prefix: str, rank: int, size: int) -> list[bytes]:
    """What gloo's full-mesh connect does with the store: publish this rank's address,
    then wait for and get every rank's, in order."""
    store.set(f"{prefix}/{rank}", f"addr-{rank}")
    values = []
    for i in range(size):
        store.wait([f"{prefix}/{i}"])
        values.append(store.get(f"{prefix}/{i}"))
    return values


async def test_a_group_s_address_exchange_is_one_read_when_every_rank_published(
    served: Served,
) -> None:
    """gloo's connect of an n-rank group waits for and gets n keys: one read, not n."""
    node = served.node

    def run() -> None:
        with _store_of(served, world_size=8) as store:
            # Ranks 0, 2, 3 published; this one is rank 1 of a 4-rank group in a world of 8.
            store.multi_set(["g/0", "g/2", "g/3"], ["addr-0", "addr-2", "addr-3"])
            reads = node.read_barriers
            assert _connect(store, "g", 1, 4) == [b"addr-0", b"addr-1", b"addr-2", b"addr-3"]
            assert node.read_barriers == reads + 1
            # The next group (another prefix) is read afresh, once.
            store.multi_set(["h/1"], ["addr-1"])
            reads = node.read_barriers
            assert _connect(store, "h", 0, 2) == [b"addr-0", b"addr-1"]
            assert node.read_barriers == reads + 1

    await asyncio.to_thread(run)


async def test_an_exchange_key_still_missing_is_waited_for(served: Served) -> None:
    def run() -> None:
        with _store_of(served, world_size=4) as store, _store_of(served, 4) as peer:
            peer.set("g/0", "addr-0")
            got: list[list[bytes]] = []
            connecting = threading.Thread(target=lambda: got.append(_connect(store, "g", 1, 3)))
            connecting.start()
            # Rank 2 publishes once rank 1 waits for it (or later: either way it connects).
            peer.set("g/2", "addr-2")
            connecting.join(timeout=30)
            assert got == [[b"addr-0", b"addr-1", b"addr-2"]]

    await asyncio.to_thread(run)


async def test_a_value_read_ahead_never_answers_after_a_write_changed_it(served: Served) -> None:
    """A rewrite of a key read ahead: once the write returned, reads answer the new value
    (the write waited for the lease; the store let the value go before the lease ended)."""

    def run() -> None:
        with _store_of(served, world_size=4) as store, _store_of(served, 4) as writer:
            writer.multi_set(["g/0", "g/2"], ["addr-0", "addr-2"])
            assert _connect(store, "g", 1, 3) == [b"addr-0", b"addr-1", b"addr-2"]
            writer.set("g/2", "moved")  # held by the coordinator until the lease ended
            store.wait(["g/2"])
            assert store.get("g/2") == b"moved"
            # This store's own write of a key it read ahead is read afresh too.
            _connect(store, "k", 0, 1)
            store.set("g/0", "mine")
            assert store.get("g/0") == b"mine"
            # A counter read ahead: another rank's add is seen once it returned.
            assert writer.add("c/1", 1) == 1
            assert _connect(store, "c", 0, 2) == [b"addr-0", b"1"]
            assert writer.add("c/1", 1) == 2
            store.wait(["c/1"])
            assert store.get("c/1") == b"2"

    await asyncio.to_thread(run)


async def test_without_leases_a_value_read_ahead_answers_only_its_own_wait(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member other than the leader grants no lease: nothing read ahead is kept, so a
    rewrite is seen at once."""
    monkeypatch.setattr(StoreCacheLeases, "grant", lambda self, scope, keys, values=None: 0)
    node = served.node

    def run() -> None:
        with _store_of(served, world_size=4) as store, _store_of(served, 4) as writer:
            writer.multi_set(["g/0", "g/2"], ["addr-0", "addr-2"])
            reads = node.read_barriers
            assert _connect(store, "g", 1, 3) == [b"addr-0", b"addr-1", b"addr-2"]
            assert node.read_barriers == reads + 3
            writer.set("g/2", "moved")
            store.wait(["g/2"])
            assert store.get("g/2") == b"moved"

    await asyncio.to_thread(run)
