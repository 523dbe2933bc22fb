"""The blocking wrapper, driven from worker threads while the fake cluster runs on the test's
event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rallypoint.client import EventType, NotAnIntegerError, SyncClient

from .conftest import FAST_BACKOFF
from .fake_server import FakeCluster


async def test_sync_client_from_threads(cluster: FakeCluster) -> None:
    def scenario() -> list[int]:
        with SyncClient(cluster.addresses, backoff=FAST_BACKOFF) as client:
            client.put("a", b"one")
            kv = client.get("a")
            assert kv is not None and kv.value == b"one"
            assert client.range("").kvs[0].key == b"a"
            with pytest.raises(NotAnIntegerError):
                client.add("a", 1)
            values: list[int] = []

            def worker() -> None:
                for _ in range(5):
                    values.append(client.add("n", 1).value)

            threads = [threading.Thread(target=worker) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert [kv.key for kv in client.range_pages("", page_size=1)] == [b"a", b"n"]
            return sorted(values)

    assert await asyncio.to_thread(scenario) == list(range(1, 21))


async def test_sync_lease_and_watch(cluster: FakeCluster) -> None:
    def scenario() -> None:
        with SyncClient(cluster.addresses, backoff=FAST_BACKOFF) as client:
            with client.watch("held") as watcher, client.lease(5.0) as lease:
                assert lease.alive
                client.put("held", b"x", lease=lease.lease_id, fence=lease.fence)
                first = next(watcher)
                assert (first.type, first.kv.lease_id) == (EventType.PUT, lease.lease_id)
                assert not lease.wait_lost(0.01)
            # Revoking on exit deleted the key.
            deleted = next(iter(client.watch("held", start_revision=first.revision + 1)))
            assert deleted.type is EventType.DELETE
            assert lease.wait_lost(5.0)

    await asyncio.to_thread(scenario)


async def test_closing_a_watch_from_another_thread_ends_the_iteration(
    cluster: FakeCluster,
) -> None:
    def scenario() -> list[object]:
        with SyncClient(cluster.addresses, backoff=FAST_BACKOFF) as client:
            watcher = client.watch("nothing-here")
            seen: list[object] = []
            reader = threading.Thread(target=lambda: seen.extend(watcher))
            reader.start()
            watcher.close()
            reader.join(10.0)
            assert not reader.is_alive()
            return seen

    assert await asyncio.to_thread(scenario) == []
