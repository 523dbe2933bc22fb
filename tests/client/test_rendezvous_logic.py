"""The participant's decisions without a server: reconnect backoff, error refinement, and how
a stream of RoundInfos (from the watch, the heartbeat's refresh, in any order) becomes its
view, its round-change notifications, ``wait_for_round`` and ``lost``. Everything the daemon
does is tested with real processes in tests/integration/test_rendezvous.py."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from rallypoint.client import (
    Backoff,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    JobConfig,
    NameTakenError,
    NotFoundError,
    Participant,
    ParticipantLostError,
    RoundInfo,
    RoundMember,
    RoundState,
    StaleRoundError,
    UnavailableError,
    process_heartbeats,
    rendezvous,
)
from rallypoint.client.caller import Caller
from rallypoint.client.heartbeats import Assignment
from rallypoint.client.process_heartbeats import ProcessHeartbeats
from rallypoint.client.rendezvous import reconnect_backoff, round_position
from rallypoint.client.rendezvous_errors import refine
from rallypoint.client.rendezvous_values import JoinResult
from rallypoint.client.transport import Transport

ME = 7
OTHER = 9


def member(pid: int, rank: int = -1) -> RoundMember:
    return RoundMember(pid, f"w{pid}", rank, b"", 0.0)


def info(
    revision: int,
    round_number: int,
    state: RoundState,
    members: tuple[int, ...] = (ME, OTHER),
    waiting: tuple[int, ...] = (),
) -> RoundInfo:
    active = state is RoundState.ACTIVE
    return RoundInfo(
        job="job",
        round=round_number,
        state=state,
        members=tuple(member(pid, rank if active else -1) for rank, pid in enumerate(members)),
        world_size=len(members) if active else 0,
        fencing_token=revision if active else 0,
        store_namespace=f"job/{round_number}",
        reason="",
        waiting=tuple(member(pid) for pid in waiting),
        opened_ms=0,
        closed_ms=0,
        job_closed=False,
        job_revision=revision,
    )


@pytest.fixture
async def participant() -> AsyncIterator[Participant]:
    # Never connected and never started: only the view logic runs.
    caller = Caller(
        Transport(["127.0.0.1:1"]), timeout_s=1.0, session_ttl_s=30.0, max_inflight_writes=1
    )
    joined = JoinResult(ME, False, info(1, 1, RoundState.JOINING))
    yield Participant(caller, "w7", joined, JobConfig(2, 2))
    await caller.close()


# ---------------------------------------------------------------------------- reconnects


def test_heartbeat_backoff_is_capped_at_two_intervals() -> None:
    client_backoff = Backoff(base_s=0.05, cap_s=2.0)
    assert reconnect_backoff(0.1, client_backoff) == Backoff(base_s=0.05, cap_s=0.2)
    # A slow heartbeat keeps the client's own cap.
    assert reconnect_backoff(5.0, client_backoff) == client_backoff
    # An interval shorter than the client's base lowers the base too.
    fast = reconnect_backoff(0.01, client_backoff)
    assert fast.cap_s == pytest.approx(0.02) and fast.base_s <= fast.cap_s


# ---------------------------------------------------------------------------- errors


def test_rendezvous_reasons_are_refined_into_typed_errors() -> None:
    stale = refine(FailedPreconditionError("round 1 is stale", reason="STALE_ROUND"))
    assert isinstance(stale, StaleRoundError) and isinstance(stale, FailedPreconditionError)
    assert str(stale) == "round 1 is stale [STALE_ROUND]"
    taken = refine(InternalError("name w0 taken (status ALREADY_EXISTS)", reason="NAME_TAKEN"))
    assert isinstance(taken, NameTakenError) and taken.server_message == "name w0 taken"
    # A reason under a code the contract does not pair it with is left as the code says.
    odd = NotFoundError("?", reason="STALE_ROUND")
    assert refine(odd) is odd
    plain = FailedPreconditionError("no reason")
    assert refine(plain) is plain


# ---------------------------------------------------------------------------- the view


def test_round_positions_order_rounds_then_states() -> None:
    assert round_position(1, RoundState.ACTIVE) > round_position(1, RoundState.JOINING)
    assert round_position(1, RoundState.ENDED) > round_position(1, RoundState.ACTIVE)
    assert round_position(2, RoundState.JOINING) > round_position(1, RoundState.ENDED)


async def test_view_never_goes_back_and_each_round_change_is_told_once(
    participant: Participant,
) -> None:
    told: list[tuple[int, RoundState]] = []
    participant.on_round_change(lambda r: told.append((r.round, r.state)))
    rounds = participant.rounds()
    assert (await anext(rounds)).round == 1
    active = info(3, 1, RoundState.ACTIVE)
    assert participant._observe(active)
    # The same state again (the watch and a refresh both saw it), and an older one.
    assert not participant._observe(active)
    assert not participant._observe(info(2, 1, RoundState.JOINING))
    assert participant.round == active and participant.rank == 0
    # A newer revision of the same (round, state): the view moves, nobody is told.
    assert participant._observe(info(4, 1, RoundState.ACTIVE, waiting=(11,)))
    participant._observe(info(6, 2, RoundState.JOINING))
    await asyncio.sleep(0)  # callbacks run on the loop
    assert [((await anext(rounds)).round, r) for r in (1, 2)] == [(1, 1), (2, 2)]
    assert told == [(1, RoundState.ACTIVE), (2, RoundState.JOINING)]


async def test_wait_for_round_returns_each_active_round_with_me_once(
    participant: Participant, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiter = asyncio.create_task(participant.wait_for_round(timeout_s=5))
    await asyncio.sleep(0)
    participant._observe(info(2, 1, RoundState.ACTIVE, members=(OTHER, ME)))
    first = await waiter
    assert (first.round, first.rank_of(ME)) == (1, 1)
    # Round 1 was returned: the next call waits for round 2, whatever happens in between.
    waiter = asyncio.create_task(participant.wait_for_round(timeout_s=5))
    participant._observe(info(3, 2, RoundState.JOINING, members=(ME,)))
    await asyncio.sleep(0)
    assert not waiter.done()
    participant._observe(info(4, 2, RoundState.ACTIVE, members=(ME,)))
    assert (await waiter).rank_of(ME) == 0

    async def get_job(caller: Caller, job: str, **options: object) -> SimpleNamespace:
        return SimpleNamespace(round=participant.round)

    monkeypatch.setattr(rendezvous, "get_job", get_job)  # no server: the round as it is
    with pytest.raises(DeadlineExceededError, match="no ACTIVE round"):
        await participant.wait_for_round(timeout_s=0.01)


async def test_a_view_without_me_means_lost(participant: Participant) -> None:
    waiter = asyncio.create_task(participant.wait_for_round(timeout_s=5))
    rounds = participant.rounds()
    await anext(rounds)
    # Waiting for the next round still counts as being in the job.
    participant._observe(info(2, 1, RoundState.ACTIVE, members=(OTHER,), waiting=(ME,)))
    assert not participant.lost.is_set() and participant.waiting
    # Declared failed while waiting: the next round goes on without us.
    participant._observe(info(3, 2, RoundState.ACTIVE, members=(OTHER,)))
    assert participant.lost.is_set()
    assert "no longer in job" in (participant.lost_reason or "")
    with pytest.raises(ParticipantLostError):
        await waiter
    # The iterator hands out what it was told before the loss (round 1 closing without
    # us), then ends.
    assert (await anext(rounds)).state is RoundState.ACTIVE
    with pytest.raises(StopAsyncIteration):
        await anext(rounds)
    # Lost is final: a stale view that still lists us changes nothing.
    participant._observe(info(5, 3, RoundState.ACTIVE, members=(ME, OTHER)))
    assert participant.lost.is_set()


async def test_wait_for_round_out_of_time_says_how_the_round_stands_now(
    participant: Participant, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The view's reason is from the join, 0.2 s in: after the wait it would be untrue.
    stale = dataclasses.replace(
        info(2, 1, RoundState.JOINING, members=(ME,)),
        reason="1 of min 2 joined; joining for 0.2 s of the 600 s join timeout",
    )
    participant._observe(stale)
    now = dataclasses.replace(
        info(3, 1, RoundState.JOINING, members=(ME,)),
        reason="1 of min 2 joined; joining for 600.1 s of the 600 s join timeout",
    )

    async def get_job(caller: Caller, job: str, **options: object) -> SimpleNamespace:
        return SimpleNamespace(round=now)

    monkeypatch.setattr(rendezvous, "get_job", get_job)
    with pytest.raises(DeadlineExceededError) as raised:
        await participant.wait_for_round(timeout_s=0.01)
    assert "joining for 600.1 s of the 600 s join timeout" in str(raised.value)
    assert "0.2 s" not in str(raised.value)

    async def unanswered(caller: Caller, job: str, **options: object) -> SimpleNamespace:
        raise UnavailableError("no member answered")

    monkeypatch.setattr(rendezvous, "get_job", unanswered)
    with pytest.raises(DeadlineExceededError) as raised:
        await participant.wait_for_round(timeout_s=0.01)
    # The last known reason, with its age and why it is not fresher.
    assert "s ago: 1 of min 2 joined; joining for 600.1 s" in str(raised.value)
    assert "did not answer since: no member answered" in str(raised.value)


# ---------------------------------------------------------------------------- one stream


def assignment(pid: int, round_number: int, state: RoundState | None, rank: int = -1) -> Assignment:
    gone = state is None
    return Assignment(pid, round_number, state, rank, 0, 0, "", waiting=False, gone=gone)


async def test_a_round_change_pushed_to_a_process_is_read_once_for_all_its_participants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caller = Caller(
        Transport(["127.0.0.1:1"]), timeout_s=1.0, session_ttl_s=30.0, max_inflight_writes=1
    )
    shared = ProcessHeartbeats(caller, "job", 0.1)
    joining = info(1, 1, RoundState.JOINING)
    mine = Participant(caller, "w7", JoinResult(ME, False, joining), JobConfig(2, 2), shared)
    other = Participant(caller, "w9", JoinResult(OTHER, False, joining), JobConfig(2, 2), shared)
    # Registered as carry() does, without starting the stream: no server here.
    shared._carried = {ME: mine, OTHER: other}
    reads: list[str] = []
    now = info(3, 1, RoundState.ACTIVE)

    async def get_job(caller: Caller, job: str, **options: object) -> SimpleNamespace:
        reads.append(job)
        return SimpleNamespace(round=now)

    monkeypatch.setattr(process_heartbeats, "get_job", get_job)
    # The member pushes both assignments in one answer: one read serves both.
    shared._assigned(assignment(ME, 1, RoundState.ACTIVE, 0))
    shared._assigned(assignment(OTHER, 1, RoundState.ACTIVE, 1))
    assert mine.behind() and other.behind()
    assert (await mine.wait_for_round(timeout_s=5)).rank_of(ME) == 0
    assert (await other.wait_for_round(timeout_s=5)).rank_of(OTHER) == 1
    assert reads == ["job"]
    # An assignment the view already has costs nothing.
    shared._assigned(assignment(ME, 1, RoundState.ACTIVE, 0))
    assert not mine.behind()
    # Gone: the fresh view without it says why, and it is no longer carried.
    now = info(5, 2, RoundState.JOINING, members=(OTHER,))
    shared._assigned(assignment(ME, 1, None))
    await asyncio.wait_for(mine.lost.wait(), 5)
    assert "no longer in job" in (mine.lost_reason or "")
    assert list(shared._carried) == [OTHER]
    assert reads == ["job", "job"]
    assert not shared.closing
    # The last one gone: the stream closes, and the client's next join gets a new one.
    now = info(6, 2, RoundState.JOINING, members=())
    shared._assigned(assignment(OTHER, 2, None))
    await asyncio.wait_for(other.lost.wait(), 5)
    async with asyncio.timeout(5):
        while not shared.closing:
            await asyncio.sleep(0.01)
    await shared._close()
    await caller.close()


async def test_a_view_without_me_after_my_replacement_is_told_as_such(
    participant: Participant, caplog: pytest.LogCaptureFixture
) -> None:
    # A torchrun agent joins a new participant in this one's place (Join.replaces): the
    # view without us is that join, not a failure, and is logged as what it is.
    participant.expect_replacement()
    with caplog.at_level(logging.INFO, logger="rallypoint"):
        participant._observe(info(2, 2, RoundState.ACTIVE, members=(OTHER, 11)))
    assert participant.lost.is_set()
    assert "replaced by a new participant of this client" in (participant.lost_reason or "")
    records = [r for r in caplog.records if "no longer in job" in r.getMessage()]
    assert records and all(r.levelno == logging.INFO for r in records)


async def test_a_failed_replacement_leaves_the_failure_reading(
    participant: Participant, caplog: pytest.LogCaptureFixture
) -> None:
    # The replacing join failed (expect_replacement(False)): a later view without us is a
    # failure again, a warning.
    participant.expect_replacement()
    participant.expect_replacement(False)
    with caplog.at_level(logging.INFO, logger="rallypoint"):
        participant._observe(info(2, 2, RoundState.ACTIVE, members=(OTHER,)))
    assert "declared failed or evicted" in (participant.lost_reason or "")
    records = [r for r in caplog.records if "no longer in job" in r.getMessage()]
    assert records and all(r.levelno == logging.WARNING for r in records)
