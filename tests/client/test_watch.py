"""Watch: order, resume across broken streams with no gaps or duplicates, compaction."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from rallypoint.client import Client, CompactedError, EventType, Watcher, WatchEvent

from .fake_server import FakeCluster
from .test_lease import eventually


async def take(watcher: Watcher, count: int, within_s: float = 5.0) -> list[WatchEvent]:
    async def collect() -> list[WatchEvent]:
        events = []
        async for event in watcher:
            events.append(event)
            if len(events) == count:
                break
        return events

    return await asyncio.wait_for(collect(), within_s)


async def test_watch_from_now_sees_later_changes_in_order(client: Client) -> None:
    await client.put("w/before", b"old")
    async with client.watch("w/", prefix=True) as watcher:
        puts = [await client.put(f"w/{i}", str(i)) for i in range(3)]
        deleted = await client.delete("w/", prefix=True)
        events = await take(watcher, 7)
    assert [e.type for e in events] == [EventType.PUT] * 3 + [EventType.DELETE] * 4
    assert [e.revision for e in events[:3]] == [p.kv.mod_revision for p in puts]
    # A prefix delete is one revision.
    assert {e.revision for e in events[3:]} == {deleted.header.revision}
    assert [e.kv.key for e in events[3:]] == [b"w/0", b"w/1", b"w/2", b"w/before"]


async def test_watch_replays_from_a_past_revision(client: Client) -> None:
    first = await client.put("k", b"1")
    await client.put("other", b"x")
    await client.put("k", b"2")
    async with client.watch("k", start_revision=first.header.revision, prev_kv=True) as watcher:
        events = await take(watcher, 2)
    assert [e.kv.value for e in events] == [b"1", b"2"]
    assert events[1].prev_kv is not None and events[1].prev_kv.value == b"1"
    assert events[1].prev_revision == events[0].revision


@pytest.mark.parametrize("cleanly", [False, True])
async def test_resumes_across_broken_streams_without_gaps_or_duplicates(
    cluster: FakeCluster, client: Client, cleanly: bool
) -> None:
    for member in cluster.members:
        member.switches.watch_break_after = 2
        member.switches.watch_break_cleanly = cleanly
    async with client.watch("r/", prefix=True) as watcher:
        reader = asyncio.create_task(take(watcher, 12))
        written = []
        for i in range(12):
            written.append((await client.put(f"r/{i % 4}", str(i))).kv.mod_revision)
            if i % 3 == 0:
                # Let the watcher read (and lose its stream) between some writes.
                await asyncio.sleep(0.01)
        events = await reader
    assert [e.revision for e in events] == written
    assert [e.kv.value for e in events] == [str(i).encode() for i in range(12)]
    assert watcher.streams_opened >= 6


async def test_a_revision_split_into_fragments_is_delivered_whole_once_across_breaks(
    cluster: FakeCluster, client: Client
) -> None:
    """A prefix delete larger than one answer arrives as fragments; a stream that breaks
    between them is resumed from that revision, and no event is lost or delivered twice."""
    for i in range(10):
        await client.put(f"f/{i}", str(i))
    for member in cluster.members:
        member.switches.watch_fragment_events = 3
        member.switches.watch_break_after = 2  # breaks inside the 4-fragment revision
    async with client.watch("f/", prefix=True) as watcher:
        reader = asyncio.create_task(take(watcher, 11))
        deleted = await client.delete("f/", prefix=True)
        after = await client.put("f/after", b"x")
        # While the streams break at the second fragment, the revision never completes.
        await eventually(lambda: watcher.streams_opened >= 3, "the watch to reconnect")
        assert watcher.delivered_next == deleted.header.revision
        for member in cluster.members:
            member.switches.watch_break_after = None
        events = await reader
    assert [e.kv.key for e in events[:10]] == sorted(f"f/{i}".encode() for i in range(10))
    assert {e.revision for e in events[:10]} == {deleted.header.revision}
    assert events[10].revision == after.kv.mod_revision


async def test_resumes_at_the_leader_after_a_refusal(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    follower, leader, _ = cluster.members
    client = await make_client([follower.address, leader.address]).connect()
    async with client.watch("k") as watcher:
        await client.put("k", b"1")
        first = await take(watcher, 1)
        follower.switches.not_leader = leader.address
        follower.switches.watch_break_after = 0
        await client.put("k", b"2")
        second = await take(watcher, 1)
    assert [e.kv.value for e in first + second] == [b"1", b"2"]


async def test_compacted_start_raises_with_the_oldest_revision(
    cluster: FakeCluster, client: Client
) -> None:
    for i in range(5):
        await client.put("k", str(i))
    cluster.store.compact(below_revision=cluster.store.revision - 1)
    async with client.watch("k", start_revision=1) as watcher:
        with pytest.raises(CompactedError) as raised:
            await take(watcher, 1)
    assert raised.value.compact_revision == cluster.store.revision - 1
    assert "re-read the state" in str(raised.value)


async def test_progress_keeps_an_idle_watcher_ahead_of_compaction(
    cluster: FakeCluster, client: Client
) -> None:
    async with client.watch("quiet", progress_interval_s=0.05) as watcher:
        reader = asyncio.create_task(take(watcher, 1))
        for i in range(5):
            await client.put("noisy", str(i))
        noisy_revision = cluster.store.revision
        await eventually(lambda: watcher.next_revision > noisy_revision, "a progress mark")
        # History the watcher no longer needs goes away, then its stream breaks: it resumes
        # past the compacted revisions instead of failing.
        cluster.store.compact(below_revision=noisy_revision + 1)
        opened = watcher.streams_opened
        await cluster.store.break_watches()
        await eventually(lambda: watcher.streams_opened > opened, "the watch to reconnect")
        await client.put("quiet", b"finally")
        events = await reader
    assert [e.kv.value for e in events] == [b"finally"]


async def test_close_ends_the_iteration(client: Client) -> None:
    watcher = client.watch("k")
    reader = asyncio.create_task(take(watcher, 1))
    await client.put("warmup", b"x")
    await eventually(lambda: watcher.streams_opened == 1, "the stream to open")
    await watcher.aclose()
    assert await reader == []
