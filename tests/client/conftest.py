from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from rallypoint.client import Backoff, Client

from .fake_server import FakeCluster, fake_cluster

# Short sleeps keep retry tests quick; the policy itself is tested in test_backoff.
FAST_BACKOFF = Backoff(base_s=0.002, cap_s=0.02)


@pytest.fixture
async def cluster() -> AsyncIterator[FakeCluster]:
    async with fake_cluster(3) as running:
        yield running


@pytest.fixture
async def make_client(
    cluster: FakeCluster,
) -> AsyncIterator[Callable[..., Client]]:
    """Builds clients of the fake cluster (closed at the end of the test)."""
    made: list[Client] = []

    def make(endpoints: list[str] | None = None, **options: Any) -> Client:
        options.setdefault("backoff", FAST_BACKOFF)
        options.setdefault("rng", random.Random(7))
        options.setdefault("timeout_s", 5.0)
        client = Client(endpoints if endpoints is not None else cluster.addresses, **options)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


@pytest.fixture
async def client(make_client: Callable[..., Client]) -> Client:
    return await make_client().connect()
