"""The coordinator as users run it: real member processes on loopback, the client library.

Each test starts its own 3-member cluster (tick 50 ms, so elections take about a second)
and breaks it the way production breaks: kill -9, restart after falling behind, membership
changes, leadership transfer, graceful stop. Durations are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rallypoint.client import Client, FailedPreconditionError, StaleFenceError
from tests.integration.harness import MemberProcess, ProcessCluster, running_cluster, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path, 3, snapshot_entries=200) as c:
        yield c


@pytest.fixture
async def client(cluster: ProcessCluster) -> AsyncIterator[Client]:
    async with Client(cluster.endpoints, timeout_s=20.0) as c:
        yield c


async def test_compare_and_set_races_have_one_winner_per_round(
    cluster: ProcessCluster,
) -> None:
    clients = [Client(cluster.endpoints, timeout_s=20.0) for _ in range(4)]
    for c in clients:
        await c.connect()
    try:
        await clients[0].put("counter", "0")
        for _round in range(10):
            current = await clients[0].get("counter")
            assert current is not None
            attempts = await asyncio.gather(
                *(
                    c.compare_and_set(
                        "counter",
                        str(int(current.value) + 1 + i).encode(),
                        value_equals=current.value,
                    )
                    for i, c in enumerate(clients)
                )
            )
            assert sum(1 for a in attempts if a.succeeded) == 1
        final = await clients[1].get("counter")
        assert final is not None and final.version == 11
    finally:
        for c in clients:
            await c.close()


async def test_watch_order_survives_a_leader_change(
    cluster: ProcessCluster, client: Client
) -> None:
    seen: list[int] = []
    # A watch "from now" fixes its start revision when it starts: start it before the first
    # write, or a slow start misses the first events and the count is never reached.
    events = client.watch("w/", prefix=True)
    await events.start()

    async def watch() -> None:
        async for event in events:
            seen.append(int(event.kv.value))
            if len(seen) == 40:
                return

    watcher = asyncio.create_task(watch())
    async with Client(cluster.endpoints, timeout_s=20.0) as writer:
        for i in range(20):
            await writer.put(f"w/{i % 3}", str(i))
        cluster.kill(cluster.leader())
        for i in range(20, 40):
            await writer.put(f"w/{i % 3}", str(i))
    await asyncio.wait_for(watcher, 30)
    await events.aclose()
    assert seen == list(range(40))


async def test_lease_expiry_deletes_attached_keys(client: Client) -> None:
    lease = await client.grant_lease(1.0, keep_alive=False)
    await client.put("ephemeral", "x", lease=lease)
    await client.put("durable", "y")

    async def gone() -> bool:
        return await client.get("ephemeral") is None

    deadline = time.monotonic() + 15
    while not await gone():
        assert time.monotonic() < deadline, "the lease's key outlived it"
        await asyncio.sleep(0.1)
    assert await client.get("durable") is not None


async def test_fencing_tokens_increase_across_leader_changes(
    cluster: ProcessCluster, client: Client
) -> None:
    first = await client.grant_lease(30.0)
    await client.put("resource", "a", fence=first.fence)
    cluster.kill(cluster.leader())
    second = await client.grant_lease(30.0)
    assert second.fencing_token > first.fencing_token
    await client.put("resource", "b", fence=second.fence)
    with pytest.raises(StaleFenceError):
        await client.put("resource", "stale", fence=first.fence)
    kv = await client.get("resource")
    assert kv is not None and kv.value == b"b"


async def test_writes_resume_after_kill_9_of_the_leader(
    cluster: ProcessCluster, client: Client
) -> None:
    await client.put("before", "1")
    leader = cluster.leader()
    killed_at = time.monotonic()
    cluster.kill(leader)
    await client.put("after", "2")
    resumed_s = time.monotonic() - killed_at
    print(f"\nkill -9 of the leader -> next write acknowledged: {resumed_s:.2f} s")
    assert (await client.get("before")) is not None
    # The killed member restarts from its own disk and rejoins.
    cluster.start(leader)
    wait_until(lambda: cluster.status(leader), 20, "the restarted member to answer")
    cluster.leader()


async def test_retried_write_after_leader_death_applies_once(
    cluster: ProcessCluster, client: Client
) -> None:
    await client.put("n", "0")
    leader = cluster.leader()
    # Pause the leader so the add reaches it and stays unanswered, then kill it: the client
    # retries the same (session, sequence) at the new leader.
    add = asyncio.create_task(client.add("n", 1))
    await asyncio.sleep(0.05)
    cluster.pause(leader)
    await asyncio.sleep(0.2)
    cluster.kill(leader)
    result = await asyncio.wait_for(add, 30)
    kv = await client.get("n")
    assert kv is not None and int(kv.value) == result.value
    assert result.value == 1


async def test_restarted_member_far_behind_catches_up_by_snapshot(
    cluster: ProcessCluster, client: Client
) -> None:
    leader = cluster.leader()
    lagging = next(i for i in cluster.members if i != leader)
    cluster.kill(lagging)
    for i in range(600):
        await client.put(f"bulk/{i:04d}", "v" * 64)
    cluster.start(lagging)
    leader_status = wait_until(lambda: cluster.status(cluster.leader()), 20, "leader status")

    def caught_up() -> bool:
        status = cluster.status(lagging)
        return status is not None and status.applied_index >= leader_status.applied_index

    wait_until(caught_up, 30, "the lagging member to catch up")
    status = cluster.status(lagging)
    assert status is not None and status.snapshot_index > 0
    assert "snapshot at" in cluster.log_text(lagging) or status.snapshot_index > 0
    # It serves what it caught up on.
    async with Client([cluster.members[lagging].client_address]) as local:
        kv = await local.get("bulk/0599", serializable=True)
        assert kv is not None


async def test_member_add_promote_remove_and_transfer(
    cluster: ProcessCluster, client: Client
) -> None:
    new = cluster.add_member_process()
    members = await client.member_list()
    assert len(members) == 3
    await client.member_add(new.peer_address, new.client_address, as_learner=True)
    cluster.start(new.member_id, join=True, initial=cluster.initial_cluster())
    wait_until(lambda: cluster.status(new.member_id), 20, "the new member to answer")

    def learner_caught_up() -> bool:
        status = cluster.status(new.member_id)
        leader_status = cluster.status(cluster.leader(among=[1, 2, 3]))
        return bool(status and leader_status and status.applied_index >= leader_status.commit_index)

    wait_until(learner_caught_up, 30, "the learner to catch up")
    await promote_when_ready(client, new.member_id)
    members = await client.member_list()
    assert {m.member_id for m in members if not m.is_learner} == {1, 2, 3, new.member_id}
    # Hand leadership to the new member, then remove an old one.
    await client.transfer_leader(new.member_id)
    assert cluster.leader(among=[1, 2, 3, new.member_id]) == new.member_id
    await client.member_remove(1)
    members = await client.member_list()
    assert 1 not in {m.member_id for m in members}
    await client.put("after-membership-changes", "ok")


async def promote_when_ready(client: Client, member_id: int) -> None:
    """Promote a learner, as a user does: the leader judges readiness by its own view of the
    learner (its log against the leader's last entry, which may have moved on since the
    statuses the caller read: one new entry is over 10 % of a short log; whether it still
    abstains), refuses with "try again", and the user tries again."""
    deadline = time.monotonic() + 30
    while True:
        try:
            await client.member_promote(member_id)
            return
        except FailedPreconditionError as error:
            assert "not ready to be promoted" in str(error), error
            assert time.monotonic() < deadline, f"the learner never became ready: {error}"
            await asyncio.sleep(0.2)


def caught_up(cluster: ProcessCluster, member_id: int, among: list[int]) -> bool:
    """``member_id`` applied the commit index of the leader of ``among``."""
    status = cluster.status(member_id)
    leader_status = cluster.status(cluster.leader(among=among))
    return bool(status and leader_status and status.applied_index >= leader_status.commit_index)


async def test_a_member_joining_with_a_partial_initial_cluster_reaches_a_leader_added_since(
    tmp_path: Path,
) -> None:
    """A joining member knows its peers' addresses from --initial-cluster and from the
    membership changes it applied. Joined with only member 1 named (as the documented way
    after losing a majority names the survivor alone) while member 2, added since, leads, it
    cannot answer member 2's probes and so never gets an entry that would tell it where member
    2 is: it asks member 1 (peer_lookup.py). On the code before, it logged "no address is
    known for it" forever and never caught up."""
    with running_cluster(tmp_path, 1) as cluster:
        async with Client(cluster.endpoints, timeout_s=20.0) as client:
            await client.put("before", "x")
            second = cluster.add_member_process()
            await client.member_add(second.peer_address, second.client_address, as_learner=True)
            cluster.start(second.member_id, join=True, initial=cluster.initial_cluster([1]))
            wait_until(lambda: caught_up(cluster, 2, [1]), 30, "member 2 to catch up")
            await promote_when_ready(client, 2)
        async with Client(cluster.endpoints, timeout_s=20.0) as client:
            await client.transfer_leader(2)
            assert cluster.leader(among=[1, 2]) == 2
            third = cluster.add_member_process()
            await client.member_add(third.peer_address, third.client_address, as_learner=True)
            cluster.start(third.member_id, join=True, initial=cluster.initial_cluster([1]))
            wait_until(lambda: caught_up(cluster, 3, [1, 2]), 30, "member 3 to catch up")
            assert "member 2 is at" in cluster.log_text(3)
            await promote_when_ready(client, 3)
            await client.put("after", "y")
            kv = await client.get("before")
            assert kv is not None and kv.value == b"x"


def applied_and_commit(member: MemberProcess) -> tuple[int, int]:
    """A member's applied and commit index, from its /metrics."""
    with urllib.request.urlopen(f"http://{member.metrics_address}/metrics", timeout=5) as page:
        text = page.read().decode()
    (applied,) = re.findall(r"^rallypoint_applied_index (\S+)$", text, re.MULTILINE)
    (commit,) = re.findall(r"^rallypoint_commit_index (\S+)$", text, re.MULTILINE)
    return int(float(applied)), int(float(commit))


async def test_a_membership_change_is_applied_with_no_write_after_it(tmp_path: Path) -> None:
    """A membership change is an entry like any other: once applied, the state is as of its
    index. A linearizable read waits until the state is applied up to its read index (the
    commit index, here the change's own): the state used to stay one entry behind until the
    next write, so a read after a membership change waited for one, or for its read deadline
    (5 s) and the client's retry elsewhere. Nothing is written after either change here."""
    with running_cluster(tmp_path, 3, metrics=True) as cluster:
        async with Client(cluster.endpoints, timeout_s=20.0) as client:
            await client.put("before", "x")
            new = cluster.add_member_process()  # described, never started: a learner only
            for change in ("add", "remove"):
                if change == "add":
                    await client.member_add(new.peer_address, new.client_address)
                else:
                    await client.member_remove(new.member_id)
                for member_id in (1, 2, 3):
                    member = cluster.members[member_id]
                    wait_until(
                        lambda m=member: (lambda a, c: a == c)(*applied_and_commit(m)),
                        10,
                        f"member {member_id}'s state applied up to its commit index ({change})",
                    )
                learners = {m.member_id for m in await client.member_list() if m.is_learner}
                assert (new.member_id in learners) == (change == "add"), learners
            kv = await client.get("before")
            assert kv is not None and kv.value == b"x"


async def test_graceful_stop_hands_over_leadership(cluster: ProcessCluster, client: Client) -> None:
    leader = cluster.leader()
    stopped_at = time.monotonic()
    assert cluster.stop(leader) == 0
    others = [i for i in cluster.members if i != leader]
    new_leader = cluster.leader(among=others)
    print(f"\ngraceful stop -> new leader agreed: {time.monotonic() - stopped_at:.2f} s")
    assert new_leader != leader
    await client.put("after-stop", "ok")
    assert "shutting down" in cluster.log_text(leader)
    assert "stopping without a hand-over" not in cluster.log_text(leader)


def test_a_leader_stopped_after_the_other_members_gives_its_hand_over_up(tmp_path: Path) -> None:
    """The members a stopping leader would hand leadership to are gone (stopped just before
    it, as ``rallypoint cluster up`` stops every member at once on Ctrl-C): the leader stops
    once its stream to the target is lost, saying so, instead of waiting out the hand-over's
    deadline (3 s). Elections take 3 s here, so it still leads when it is stopped."""
    with running_cluster(tmp_path, 3, election_ticks=60) as cluster:
        leader = cluster.leader()
        for member_id in cluster.members:
            if member_id != leader:
                assert cluster.stop(member_id) == 0, member_id
        assert cluster.stop(leader) == 0
        said = cluster.log_text(leader)
        assert "stopping without a hand-over: the stream to member" in said, said[-3000:]
