"""The client's HeartbeatBatcher against real member processes.

Three batchers carry a third of a job's participants each, one starting on each member.
Claims: every participant is pushed its own ACTIVE seat; a batcher whose member is killed
fails over to another member by itself, and nobody is falsely suspected; an evicted
participant is pushed ``gone`` and no longer heartbeated, while the others are pushed the
next round; a released participant's silence is not taken for a failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rallypoint.client import (
    Assignment,
    Client,
    EndReason,
    HeartbeatBatcher,
    RoundState,
)

from .harness import running_cluster
from .test_spread_detection import CONFIG, join_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

JOB = "spread"
INTERVAL_S = CONFIG.heartbeat_interval_ms / 1000


async def wait_for(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)


def everyone(batchers: list[HeartbeatBatcher], check: Callable[[Assignment], bool]) -> bool:
    for batcher in batchers:
        for participant_id in batcher.carried:
            found = batcher.assignment(participant_id)
            if found is None or not check(found):
                return False
    return True


async def test_batchers_follow_rounds_fail_over_and_drop_the_gone(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 3) as cluster:
        leader = cluster.leader()
        pids = await join_all(cluster.endpoints[leader - 1])
        async with Client(cluster.endpoints, timeout_s=20) as client:
            batchers = [
                client.heartbeat_batcher(JOB, heartbeat_interval_s=INTERVAL_S, first_endpoint=i)
                for i in range(3)
            ]
            for i, pid in enumerate(pids):
                batchers[i % 3].add(pid)
            for batcher in batchers:
                batcher.start()

            await wait_for(
                lambda: everyone(batchers, lambda a: a.state is RoundState.ACTIVE),
                30,
                "every participant pushed its ACTIVE seat",
            )
            seats = [b.assignment(p) for b in batchers for p in b.carried]
            assert sorted(a.rank for a in seats if a) == list(range(len(pids)))
            first_round = seats[0].round if seats[0] else 0
            assert {b.address for b in batchers} == set(cluster.endpoints)

            # Kill a follower: its batcher moves to another member by itself.
            victim = next(m for m in (1, 2, 3) if m != leader)
            moved = batchers[victim - 1]
            cluster.kill(victim)
            await wait_for(
                lambda: moved.address not in ("", cluster.endpoints[victim - 1]),
                10,
                "the batcher on the killed member to fail over",
            )
            # Well past the detection bound and the grace a member gives newcomers.
            await asyncio.sleep(6)
            status = await client.get_job(JOB)
            assert not status.history, f"false suspicion after a member died: {status.history}"
            assert status.round.round == first_round
            samples = moved.take_samples()
            assert samples.failovers >= 1 and samples.answers > 0

            # Release one (its process hands it over, say): its silence is not evidence.
            released = batchers[0].carried[0]
            batchers[0].release(released)
            batchers[1].add(released, first_round)
            await asyncio.sleep(3)
            assert not (await client.get_job(JOB)).history

            # Evict one: it is pushed `gone` and dropped; the others the next round.
            evicted = batchers[2].carried[-1]
            await client.evict(JOB, evicted)
            await batchers[2].wait_for(evicted, lambda a: a.gone, timeout_s=10)
            assert batchers[2].is_gone(evicted) and evicted not in batchers[2].carried
            await wait_for(
                lambda: everyone(batchers, lambda a: a.round > first_round),
                20,
                "the others pushed the next round",
            )
            records = (await client.get_job(JOB)).history
            assert [r.end_reason for r in records] == [EndReason.MEMBER_EVICTED]
