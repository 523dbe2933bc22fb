"""The one retry policy (``transport.Retrier``) every loop of the client uses: unary calls,
reads the server holds, and the streams that reconnect (heartbeat, round watch, lease
keep-alive, watch). Its decisions are checked here without a server; the loops that use it
are tested over real gRPC in test_retries.py, test_lease.py and test_watch.py."""

from __future__ import annotations

import random

import pytest

from rallypoint.client import Backoff, UnavailableError
from rallypoint.client.caller import Caller
from rallypoint.client.transport import Retrier, Transport

DOWN = UnavailableError("connection refused")


def transport(*endpoints: str, seed: int = 3, backoff: Backoff | None = None) -> Transport:
    return Transport(list(endpoints), rng=random.Random(seed), backoff=backoff or Backoff(0.1, 0.4))


def test_follows_hints_at_once_then_backs_off() -> None:
    members = transport("a:1", "b:1", "c:1")
    retrier = Retrier(members)
    hinted = UnavailableError("not the leader", reason="NOT_LEADER", leader_hint="b:1")
    assert retrier.delay_s("a:1", hinted) == 0.0
    # The next attempt goes to the leader the refusal named.
    assert members.pick() == "b:1"
    # Two members naming each other cannot bounce a request forever: after
    # len(endpoints) + 1 redirects in a row, it sleeps.
    delays = [
        retrier.delay_s(address, UnavailableError("x", leader_hint=hint))
        for address, hint in [("b:1", "c:1"), ("c:1", "b:1"), ("b:1", "c:1"), ("c:1", "b:1")]
    ]
    assert delays[:3] == [0.0, 0.0, 0.0] and 0.0 <= delays[3] <= 0.1


def test_a_hint_to_a_member_it_did_not_know_adds_an_endpoint() -> None:
    members = transport("a:1")
    Retrier(members).delay_s("a:1", UnavailableError("x", leader_hint="z:9"))
    assert members.endpoints == ["a:1", "z:9"] and members.pick() == "z:9"


def test_backs_off_with_full_jitter_and_resets_on_answer() -> None:
    members = transport("a:1", "b:1", seed=5)
    retrier = Retrier(members)
    delays = [retrier.delay_s("a:1", DOWN) for _ in range(6)]
    ceilings = [0.1, 0.2, 0.4, 0.4, 0.4, 0.4]
    assert all(0.0 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert retrier.retry == 6
    retrier.answered()
    assert retrier.retry == 0 and retrier.delay_s("a:1", DOWN) <= 0.1


def test_a_failure_moves_on_to_the_next_endpoint() -> None:
    members = transport("a:1", "b:1", "c:1")
    members.note_success("b:1")
    assert members.pick() == "b:1"
    Retrier(members).delay_s("b:1", DOWN)
    # The member that failed is no longer preferred; the rotation resumes after it.
    assert [members.pick(), members.pick()] == ["c:1", "a:1"]


def test_never_sleeps_past_the_deadline() -> None:
    retrier = Retrier(transport("a:1", backoff=Backoff(base_s=1.0, cap_s=60.0)))
    delays = [retrier.delay_s("a:1", DOWN, max_sleep_s=0.25) for _ in range(20)]
    assert all(0.0 <= d <= 0.25 for d in delays)
    assert max(delays) > 0.0
    # A deadline already past: no sleep at all.
    assert retrier.delay_s("a:1", DOWN, max_sleep_s=-1.0) == 0.0


def test_its_backoff_is_the_clients_unless_given() -> None:
    members = transport("a:1", backoff=Backoff(base_s=0.5, cap_s=8.0))
    assert Retrier(members).backoff == Backoff(base_s=0.5, cap_s=8.0)
    heartbeat = Backoff(base_s=0.05, cap_s=0.2)
    capped = Retrier(members, heartbeat)
    assert capped.backoff is heartbeat
    assert all(capped.delay_s("a:1", DOWN) <= 0.2 for _ in range(50))


async def test_after_failure_waits_the_delay_it_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def sleep(delay_s: float) -> None:
        slept.append(delay_s)

    retrier = Retrier(transport("a:1", "b:1"))
    monkeypatch.setattr("rallypoint.client.transport.asyncio.sleep", sleep)
    await retrier.after_failure("a:1", UnavailableError("x", leader_hint="b:1"))
    await retrier.after_failure("b:1", DOWN, max_sleep_s=0.05)
    monkeypatch.undo()
    assert slept[0] == 0.0 and 0.0 <= slept[1] <= 0.05


async def test_the_caller_hands_out_fresh_retriers_on_its_transport() -> None:
    members = transport("a:1")
    caller = Caller(members, timeout_s=1.0, session_ttl_s=30.0, max_inflight_writes=1)
    first, second = caller.retrier(), caller.retrier(Backoff(0.01, 0.02))
    first.delay_s("a:1", DOWN)
    assert (first.retry, second.retry) == (1, 0)
    assert first.backoff == members.backoff and second.backoff == Backoff(0.01, 0.02)
    await caller.close()
