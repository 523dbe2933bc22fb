"""The Ready loop's order (coordinator/node/driver.py): committed entries already durable apply
before the Ready that announced their commit is written, so a caller's answer never waits
for the write of a commit index."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from rallypoint.coordinator.state.commands import Put
from rallypoint.coordinator.state.results import PutResult
from rallypoint.raft.storage.disk_storage import PersistRequest

from .test_node import Cluster, open_session, wait_applied
from .test_node import cluster as cluster  # the fixture


async def test_an_answer_does_not_wait_for_the_write_of_its_commit_index(
    cluster: Cluster,
) -> None:
    leader = await cluster.leader()
    session = await open_session(leader)
    first = await leader.propose(Put(b"a", b"1"), session_id=session, sequence=1)
    assert isinstance(first, PutResult)
    await wait_applied(list(cluster.nodes.values()), first.kv.mod_revision)
    storage = leader.storage
    assert storage is not None
    write_batch = storage.write_batch
    released = threading.Event()
    held: list[int] = []

    def hold_commit_only_writes(batch: Sequence[PersistRequest]) -> None:
        # On the disk thread: a write carrying no entries (a commit index, say) waits.
        if not any(request.entries for request in batch):
            held.append(int(batch[-1].hard_state.commit))
            released.wait(30)
        write_batch(batch)

    storage.write_batch = hold_commit_only_writes  # type: ignore[method-assign]
    try:
        # On a busy machine the commit index may go to disk with the next entries instead of
        # on its own (nothing held then, and the disk thread not blocked): propose again.
        for sequence in range(2, 8):
            result = await asyncio.wait_for(
                leader.propose(Put(b"b", b"2"), session_id=session, sequence=sequence), 20
            )
            assert isinstance(result, PutResult)
            for _ in range(100):  # the Ready loop writes the commit index after applying
                if held:
                    break
                await asyncio.sleep(0.02)
            if held:
                break
        # Answered while the write of the commit index that announced it was still held.
        assert not released.is_set()
        assert held, "no write of a commit index alone was ever made"
        assert max(held) >= result.kv.mod_revision
    finally:
        released.set()
        storage.write_batch = write_batch  # type: ignore[method-assign]
