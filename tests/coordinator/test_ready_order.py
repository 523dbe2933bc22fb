"""The Ready loop's order (coordinator/node/driver.py): committed entries already durable apply
before the Ready that announced their commit is persisted, and a Ready that moves only the
commit index is never handed to the disk thread: the index goes to the WAL with the next
entries (``upkeep.disk_request``), so neither a caller's answer nor a follower's ack of a
commit notice waits for a disk-thread hop."""

from __future__ import annotations

from collections.abc import Sequence

from rallypoint.coordinator.state.commands import Put
from rallypoint.coordinator.state.results import PutResult
from rallypoint.raft.storage.disk_storage import PersistRequest

from .test_node import Cluster, open_session, wait_applied
from .test_node import cluster as cluster  # the fixture


async def test_a_commit_index_alone_is_never_handed_to_the_disk_thread(
    cluster: Cluster,
) -> None:
    leader = await cluster.leader()
    session = await open_session(leader)
    first = await leader.propose(Put(b"a", b"1"), session_id=session, sequence=1)
    assert isinstance(first, PutResult)
    nodes = list(cluster.nodes.values())
    await wait_applied(nodes, first.kv.mod_revision)
    writes: list[tuple[int, PersistRequest]] = []  # appended on the disk threads
    originals = {}
    for node in nodes:
        storage = node.storage
        assert storage is not None
        originals[node.member_id] = storage.write_batch

        def recorded(
            batch: Sequence[PersistRequest],
            write: object = storage.write_batch,
            member: int = node.member_id,
        ) -> None:
            writes.extend((member, request) for request in batch)
            write(batch)  # type: ignore[operator]

        storage.write_batch = recorded  # type: ignore[method-assign]
    revisions = [first.kv.mod_revision]
    try:
        for sequence in range(2, 8):
            result = await leader.propose(Put(b"b", b"2"), session_id=session, sequence=sequence)
            assert isinstance(result, PutResult)
            revisions.append(result.kv.mod_revision)
        await wait_applied(nodes, revisions[-1])
    finally:
        for node in nodes:
            assert node.storage is not None
            node.storage.write_batch = originals[node.member_id]  # type: ignore[method-assign]
    assert {member for member, _ in writes} == set(cluster.nodes)
    # (A new term or vote is written on its own, fsynced: an election on a busy machine.)
    commit_only = [
        (member, request)
        for member, request in writes
        if not request.entries and request.snapshot.is_empty() and not request.must_sync
    ]
    assert not commit_only, commit_only
    # Each put was answered, so committed, before the next was proposed: the leader's write
    # of the next put's entry carries the commit index of the one before.
    carried = 0
    for member, request in writes:
        if member == leader.member_id and request.entries:
            index = request.entries[0].index
            if index - 1 in revisions:
                assert request.hard_state.commit >= index - 1, request
                carried += 1
    assert carried, writes
    # Every member holds the last commit index (in memory until its next write).
    for node in nodes:
        assert node.storage is not None
        assert node.storage.hard_state.commit >= revisions[-1]
