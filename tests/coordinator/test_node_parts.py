"""The member's parts on their own: waiters and proposal ids, and the ReadIndex batcher."""

from __future__ import annotations

import asyncio
import gc

import pytest

from rallypoint.coordinator.node.api import ProposalDroppedError, ProposalTimeoutError
from rallypoint.coordinator.node.proposals import ProposalIds, Waiters, unwrap, wrap
from rallypoint.coordinator.node.reads import ReadIndexBatcher
from rallypoint.raft import ProposalDroppedError as RaftProposalDroppedError
from rallypoint.raft.types import Index, ReadState
from tests.coordinator.timeout_scopes import TimeoutScopes


def test_proposal_ids_of_different_boots_never_meet() -> None:
    first_boot = ProposalIds(boots=1)
    second_boot = ProposalIds(boots=2)
    ids = {first_boot.next() for _ in range(1000)}
    assert len(ids) == 1000
    assert ids.isdisjoint(second_boot.next() for _ in range(1000))
    assert unwrap(wrap(3, first_boot.next(), b"payload"))[2] == b"payload"


def test_proposal_ids_of_two_incarnations_never_meet() -> None:
    """A member that lost its data directory counts its boots from the start again; its new
    life's ids must not be its first life's, whose entries it replays from the log."""
    first_life = ProposalIds(boots=1, incarnation=0x5F3A_91C2_0000_0001)
    after_a_wipe = ProposalIds(boots=1, incarnation=0x1B77_04E9_0000_0003)
    ids = {first_life.next() for _ in range(1000)}
    assert ids.isdisjoint(after_a_wipe.next() for _ in range(1000))


async def test_an_entry_of_an_earlier_life_does_not_answer_a_waiter_with_its_id() -> None:
    """Under the wipe nemesis a put was answered with the result of another request that an
    earlier life of its member had proposed under the same id."""
    waiters = Waiters()
    ours = wrap(2, 7, b"put mine")
    wait = asyncio.ensure_future(waiters.register(7, lambda: None, 5.0, lambda: None, ours))
    await asyncio.sleep(0)
    assert waiters.trigger(7, "someone else's", wrap(2, 7, b"an earlier life's grant")) is False
    assert not wait.done() and len(waiters) == 1
    assert waiters.trigger(7, "mine", bytes(ours)) is True
    assert await wait == "mine"
    assert len(waiters) == 0


async def test_a_waiter_is_answered_by_its_applied_entry_and_then_forgotten() -> None:
    waiters = Waiters()
    submitted: list[int] = []
    wait = asyncio.ensure_future(
        waiters.register(7, lambda: submitted.append(7), 5.0, lambda: None)
    )
    await asyncio.sleep(0)
    assert submitted == [7] and len(waiters) == 1
    waiters.trigger(8, "someone else's")  # no waiter: nothing happens
    waiters.trigger(7, "result")
    assert await wait == "result"
    assert len(waiters) == 0


async def test_a_dropped_or_timed_out_proposal_leaves_no_waiter() -> None:
    waiters = Waiters()

    def refuse() -> None:
        raise RaftProposalDroppedError("no leader")

    with pytest.raises(ProposalDroppedError):
        await waiters.register(1, refuse, 5.0, lambda: None)
    with pytest.raises(ProposalTimeoutError):
        await waiters.register(2, lambda: None, 0.01, lambda: None)
    assert len(waiters) == 0
    pending = asyncio.ensure_future(waiters.register(3, lambda: None, 5.0, lambda: None))
    await asyncio.sleep(0)
    waiters.fail_all(RuntimeError("stopping"))
    with pytest.raises(RuntimeError, match="stopping"):
        await pending


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def batcher() -> tuple[ReadIndexBatcher, list[bytes], FakeClock]:
    asked: list[bytes] = []
    clock = FakeClock()
    return ReadIndexBatcher(asked.append, lambda: None, clock), asked, clock


async def test_reads_arriving_during_a_request_wait_for_the_next_one() -> None:
    reads, asked, _ = batcher()
    first = reads.enqueue()
    assert len(asked) == 1
    second, third = reads.enqueue(), reads.enqueue()
    assert len(asked) == 1  # one request in flight at a time
    reads.on_read_state(ReadState(Index(5), asked[0]), applied_index=5)
    assert first.done() and not second.done()
    assert len(asked) == 2  # the next request covers both reads that waited
    reads.on_read_state(ReadState(Index(7), asked[1]), applied_index=6)
    assert not second.done()  # confirmed, but index 7 is not applied yet
    reads.on_applied(7)
    assert second.done() and third.done()


async def test_a_lost_request_is_asked_again_and_a_stale_answer_ignored() -> None:
    reads, asked, clock = batcher()
    read = reads.enqueue()
    clock.now_s = 0.5
    reads.retry_if_lost(1.0, leader_known=True)
    assert len(asked) == 1
    clock.now_s = 1.5
    reads.retry_if_lost(1.0, leader_known=True)
    assert len(asked) == 2 and asked[0] != asked[1]
    reads.on_read_state(ReadState(Index(3), asked[0]), applied_index=3)
    assert not read.done()  # the answer to the request given up on
    reads.on_read_state(ReadState(Index(3), asked[1]), applied_index=3)
    assert read.done()


async def test_on_a_leader_change_reads_are_asked_again_or_failed() -> None:
    reads, asked, _ = batcher()
    in_flight = reads.enqueue()
    queued = reads.enqueue()
    reads.requeue(leader_known=False)  # no leader: nothing to ask
    assert len(asked) == 1
    reads.fail_queued(RuntimeError("no leader"), keep=False)
    assert isinstance(in_flight.exception(), RuntimeError)
    assert isinstance(queued.exception(), RuntimeError)
    kept = reads.enqueue()
    reads.requeue(leader_known=True)
    reads.fail_queued(RuntimeError("new leader"), keep=True)
    assert not kept.done()
    reads.on_read_state(ReadState(Index(1), asked[-1]), applied_index=1)
    assert kept.done() and kept.exception() is None


async def test_a_read_whose_caller_gave_up_fails_quietly_at_shutdown() -> None:
    # read_barrier waits on a shield of the read: a caller past its deadline leaves the read
    # queued, and stopping the member failed it with nobody to see it ("Future exception
    # was never retrieved ... NodeError('this member is shutting down')" at exit).
    loop = asyncio.get_running_loop()
    logged: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: logged.append(context))
    try:
        reads, _, _ = batcher()
        reads.enqueue()  # in flight
        read = reads.enqueue()  # queued behind it
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0):
                await asyncio.shield(read)
        reads.fail_queued(RuntimeError("this member is shutting down"), keep=False)
        assert read.done()
        del read, reads
        gc.collect()
    finally:
        loop.set_exception_handler(None)
    assert logged == []


async def test_a_proposal_waits_under_a_timer_not_a_timeout_scope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deadline of a proposal is a timer on its future: no ``asyncio.timeout`` scope per
    proposal (one a put on a busy leader before), and the same endings: answered, timed out,
    or the caller cancelled, each leaving no waiter."""
    scopes = TimeoutScopes(monkeypatch)
    waiters = Waiters()
    wait = asyncio.ensure_future(waiters.register(1, lambda: None, 5.0, lambda: None))
    await asyncio.sleep(0)
    waiters.trigger(1, "result")
    assert await wait == "result"
    with pytest.raises(ProposalTimeoutError, match=r"not applied within 0\.0s"):
        await waiters.register(2, lambda: None, 0.01, lambda: None)

    async def caller() -> object:
        return await waiters.register(3, lambda: None, 5.0, lambda: None)

    cancelled = asyncio.ensure_future(caller())
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert len(waiters) == 0
    assert scopes.count == 0


async def test_only_an_applied_proposal_is_observed() -> None:
    """``rallypoint_proposal_seconds`` is from proposing to applying: a proposal that timed
    out, failed or was given up on is not observed."""
    waiters = Waiters()
    observed: list[float] = []
    applied = waiters.register(1, lambda: None, 5.0, lambda: None, observe=observed.append)
    waiters.trigger(1, "result")
    assert await applied == "result"
    with pytest.raises(ProposalTimeoutError):
        await waiters.register(2, lambda: None, 0.01, lambda: None, observe=observed.append)
    failed = waiters.register(3, lambda: None, 5.0, lambda: None, observe=observed.append)
    waiters.fail(3, RuntimeError("lost"))
    with pytest.raises(RuntimeError):
        await failed
    given_up = waiters.register(4, lambda: None, 5.0, lambda: None, observe=observed.append)
    given_up.cancel()
    await asyncio.sleep(0)
    assert len(observed) == 1 and len(waiters) == 0
