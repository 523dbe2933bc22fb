"""CoordinatorStore's multi_get and multi_set over a fake member on a real gRPC server:
multi_get is one call behind one read barrier that waits for every key at once (a key
missing at the timeout names the keys), and multi_set writes every pair."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

import pytest

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
