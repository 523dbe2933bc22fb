"""FutureDeadlines: many futures' deadlines under one timer."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.client.deadlines import FutureDeadlines
from rallypoint.client.session import Session


class Expired(Exception):
    def __init__(self, key: object) -> None:
        super().__init__(key)
        self.key = key


async def test_each_future_fails_at_its_own_deadline_with_its_key() -> None:
    loop = asyncio.get_running_loop()
    deadlines = FutureDeadlines(loop, Expired)
    futures = {key: loop.create_future() for key in ("late", "early", "answered")}
    deadlines.add(futures["late"], 0.2, "late")
    deadlines.add(futures["early"], 0.05, "early")
    deadlines.add(futures["answered"], 0.01, "answered")
    futures["answered"].set_result("yes")
    await asyncio.sleep(0.1)
    assert isinstance(futures["early"].exception(), Expired)
    assert futures["early"].exception().key == "early"  # type: ignore[union-attr]
    assert not futures["late"].done()
    assert futures["answered"].result() == "yes"
    await asyncio.sleep(0.15)
    assert futures["late"].exception().key == "late"  # type: ignore[union-attr]
    assert len(deadlines) == 0
    deadlines.close()


async def test_entries_of_ended_futures_do_not_pile_up() -> None:
    """100,000 futures answered at once, 10 alive at any time: the heap stays near twice the
    live ones (plus a constant), not one entry per future ever added."""
    loop = asyncio.get_running_loop()
    deadlines = FutureDeadlines(loop, Expired)
    alive: list[asyncio.Future[None]] = []
    most = 0
    for _ in range(100_000):
        future: asyncio.Future[None] = loop.create_future()
        deadlines.add(future, 60.0)
        alive.append(future)
        if len(alive) > 10:
            alive.pop(0).set_result(None)
        most = max(most, len(deadlines))
    assert most <= 2 * 10 + 64 + 1
    deadlines.close()
    assert len(deadlines) == 0


async def test_a_closed_set_fails_nothing() -> None:
    loop = asyncio.get_running_loop()
    deadlines = FutureDeadlines(loop, Expired)
    future: asyncio.Future[None] = loop.create_future()
    deadlines.add(future, 0.01)
    deadlines.close()
    await asyncio.sleep(0.05)
    assert not future.done()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=30), max_size=200), st.randoms())
def test_first_unacked_is_the_lowest_outstanding_sequence(
    steps: list[int], rng: random.Random
) -> None:
    """Session.first_unacked (kept moving forward, not a min over every outstanding sequence
    per write) against the plain definition, through any order of begins and finishes."""
    session = Session(1, 60.0)
    for step in steps:
        if step % 3 == 0 or not session.outstanding:
            session.begin()
        else:
            session.finish(rng.choice(sorted(session.outstanding)))
        expected = min(session.outstanding, default=session.next_sequence)
        assert session.first_unacked == expected
