"""Proposals made together reach the Raft core together (coordinator/node/proposals.py,
``Proposals``): the callers of one loop turn are one MsgProp of many entries, so a follower
gets them in one append instead of one MsgApp each; every caller still gets its own result,
and a batch the core refuses fails each of its callers with ProposalDroppedError."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rallypoint.coordinator.node.api import ProposalDroppedError
from rallypoint.coordinator.node.proposals import MAX_ENTRIES_PER_PROPOSAL, Proposals, Waiters
from rallypoint.coordinator.service.kv_batch import BatchServer
from rallypoint.coordinator.state.commands import Put
from rallypoint.coordinator.state.results import PutResult
from rallypoint.proto.v1 import common_pb2, kv_pb2
from rallypoint.raft import ProposalDroppedError as RaftProposalDroppedError
from rallypoint.raft.types import Message, MessageType

from .test_node import Cluster, open_session
from .test_node import cluster as cluster  # the fixture

WRITES = 32


async def test_concurrent_proposals_reach_a_follower_in_one_append(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader = await cluster.leader()
    session = await open_session(leader)
    follower = next(node for node in cluster.nodes.values() if node is not leader)
    appended: list[int] = []
    raw = follower.raw
    step = type(raw).step

    def recording(self: Any, message: Message) -> None:
        if self is raw and message.type is MessageType.MsgApp and message.entries:
            appended.append(len(message.entries))
        step(self, message)

    monkeypatch.setattr(type(raw), "step", recording)
    results = await asyncio.gather(
        *(
            leader.propose(Put(b"k%d" % i, b"v%d" % i), session_id=session, sequence=i + 1)
            for i in range(WRITES)
        )
    )
    assert all(isinstance(result, PutResult) for result in results)
    # Each caller its own result, in the order they proposed.
    revisions = [result.kv.mod_revision for result in results if isinstance(result, PutResult)]
    assert revisions == sorted(revisions) and len(set(revisions)) == WRITES
    for _ in range(200):
        if sum(appended) >= WRITES:
            break
        await asyncio.sleep(0.01)
    # One MsgApp carried all of them (one per write before).
    # The cluster's own entries (its version, proposed as it starts) may ride in the same
    # append.
    assert max(appended, default=0) >= WRITES, appended


async def test_a_refused_batch_fails_each_of_its_callers_and_batches_are_bounded() -> None:
    waiters = Waiters()
    proposals = Proposals(waiters)
    calls: list[int] = []

    def propose(datas: Any) -> None:
        calls.append(len(datas))
        if len(calls) == 2:
            raise RaftProposalDroppedError("no leader at term 3")

    count = MAX_ENTRIES_PER_PROPOSAL + 2
    waiting = [
        waiters.register(i, lambda i=i: proposals.queue(i, b"x"), timeout_s=5.0, wake=lambda: None)
        for i in range(count)
    ]
    await asyncio.sleep(0)
    assert len(proposals) == count
    proposals.submit(propose)
    assert calls == [MAX_ENTRIES_PER_PROPOSAL, 2] and len(proposals) == 0
    # The first batch is in the core (its callers wait for their entries to apply); the
    # refused one's callers fail at once.
    for task in waiting[-2:]:
        with pytest.raises(ProposalDroppedError, match="no leader at term 3"):
            await task
    assert not any(task.done() for task in waiting[:-2])
    for i in range(MAX_ENTRIES_PER_PROPOSAL):
        waiters.trigger(i, i)
    assert await asyncio.gather(*waiting[:-2]) == list(range(MAX_ENTRIES_PER_PROPOSAL))


async def test_an_entry_bound_to_a_term_is_proposed_only_by_that_term_s_leader() -> None:
    """A round-store write checked by the leader of a term (service/store_cache.py) is
    appended by that leader or not at all: never forwarded by a member that meanwhile
    became a follower, nor appended by it in a later term."""
    waiters = Waiters()
    proposals = Proposals(waiters)
    proposed: list[list[bytes]] = []

    def wait(i: int, data: bytes, term: int | None) -> asyncio.Future[Any]:
        return waiters.register(
            i, lambda: proposals.queue(i, data, term), timeout_s=5.0, wake=lambda: None
        )

    for leader_term, kept in ((None, [b"free"]), (8, [b"free"]), (7, [b"free", b"bound"])):
        free, bound = wait(1, b"free", None), wait(2, b"bound", 7)
        await asyncio.sleep(0)
        proposals.submit(lambda datas: proposed.append(list(datas)), leader_term)
        assert proposed.pop() == kept
        if b"bound" not in kept:
            with pytest.raises(ProposalDroppedError, match="term 7"):
                await bound
        for i in (1, 2):
            waiters.trigger(i, "applied")
        await asyncio.gather(free, bound, return_exceptions=True)


class _NoDeadline:
    """The part of a gRPC context the batch server reads: no client deadline."""

    def time_remaining(self) -> None:
        return None


async def test_a_batch_messages_writes_are_proposed_together_with_no_task_each(
    cluster: Cluster,
) -> None:
    """A KV/Batch message of 32 puts served by the leader: the puts reach the core as one
    proposal, each is answered with its own result, and serving them starts no task per
    put (the proposals' futures are awaited from the message's own task). Before, each put
    ran in a task of its own (``asyncio.gather``): 32 tasks."""
    leader = await cluster.leader()
    session = await open_session(leader)
    loop = asyncio.get_running_loop()
    created: list[Any] = []
    factory = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        created.append(coro)
        if factory is not None:
            return factory(loop, coro, **kwargs)
        return asyncio.Task(coro, loop=loop, **kwargs)

    proposed: list[int] = []
    propose_many = leader.raw.propose_many

    def recorded(entries: Any) -> None:
        proposed.append(len(entries))
        propose_many(entries)

    leader.raw.propose_many = recorded  # type: ignore[method-assign]
    server = BatchServer(leader, _NoDeadline())  # type: ignore[arg-type]
    message = kv_pb2.BatchRequest(
        operations=[
            kv_pb2.BatchOperation(
                id=n,
                put=kv_pb2.PutRequest(
                    key=b"t%03d" % n,
                    value=b"v",
                    header=common_pb2.RequestHeader(session_id=session, sequence=n),
                ),
            )
            for n in range(1, WRITES + 1)
        ]
    )
    loop.set_task_factory(counting)
    try:
        await server.serve(message)
    finally:
        loop.set_task_factory(factory)
    results = [r for response in drained(server.answers) for r in response.results]
    assert sorted(r.id for r in results) == list(range(1, WRITES + 1))
    assert all(r.WhichOneof("result") == "put" for r in results), results
    # One proposal carried them all (the leader may propose its own entries beside them).
    assert any(count >= WRITES for count in proposed), proposed
    # The members' own background work (snapshots, timers) may start tasks meanwhile.
    serving = [c for c in created if "service" in getattr(c, "cr_code", c).co_filename]
    assert not serving, serving


def drained(queue: asyncio.Queue[Any]) -> list[Any]:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items
