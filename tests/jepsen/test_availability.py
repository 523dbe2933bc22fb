"""The availability checker on hand-made histories: a long window while a connected majority
was up is flagged; the same window without one is not."""

from __future__ import annotations

from typing import Any

import pytest

from tests.jepsen.availability import (
    Health,
    bound_s,
    check_availability,
    unavailability_windows,
)
from tests.jepsen.checkers import Outcome
from tests.jepsen.history import NEMESIS_PROCESS, Event, EventType

BOUND_S = bound_s(0.5)  # 3 s, as the suite's members are timed


class History:
    """Builds events: writes by numbered processes, faults and health records."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def _add(self, process: int, type_: EventType, f: str, value: Any, time_s: float) -> None:
        self.events.append(Event(process, type_, f, "k", value, time_s))

    def write(self, process: int, call_s: float, return_s: float, status: str = "ok") -> None:
        self._add(process, EventType.INVOKE, "write", 1, call_s)
        self._add(process, EventType(status), "write", None, return_s)

    def health(self, time_s: float, up: list[int], voters: tuple[int, ...] = (1, 2, 3)) -> None:
        self._add(
            NEMESIS_PROCESS,
            EventType.HEALTH,
            "health",
            Health(time_s, voters, tuple(up)).to_json(),
            time_s,
        )

    def fault(self, start_s: float, stop_s: float, what: str) -> None:
        self._add(NEMESIS_PROCESS, EventType.START, "kill", what, start_s)
        self._add(NEMESIS_PROCESS, EventType.STOP, "kill", "healed", stop_s)

    def sorted(self) -> list[Event]:
        return sorted(self.events, key=lambda e: e.time_s)


def steady_writes(history: History, start_s: float, stop_s: float, process: int = 1) -> None:
    """A write every 100 ms taking 10 ms."""
    t = start_s
    while t < stop_s:
        history.write(process, t, t + 0.01)
        t += 0.1


def test_a_long_window_while_a_majority_was_up_is_a_violation() -> None:
    h = History()
    steady_writes(h, 0.0, 10.0)
    h.fault(10.0, 11.0, "kill -9 1")
    h.health(10.0, up=[2, 3])  # two of three up: a connected majority
    # Every write for 8 s times out; then one succeeds.
    for i in range(8):
        h.write(2 + i, 10.0 + i, 13.0 + i, status="info")
    h.write(20, 18.0, 18.05)
    steady_writes(h, 18.1, 20.0, process=21)
    result, windows = check_availability(h.sorted(), BOUND_S)
    assert result.outcome is Outcome.INVALID, result.summary
    assert len(windows) == 1
    assert windows[0].start_s == pytest.approx(10.0)
    assert windows[0].end_s == pytest.approx(18.05)
    assert windows[0].majority_s == pytest.approx(8.05)
    assert windows[0].faults == ["kill -9 1"]


def test_the_same_window_without_a_majority_is_reported_not_judged() -> None:
    h = History()
    steady_writes(h, 0.0, 10.0)
    h.health(10.0, up=[3])  # two of three down
    for i in range(8):
        h.write(2 + i, 10.0 + i, 13.0 + i, status="info")
    h.health(17.5, up=[1, 2, 3])
    h.write(20, 18.0, 18.05)
    result, windows = check_availability(h.sorted(), BOUND_S)
    assert result.outcome is Outcome.VALID, result.summary
    assert windows[0].duration_s == pytest.approx(8.05)
    # Only the 0.55 s after the members came back count against the bound.
    assert windows[0].majority_s == pytest.approx(0.55)
    assert result.stats["max_s"] == pytest.approx(8.05, abs=0.001)


def test_a_slow_recovery_after_the_majority_returns_is_a_violation() -> None:
    h = History()
    h.health(0.0, up=[3])
    for i in range(10):
        h.write(2 + i, float(i), i + 3.0, status="info")
    h.health(2.0, up=[1, 2, 3])
    h.write(30, 9.0, 9.5)
    result, windows = check_availability(h.sorted(), BOUND_S)
    assert result.outcome is Outcome.INVALID
    assert windows[0].majority_s == pytest.approx(7.5)


def test_a_slow_write_is_a_window_and_fast_ones_are_not() -> None:
    h = History()
    steady_writes(h, 0.0, 5.0)
    h.write(50, 5.0, 6.5)  # acknowledged after 1.5 s
    steady_writes(h, 6.6, 8.0, process=51)
    windows = unavailability_windows(h.sorted(), slow_s=1.0)
    assert [(w.start_s, w.end_s) for w in windows] == [(5.0, 6.5)]


def test_overlapping_windows_merge_and_refusals_open_none() -> None:
    h = History()
    h.write(1, 0.0, 0.01)
    h.write(2, 1.0, 4.0, status="info")
    h.write(3, 2.0, 5.0, status="info")  # opens inside the first: merged
    h.write(4, 3.0, 3.1, status="fail")  # the cluster answered (a refusal): available
    h.write(5, 5.5, 5.6)
    h.write(6, 7.0, 10.0, status="info")  # nothing after it: open at the end
    windows = unavailability_windows(h.sorted())
    assert [(w.start_s, w.end_s, w.open_at_end) for w in windows] == [
        (1.0, 5.6, False),
        (7.0, 10.0, True),
    ]


def test_an_open_window_ends_when_the_clients_stop_writing() -> None:
    # The clients' last writes time out at 12 s and they issue no more (the run's writing
    # time is over); the history goes on to 20 s (the nemesis heals, final reads). A
    # majority was up throughout, but only the 5 s in which writes were asked count.
    h = History()
    steady_writes(h, 0.0, 7.0)
    h.health(7.0, up=[2, 3])
    for i in range(3):
        h.write(2 + i, 7.0 + i, 10.0 + i, status="info")
    h.write(9, 9.0, 12.0, status="info")
    h.health(16.0, up=[1, 2, 3])
    h.fault(13.0, 20.0, "corrupt 1: replaced by 4")
    result, windows = check_availability(h.sorted(), BOUND_S)
    assert [(w.start_s, w.end_s, w.open_at_end) for w in windows] == [(7.0, 12.0, True)]
    assert windows[0].majority_s == pytest.approx(5.0)
    assert result.outcome is Outcome.INVALID  # 5 s asked, unanswered: still a violation
    # A write never answered keeps the window open to the end of the history.
    h.write(30, 11.5, 11.6, status="info")
    h._add(31, EventType.INVOKE, "write", 1, 11.9)
    windows = unavailability_windows(h.sorted())
    assert [(w.start_s, w.end_s) for w in windows] == [(7.0, 20.0)]


def test_a_write_acknowledged_late_closes_no_earlier_window() -> None:
    # A write invoked before the window opened and acknowledged inside it proves nothing
    # about a write issued then: the window closes at the first acknowledgement of a write
    # invoked after it opened.
    h = History()
    h.write(1, 0.9, 3.5)
    h.write(2, 1.0, 4.0, status="info")
    h.write(3, 4.5, 4.6)
    windows = unavailability_windows(h.sorted())
    assert [(w.start_s, w.end_s) for w in windows] == [(0.9, 4.6)]


@pytest.mark.parametrize(
    ("health", "majority"),
    [
        (Health(0, (1, 2, 3), (1, 2, 3)), (1, 2, 3)),
        (Health(0, (1, 2, 3), (2, 3)), (2, 3)),
        (Health(0, (1, 2, 3), (3,)), ()),
        # A bridge: 2 sees both sides, 1 and 3 cannot reach each other.
        (Health(0, (1, 2, 3), (1, 2, 3), blocked=((1, 3),)), (1, 2)),
        # Isolated leader (1) of five.
        (
            Health(0, (1, 2, 3, 4, 5), (1, 2, 3, 4, 5), ((1, 2), (1, 3), (1, 4), (1, 5))),
            (2, 3, 4, 5),
        ),
        # A majorities ring of five: everyone sees only its two neighbours.
        (
            Health(
                0,
                (1, 2, 3, 4, 5),
                (1, 2, 3, 4, 5),
                ((1, 3), (1, 4), (2, 4), (2, 5), (3, 5)),
            ),
            (),
        ),
        # Slowed members do not count; learners do not vote.
        (Health(0, (1, 2, 3), (1, 2, 3), degraded=(1, 2)), ()),
        (Health(0, (1, 2, 3), (1, 2, 3, 4)), (1, 2, 3)),
    ],
)
def test_connected_majorities(health: Health, majority: tuple[int, ...]) -> None:
    assert health.connected_majority() == majority
