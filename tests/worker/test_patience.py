"""Patience (worker/patience.py) on a fake clock: attempts are repeated while no member can
serve them, each failure is logged with how long the coordinator has been silent, other
errors are the answer at once, and running out is one line that says what to check."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest

from rallypoint.client import (
    DeadlineExceededError,
    PermissionDeniedError,
    RallypointError,
    UnavailableError,
)
from rallypoint.worker.patience import CoordinatorUnreachableError, Patience

ENDPOINTS = ["a:1", "b:2"]


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0
        self.slept_s: list[float] = []

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.slept_s.append(seconds)
        self.now_s += seconds


def failing(
    clock: Clock, errors: list[RallypointError], answer: str = "joined"
) -> tuple[Callable[[float], str], list[float]]:
    """An attempt that spends its whole budget and raises the next error, then answers."""
    budgets: list[float] = []

    def attempt(timeout_s: float) -> str:
        budgets.append(timeout_s)
        clock.now_s += timeout_s
        if errors:
            raise errors.pop(0)
        return answer

    return attempt, budgets


def test_retries_while_unreachable_and_logs_each_wait(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    patience = Patience(
        ENDPOINTS,
        timeout_s=60,
        attempt_s=10,
        who="job 'j'",
        log=logging.getLogger("test"),
        clock=clock,
        sleep=clock.sleep,
    )
    attempt, budgets = failing(
        clock,
        [UnavailableError("refused"), DeadlineExceededError("late"), UnavailableError("x")],
    )
    with caplog.at_level(logging.WARNING, "test"):
        assert patience.call("joining", attempt) == "joined"
    assert budgets == [10, 10, 10, 10]
    assert [r.getMessage() for r in caplog.records] == [
        "job 'j': waiting for the coordinator: no member answered for 10 s; retrying for up "
        "to 50 s more",
        "job 'j': waiting for the coordinator: no member answered for 20 s; retrying for up "
        "to 40 s more",
        "job 'j': waiting for the coordinator: no member answered for 30 s; retrying for up "
        "to 30 s more",
    ]


def test_gives_up_on_time_with_one_line_naming_what_to_check() -> None:
    clock = Clock()
    patience = Patience(
        ENDPOINTS,
        timeout_s=25,
        attempt_s=10,
        who="w0",
        log=logging.getLogger("t"),
        clock=clock,
        sleep=clock.sleep,
    )
    attempt, budgets = failing(clock, [UnavailableError("refused")] * 5)
    with pytest.raises(CoordinatorUnreachableError) as raised:
        patience.call("joining", attempt)
    # The last attempt is cut to what is left of the patience.
    assert budgets == [10, 10, 5]
    message = str(raised.value)
    assert "\n" not in message
    assert message == (
        "w0: gave up joining after 25 s: no member answered at a:1, b:2; check that the "
        "members are running and that this host reaches their client ports (not the peer "
        "ports)"
    )
    assert str(raised.value.last_error) == "refused"


def test_members_without_a_leader_are_named_as_such() -> None:
    clock = Clock()
    patience = Patience(
        ENDPOINTS,
        timeout_s=5,
        attempt_s=10,
        who="w0",
        log=logging.getLogger("t"),
        clock=clock,
        sleep=clock.sleep,
    )
    attempt, _ = failing(clock, [UnavailableError("no leader", reason="NO_LEADER")])
    with pytest.raises(CoordinatorUnreachableError, match="members answer but none leads"):
        patience.call("joining", attempt)


def test_other_errors_are_the_answer_at_once() -> None:
    clock = Clock()
    patience = Patience(
        ENDPOINTS,
        timeout_s=60,
        attempt_s=10,
        who="w0",
        log=logging.getLogger("t"),
        clock=clock,
        sleep=clock.sleep,
    )
    attempt, budgets = failing(clock, [PermissionDeniedError("role 'read' may not join")])
    with pytest.raises(PermissionDeniedError):
        patience.call("joining", attempt)
    assert budgets == [10]


def test_attempts_that_fail_at_once_are_paced_and_logged_sparingly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    patience = Patience(
        ENDPOINTS,
        timeout_s=30,
        attempt_s=10,
        who="w0",
        log=logging.getLogger("test"),
        clock=clock,
        sleep=clock.sleep,
    )

    def refused_at_once(timeout_s: float) -> str:
        raise UnavailableError("refused")

    with caplog.at_level(logging.WARNING, "test"), pytest.raises(CoordinatorUnreachableError):
        patience.call("joining", refused_at_once)
    # One attempt a second, and a progress line every 10 s.
    assert clock.slept_s == [1.0] * 30
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        "w0: waiting for the coordinator: no member answered for 10 s",
        "w0: waiting for the coordinator: no member answered for 20 s",
    ]


def test_an_uncaught_give_up_ends_the_process_with_its_line_only() -> None:
    program = textwrap.dedent(
        """
        import logging
        from rallypoint.client import UnavailableError
        from rallypoint.worker.patience import Patience

        def attempt(timeout_s):
            raise UnavailableError("refused")

        Patience(["a:1"], timeout_s=0.01, attempt_s=1, who="w0",
                 log=logging.getLogger("t")).call("joining", attempt)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "rallypoint: w0: gave up joining after 0.01 s: no member answered at a:1; check that "
        "the members are running and that this host reaches their client ports (not the peer "
        "ports)"
    ], done.stderr
