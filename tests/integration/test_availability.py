"""Availability with real member processes: a live majority elects a leader within seconds.

The sequence that once left two live members leaderless for 8-40 s: kill -9 the leader, keep
it down a while, restart it, and once it has caught up kill -9 the new leader. The two
members left are a majority, so the next write must succeed within a couple of election
timeouts. (Messages from a surviving member to the restarted one were lost without Raft
being told, one batch per stream that had failed while it was down.)
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from rallypoint.client import Client, RallypointError
from tests.integration.harness import ProcessCluster, running_cluster, wait_until

pytestmark = pytest.mark.integration

# The harness's timing: 50 ms ticks, 10 ticks per election timeout (randomised up to 2x).
ELECTION_TIMEOUT_S = 0.5
# Two randomised election timeouts, a pre-vote and a vote round, the client finding the new
# leader: well under this on any machine that runs the suite.
WRITE_AFTER_LEADER_KILL_BOUND_S = 2.0


async def first_write_after(client: Client, key: str, give_up_s: float) -> float:
    """Seconds from now until a put succeeds, trying again at once after each failure."""
    started = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            await client.put(key, str(attempt), timeout_s=0.4)
            return time.monotonic() - started
        except RallypointError:
            if time.monotonic() - started > give_up_s:
                raise
            await asyncio.sleep(0.02)


def caught_up(cluster: ProcessCluster, member_id: int, leader: int) -> bool:
    status = cluster.status(member_id)
    leader_status = cluster.status(leader)
    return bool(
        status
        and leader_status
        and status.leader_id == leader
        and status.applied_index >= leader_status.commit_index
    )


@pytest.mark.parametrize("down_s", [3.0, 15.0])
async def test_restart_then_kill_the_leader_leaves_a_live_majority_that_elects(
    tmp_path: Path, down_s: float
) -> None:
    with running_cluster(tmp_path, 3) as cluster:
        async with Client(cluster.endpoints, timeout_s=30.0) as client:
            await client.put("warm", "up")
            first = cluster.leader()
            cluster.kill(first)
            second = cluster.leader(among=[i for i in cluster.members if i != first])
            # Traffic while the first member is down, as a training job would make.
            deadline = time.monotonic() + down_s
            while time.monotonic() < deadline:
                await client.put("while-down", str(time.monotonic()))
                await asyncio.sleep(0.1)
            cluster.start(first)
            wait_until(lambda: caught_up(cluster, first, second), 20, "the restarted member")
            killed_at = time.monotonic()
            cluster.kill(second)
            waited_s = await first_write_after(client, "after", give_up_s=60.0)
            print(
                f"\nmember down {down_s:.0f} s, restarted, then the leader killed: "
                f"next write after {waited_s:.2f} s"
            )
            assert waited_s <= WRITE_AFTER_LEADER_KILL_BOUND_S, (
                f"two live members of three had no leader for {waited_s:.1f} s after the "
                f"leader's kill (election timeout {ELECTION_TIMEOUT_S} s)"
            )
            assert time.monotonic() - killed_at >= waited_s
            # The survivors' logs (default level) tell the story one line per event, and
            # the restarted member's peers said when its stream broke and came back.
            survivors = [i for i in cluster.members if i != second]
            logs = "".join(cluster.log_text(i) for i in survivors)
            assert "started an election at term" in logs
            assert "became leader at term" in logs
            assert f"lost the stream to member {first}" in cluster.log_text(second)
            assert "cast MsgPreVote" not in logs  # the core's per-vote lines: DEBUG only
