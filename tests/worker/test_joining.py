"""worker/joining.py: the one join/wait/rejoin routine of the elastic loop and the torchrun
backend. Its wait goes on with the participant a policy joined again as, a policy that
raises ends it, and each wait is bounded by the caller's timeout asked anew. No cluster:
participants are doubles that answer from a script."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, cast

import pytest

from rallypoint.client import (
    DeadlineExceededError,
    FailedPreconditionError,
    HeldOutError,
    JobConfig,
    ParticipantLostError,
    RoundInfo,
    RoundState,
    SyncClient,
    SyncParticipant,
)
from rallypoint.client.rendezvous_errors import refine
from rallypoint.coordinator.state.errors import HeldOut
from rallypoint.worker import joining
from rallypoint.worker.patience import Patience


def round_info(number: int, state: RoundState = RoundState.ACTIVE) -> RoundInfo:
    return RoundInfo(
        job="j",
        round=number,
        state=state,
        members=(),
        world_size=1,
        fencing_token=number,
        store_namespace="",
        reason="",
        waiting=(),
        opened_ms=0,
        closed_ms=0,
        job_closed=False,
        job_revision=number,
    )


class Scripted:
    """A participant whose waits answer, in order, from ``script`` (a RoundInfo or an
    exception to raise); it notes the timeout of each."""

    def __init__(self, participant_id: int, *script: RoundInfo | Exception) -> None:
        self.participant_id = participant_id
        self._script: Iterator[RoundInfo | Exception] = iter(script)
        self.timeouts: list[float] = []

    def wait_for_round(self, *, timeout_s: float) -> RoundInfo:
        self.timeouts.append(timeout_s)
        answer = next(self._script)
        if isinstance(answer, Exception):
            raise answer
        return answer


def as_participant(double: Scripted) -> SyncParticipant:
    return cast(SyncParticipant, double)


def test_a_round_at_once_is_returned_with_the_same_participant() -> None:
    first = Scripted(1, round_info(3))
    refuse: Any = lambda *_: pytest.fail("no policy is asked when a round comes")  # noqa: E731
    participant, info = joining.next_round(
        as_participant(first), timeout_s=lambda: 7.0, on_lost=refuse, on_timeout=refuse
    )
    assert participant is as_participant(first)
    assert info.round == 3 and first.timeouts == [7.0]


def test_a_lost_participant_is_replaced_by_the_one_the_policy_joined_as() -> None:
    first = Scripted(1, ParticipantLostError("declared failed"))
    second = Scripted(2, DeadlineExceededError("no round yet"), round_info(5))
    asked: list[tuple[str, int, str]] = []
    timeouts = iter([10.0, 20.0, 30.0])

    def lost(participant: SyncParticipant, error: Exception) -> SyncParticipant:
        asked.append(("lost", participant.participant_id, str(error)))
        return as_participant(second)

    def timed_out(participant: SyncParticipant, error: Exception) -> SyncParticipant:
        asked.append(("timeout", participant.participant_id, str(error)))
        return participant  # wait again with the same one

    participant, info = joining.next_round(
        as_participant(first), timeout_s=lambda: next(timeouts), on_lost=lost, on_timeout=timed_out
    )
    assert participant is as_participant(second) and info.round == 5
    assert asked == [("lost", 1, "declared failed"), ("timeout", 2, "no round yet")]
    # Each wait asked for its timeout anew.
    assert first.timeouts == [10.0] and second.timeouts == [20.0, 30.0]


def test_a_policy_that_raises_ends_the_wait() -> None:
    class GaveUp(Exception):
        pass

    def give_up(_: SyncParticipant, error: Exception) -> SyncParticipant:
        raise GaveUp(str(error)) from error

    with pytest.raises(GaveUp, match="no round") as raised:
        joining.next_round(
            as_participant(Scripted(1, DeadlineExceededError("no round"))),
            timeout_s=lambda: 1.0,
            on_lost=give_up,
            on_timeout=give_up,
        )
    assert isinstance(raised.value.__cause__, DeadlineExceededError)


@pytest.mark.parametrize(
    ("view", "number", "live"),
    [
        (round_info(4), 4, True),
        (round_info(5), 4, False),
        (round_info(4, RoundState.ENDED), 4, False),
        (round_info(4, RoundState.JOINING), 4, False),
    ],
)
def test_is_live_means_the_same_round_still_active(
    view: RoundInfo, number: int, live: bool
) -> None:
    assert joining.is_live(view, number) is live


class HoldingClient:
    """A client whose joins are refused as the coordinator refuses a held-out straggler's
    (its own HeldOut message, ``held`` times), then answer ``"joined"``."""

    def __init__(self, held: int, retry_after_ms: int) -> None:
        refusal = HeldOut("j", "w2", 4, 9_000, retry_after_ms)
        self.error = refine(FailedPreconditionError(refusal.message, reason=refusal.reason))
        self.held = held
        self.names: list[str] = []

    def join(self, job: str, name: str, **_: object) -> str:
        self.names.append(name)
        if len(self.names) <= self.held:
            raise self.error
        return "joined"


def test_a_held_out_worker_sleeps_out_the_hold_the_coordinator_names_then_joins(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(joining.time, "sleep", slept.append)
    client = HoldingClient(held=1, retry_after_ms=3_500)
    assert isinstance(client.error, HeldOutError) and client.error.retry_after_s == 3.5
    patience = Patience(["a:1"], timeout_s=5, attempt_s=1, who="w2 of job 'j'", log=joining.log)
    with caplog.at_level(logging.WARNING, logger=joining.log.name):
        joined = joining.join(
            cast(SyncClient, client),
            "j",
            lambda: "w2",
            config=JobConfig(2, 3),
            metadata=b"",
            patience=patience,
        )
    assert joined == "joined" and client.names == ["w2", "w2"]
    assert slept == [3.5 + joining._HOLD_MARGIN_S]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "w2 of job 'j': evicted as a straggler and held out of the job; joining again in 3.5 s"
    ]
