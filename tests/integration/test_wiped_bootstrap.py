"""A member that lost its data cannot create the cluster again (issue 33, item 1).

Real member processes. The three members create the cluster, and member 2 stops before any
election (its disk holds the creation and nothing else: it never got past it); members 1
and 3 elect and acknowledge writes; 1 and 3 are killed and 3's data dir wiped; 3 and 2
start. Once, 3 counted itself and 2 as proof that no cluster existed, created it again and
elected a leader with 2 at a term the old cluster had used: every acknowledged write was
lost ("not found"), and member 1 followed the new leader. Now 3 waits, saying so, until
member 1 (the one holding the data) answers; then it rejoins without voting until caught
up, every write is there on every member, and member 1 logs that 3 came back without its
data.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.client import Client
from tests.integration.harness import ProcessCluster, running_cluster, wait_until

pytestmark = pytest.mark.integration

WRITES = 50


async def test_a_wiped_member_and_an_empty_one_wait_for_the_member_holding_the_data(
    tmp_path: Path,
) -> None:
    cluster = ProcessCluster(tmp_path, 3)
    # Nobody campaigns until member 2 has stopped: its disk then holds the creation only.
    for member in cluster.members.values():
        member.extra_args = ["--election-ticks=100000"]
    cluster.start_all()
    try:
        await lose_writes_or_not(cluster)
    except BaseException:
        for member_id in cluster.members:
            print(f"--- member {member_id} log ---\n{cluster.log_text(member_id)[-4000:]}")
        raise
    finally:
        cluster.shutdown()


async def lose_writes_or_not(cluster: ProcessCluster) -> None:
    def started(member_id: int) -> bool:
        return f"member {member_id} started:" in cluster.log_text(member_id)

    wait_until(lambda: all(started(i) for i in cluster.members), 30, "the cluster's creation")
    cluster.kill(2)
    for member_id in (1, 3):
        cluster.kill(member_id)
        cluster.members[member_id].extra_args = []
        cluster.start(member_id)
    cluster.members[2].extra_args = []
    cluster.leader(timeout_s=30)
    async with Client(cluster.endpoints, timeout_s=20.0) as client:
        for i in range(WRITES):
            await client.put(f"precious/{i:02d}", str(i))
    cluster.kill(1)
    cluster.kill(3)
    cluster.wipe(3)
    log_before = {i: len(cluster.log_text(i)) for i in cluster.members}

    def since_restart(member_id: int) -> str:
        return cluster.log_text(member_id)[log_before[member_id] :]

    cluster.start(3)
    cluster.start(2)

    def decided() -> bool:
        text = since_restart(3)
        return "cannot prove that no cluster exists" in text or "created a cluster" in text

    wait_until(decided, 30, "member 3 to wait for member 1, or to create a cluster")
    # Judged after the writes are read back, so that today's failure shows what it costs.
    created_without_1 = "created a cluster" in since_restart(3)
    served_without_1 = cluster.status(3) is not None
    # Member 2's disk is intact: it runs, but alone it elects nobody.
    status = cluster.status(2)
    elected_without_1 = status is not None and status.leader_id != 0

    cluster.start(1)
    leader = cluster.leader(timeout_s=30)
    async with Client(cluster.endpoints, timeout_s=20.0) as client:
        for i in range(WRITES):
            kv = await client.get(f"precious/{i:02d}")
            assert kv is not None and kv.value == str(i).encode(), f"acked write {i} lost"
        await client.put("after", "rejoin")
    assert not created_without_1, "member 3 created a second cluster"
    assert not served_without_1, "member 3 served without proof"
    assert not elected_without_1, "members 2 and 3 elected a leader without member 1"
    assert leader != 3, "a member that lost its data led before it caught up"
    leader_status = cluster.status(leader)
    assert leader_status is not None

    def converged() -> bool:
        statuses = [cluster.status(i) for i in cluster.members]
        return all(
            s is not None and s.applied_index >= leader_status.commit_index and not s.catching_up
            for s in statuses
        )

    wait_until(converged, 30, "every member to catch up and vote again")
    for member_id, member in cluster.members.items():
        async with Client([member.client_address]) as local:
            found = [kv async for kv in local.range_pages("precious/", serializable=True)]
            assert len(found) == WRITES, member_id
    assert "lost its data and rejoins" in since_restart(3)
    # The member holding the data says, in its own log, that 3 came back empty.
    assert "member 3 started with empty storage" in since_restart(1)


async def test_a_wiped_follower_rejoins_under_the_leader_that_remembers_it(
    tmp_path: Path,
) -> None:
    """The leader stays up and still records what the follower held before it lost its disk:
    its heartbeats carried a commit index beyond the rejoined follower's log, which stopped
    the follower ("to_commit is out of range"), and its record made the follower's
    rejections look stale. Now the follower catches up and votes again."""
    with running_cluster(tmp_path, 3) as cluster:
        leader = cluster.leader()
        follower = next(i for i in cluster.members if i != leader)
        async with Client(cluster.endpoints, timeout_s=20.0) as client:
            for i in range(WRITES):
                await client.put(f"precious/{i:02d}", str(i))
        cluster.kill(follower)
        cluster.wipe(follower)
        cluster.start(follower)
        async with Client(cluster.endpoints, timeout_s=20.0) as client:
            await client.put("after", "wipe")
        leader_status = cluster.status(leader)
        assert leader_status is not None

        def caught_up() -> bool:
            assert not cluster.exited_on_their_own(), cluster.exited_on_their_own()
            status = cluster.status(follower)
            return (
                status is not None
                and not status.catching_up
                and status.applied_index >= leader_status.commit_index
            )

        wait_until(caught_up, 30, "the wiped follower to catch up and vote again")
        async with Client([cluster.members[follower].client_address]) as local:
            found = [kv async for kv in local.range_pages("precious/", serializable=True)]
        assert len(found) == WRITES
        assert f"member {follower} came back with a new data directory" in cluster.log_text(leader)
