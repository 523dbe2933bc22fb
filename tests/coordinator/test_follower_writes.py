"""Where a Ready's write runs (coordinator/node/disk.py): a follower's loop writes its small
batches itself instead of waking the disk thread for each; the leader's writes, large
batches, writes while the disk thread is busy and the write after a slow one still go to
the disk thread; an entry is acknowledged only once written and fsynced, either way."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rallypoint.coordinator.node import disk
from rallypoint.coordinator.node.disk import DiskThread, DiskWrites
from rallypoint.coordinator.peerwire import transport as transport_module
from rallypoint.coordinator.state.commands import Put
from rallypoint.raft.storage.disk_storage import PersistRequest
from rallypoint.raft.types import Entry, HardState, Index, MessageType, Term

from .test_node import Cluster, put_in_turn, settled, wait_applied
from .test_node import cluster as cluster  # the fixture


async def test_followers_write_a_puts_entry_without_handing_it_to_the_disk_thread(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loaded machine's slow fsync would send a few writes to the disk thread (by design);
    # this test is about the hand-off per write, not about the bound.
    monkeypatch.setattr(disk, "INLINE_MAX_SECONDS", 10.0)
    leader, session, nodes = await settled(cluster)
    handed: dict[int, int] = {node.member_id: 0 for node in nodes}
    for node in nodes:
        submit = node._disk.submit

        def counted(*args: Any, submit: Any = submit, member: int = node.member_id) -> Any:
            handed[member] += 1
            return submit(*args)

        node._disk.submit = counted  # type: ignore[method-assign]
    puts = 20
    for seq in range(1, puts + 1):
        await leader.propose(Put(b"k%03d" % seq, b"v"), session_id=session, sequence=seq)
    await wait_applied(nodes, leader.state.applied_index)
    # Before, each follower handed each put's entry to its disk thread (20 hand-offs or
    # more); the leader still does.
    assert handed[leader.member_id] >= puts, handed
    for node in nodes:
        if node is not leader:
            assert handed[node.member_id] <= 2, handed
    assert all(n.state.get(b"k020") is not None for n in nodes)


class FakeStorage:
    """Records the thread each write ran on; ``block`` holds a write until it is set."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.threads: list[str] = []
        self.block: threading.Event | None = None

    def write_batch(self, batch: list[PersistRequest]) -> None:
        if self.block is not None:
            self.block.wait(5)
        time.sleep(self.seconds)
        self.threads.append(threading.current_thread().name)


LOOP = threading.current_thread().name  # pytest's: the tests' event loop runs on it


@pytest.fixture
def threads() -> Iterator[tuple[DiskThread, DiskWrites]]:
    pool = DiskThread()
    yield pool, DiskWrites(pool)
    pool.shutdown()


def request(size: int = 10) -> PersistRequest:
    entry = Entry(term=Term(1), index=Index(1), data=b"x" * size)
    return PersistRequest(HardState(term=Term(1), vote=0, commit=Index(0)), (entry,))


async def test_only_a_followers_small_write_runs_on_the_loop_while_the_disk_thread_idles(
    threads: tuple[DiskThread, DiskWrites], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The write queued behind another is slow by its wait; the bound is tested below.
    monkeypatch.setattr(disk, "INLINE_MAX_SECONDS", 10.0)
    pool, writes = threads
    storage: Any = FakeStorage()
    await writes.write(storage, request(), follower=True)
    await writes.write(storage, request(), follower=False)  # a leader's
    await writes.write(storage, request(disk.INLINE_MAX_BYTES + 1), follower=True)
    assert storage.threads[0] == LOOP
    assert all(t.startswith("rp-disk") for t in storage.threads[1:]), storage.threads
    # Something else queued on the disk thread (a snapshot, a log release): the write waits
    # behind it there rather than touching the files beside it.
    other: Any = FakeStorage()
    other.block = threading.Event()
    busy = asyncio.get_running_loop().run_in_executor(pool, other.write_batch, [])
    assert not pool.idle
    follower_write = asyncio.ensure_future(writes.write(storage, request(), follower=True))
    await asyncio.sleep(0.05)
    assert len(storage.threads) == 3  # not written yet: behind the other write
    other.block.set()
    await asyncio.gather(busy, follower_write)
    assert storage.threads[3].startswith("rp-disk"), storage.threads
    assert pool.idle
    await writes.write(storage, request(), follower=True)
    assert storage.threads[4] == LOOP
    assert writes.inline == 2


async def test_a_job_cancelled_before_the_disk_thread_took_it_leaves_the_thread_idle(
    threads: tuple[DiskThread, DiskWrites],
) -> None:
    pool = threads[0]
    blocker: Any = FakeStorage()
    blocker.block = threading.Event()
    running = pool.submit(blocker.write_batch, [])
    queued = pool.submit(blocker.write_batch, [])
    assert queued.cancel()
    assert not pool.idle  # the first still runs
    blocker.block.set()
    # Its done callbacks run in the order added: the count's before this await's.
    await asyncio.wait_for(asyncio.wrap_future(running), 5)
    assert pool.idle, (pool.submitted, pool.finished)
    assert blocker.threads == ["rp-disk_0"]


async def test_after_a_slow_write_the_next_goes_to_the_disk_thread_until_one_is_quick(
    threads: tuple[DiskThread, DiskWrites], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk, "INLINE_MAX_SECONDS", 0.01)
    writes = threads[1]
    storage: Any = FakeStorage(seconds=0.05)
    await writes.write(storage, request(), follower=True)  # on the loop: slow
    await writes.write(storage, request(), follower=True)  # to the thread, still slow
    storage.seconds = 0.0
    await writes.write(storage, request(), follower=True)  # to the thread: quick
    await writes.write(storage, request(), follower=True)  # back on the loop
    assert storage.threads[0] == LOOP
    assert storage.threads[1].startswith("rp-disk") and storage.threads[2].startswith("rp-disk")
    assert storage.threads[3] == LOOP


async def test_a_follower_acks_an_entry_only_after_its_write_returned(
    cluster: Cluster,
) -> None:
    leader, session, nodes = await settled(cluster)
    follower = next(n for n in nodes if n is not leader)
    assert follower.storage is not None
    written = [int(follower.storage.last_index())]
    acked_unwritten: list[int] = []
    write_batch = follower.storage.write_batch

    def recorded(batch: list[PersistRequest]) -> None:
        write_batch(batch)
        written.extend(int(e.index) for r in batch for e in r.entries)

    follower.storage.write_batch = recorded  # type: ignore[method-assign]
    send = follower._transport.send

    def checked(messages: Any) -> None:
        for m in messages:
            acked = m.type is MessageType.MsgAppResp and not m.reject
            if acked and int(m.index) > max(written):
                acked_unwritten.append(int(m.index))
        send(messages)

    follower._transport.send = checked  # type: ignore[method-assign]
    for seq in range(1, 11):
        await leader.propose(Put(b"a%03d" % seq, b"v"), session_id=session, sequence=seq)
    await wait_applied(nodes, leader.state.applied_index)
    assert len(written) > 10, "the follower wrote nothing"
    assert not acked_unwritten, acked_unwritten


async def test_an_idle_follower_acks_an_append_before_applying_what_its_notice_commits(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Puts one after another, each commit notice carried by the next put's append: a
    follower nobody waits on writes and acknowledges the new entry, then applies the one the
    notice committed (``upkeep.applied_first``). Before, it applied first, and each ack left
    with everything the follower knew committed already applied."""
    leader, session, nodes = await settled(cluster)
    monkeypatch.setattr(transport_module, "COMMIT_NOTICE_HOLD_S", 60.0)
    follower = next(n for n in nodes if n is not leader)
    # At each ack of an append: (the follower's applied index, the commit index it knows).
    at_ack: list[tuple[int, int]] = []
    send = follower._transport.send

    def recorded(messages: Any) -> None:
        for m in messages:
            if m.type is MessageType.MsgAppResp and not m.reject:
                at_ack.append((follower.state.applied_index, int(follower._commit_index)))
        send(messages)

    follower._transport.send = recorded  # type: ignore[method-assign]
    puts = 10
    await put_in_turn(leader, session, nodes, b"o", puts)
    behind = [(applied, commit) for applied, commit in at_ack if applied < commit]
    # (a notice a heartbeat carried instead is applied before the next ack: allow a few)
    assert len(behind) >= puts // 2, at_ack
    # Applied all the same, in order, once committed.
    assert follower.state.get(b"o010") is not None
