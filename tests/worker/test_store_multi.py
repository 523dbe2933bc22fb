"""CoordinatorStore's multi_get and multi_set over a fake member on a real gRPC server:
multi_get is one call behind one read barrier that waits for every key at once (a key
missing at the timeout names the keys), and multi_set writes every pair. A round store with
spread reads (the TCPStore bridge's) reads from its participant's member, not the client's
preferred one, and passes over a member that failed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from rallypoint.client import Client
from rallypoint.worker import CoordinatorStore, StoreTimeoutError
from tests.coordinator.fake_node import FakeNode, join_round, open_session, served_at, serving
from tests.integration.harness import free_ports


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


def spy_on_addresses(client: Client) -> list[str]:
    """The member addresses the client's calls go to, from now on."""
    asked: list[str] = []
    transport = client._caller.transport
    stubs = transport.stubs

    def recorded(address: str) -> Any:
        asked.append(address)
        return stubs(address)

    transport.stubs = recorded  # type: ignore[method-assign]
    return asked


async def test_spread_reads_go_to_the_participants_member_and_pass_over_a_dead_one() -> None:
    node = FakeNode()
    dead = f"127.0.0.1:{free_ports(1)[0]}"
    async with (
        served_at(node) as live,
        served_at(node) as other,
        served_at(node) as third,
        serving(node) as channel,
    ):
        headers = await open_session(node)
        (joined,) = await join_round(channel, headers, "j", 1)
        participant_id = joined.participant_id

        def endpoints_with(chosen: str) -> list[str]:
            # Three distinct members, ``chosen`` the participant's.
            endpoints = [other, third]
            endpoints.insert(participant_id % 3, chosen)
            return endpoints

        client = Client(endpoints_with(live), open_session_on_connect=False)
        await client.connect()
        try:
            await client.round_store("j", 1, participant_id).set("k", "v")
            transport = client._caller.transport
            transport.preferred = other
            asked = spy_on_addresses(client)
            spread = client.round_store("j", 1, participant_id, spread_reads=True)
            assert await spread.multi_get(["k"]) == [b"v"]
            assert await spread.read_groups([["k"], ["x"]]) == [[b"v"], None]
            # Both on the participant's member, over one RoundStore/Batch stream to it.
            assert asked == [live]
            streams: Any = client._caller.store_streams
            assert set(streams.streams) == {live}
            assert transport.preferred == other  # a spread read does not move the client
        finally:
            await client.close()

        client = Client(endpoints_with(dead), open_session_on_connect=False)
        await client.connect()
        try:
            asked = spy_on_addresses(client)
            spread = client.round_store("j", 1, participant_id, spread_reads=True)
            assert await spread.multi_get(["k"]) == [b"v"]
            assert asked[0] == dead and asked[-1] != dead
            asked.clear()
            # Passed over for a while after it failed.
            assert await spread.multi_get(["k"]) == [b"v"]
            assert dead not in asked
        finally:
            await client.close()
