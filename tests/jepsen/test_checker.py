"""The linearizability checker and the workload checkers on hand-made histories: each must
accept the good ones and catch the bad ones (a checker that never fails proves nothing)."""

from __future__ import annotations

import math

import pytest

from tests.jepsen.checkers import (
    Outcome,
    check_lease,
    check_members,
    check_rendezvous,
    check_set,
    check_watch,
)
from tests.jepsen.history import Event, EventType, Operation, pair
from tests.jepsen.models import RegisterModel, SetModel
from tests.jepsen.wgl import Deadline, Verdict, check_history, check_operations, smallest_window

REGISTER = RegisterModel()


def op(
    op_id: int,
    f: str,
    value: object,
    output: object,
    call_s: float,
    return_s: float | None,
    key: str = "k",
) -> Operation:
    """``return_s`` None: unknown outcome."""
    unknown = return_s is None
    return Operation(
        op_id,
        op_id,
        f,
        key,
        value,
        None if unknown else output,
        call_s,
        math.inf if unknown else float(return_s),  # type: ignore[arg-type]
        "info" if unknown else "ok",
    )


def verdict(ops: list[Operation], model: object = REGISTER) -> Verdict:
    return check_history(model, ops, budget_s=10.0).verdict  # type: ignore[arg-type]


def test_sequential_history_is_linearizable() -> None:
    ops = [
        op(0, "write", 1, None, 0, 1),
        op(1, "read", None, 1, 2, 3),
        op(2, "cas", [1, 2], True, 4, 5),
        op(3, "read", None, 2, 6, 7),
        op(4, "cas", [1, 3], False, 8, 9),
    ]
    assert verdict(ops) is Verdict.LINEARIZABLE


def test_read_of_initial_value_after_a_write_completed_is_not() -> None:
    ops = [op(0, "write", 1, None, 0, 1), op(1, "read", None, None, 2, 3)]
    assert verdict(ops) is Verdict.NOT_LINEARIZABLE


def test_concurrent_write_may_be_seen_or_not() -> None:
    ops = [
        op(0, "write", 1, None, 0, 10),
        op(1, "read", None, 1, 1, 2),
        op(2, "read", None, None, 0.5, 0.7),
    ]
    assert verdict(ops) is Verdict.LINEARIZABLE


def test_stale_read_after_newer_read_is_not_linearizable() -> None:
    # Both writes overlap both reads, but once a read saw 2, a later read cannot see 1.
    ops = [
        op(0, "write", 1, None, 0, 1),
        op(1, "write", 2, None, 2, 10),
        op(2, "read", None, 2, 3, 4),
        op(3, "read", None, 1, 5, 6),
    ]
    assert verdict(ops) is Verdict.NOT_LINEARIZABLE


def test_failed_cas_must_see_a_different_value() -> None:
    ops = [op(0, "write", 1, None, 0, 1), op(1, "cas", [1, 2], False, 2, 3)]
    assert verdict(ops) is Verdict.NOT_LINEARIZABLE


def test_two_successful_cas_from_the_same_value_are_not_linearizable() -> None:
    ops = [
        op(0, "write", 0, None, 0, 1),
        op(1, "cas", [0, 1], True, 2, 5),
        op(2, "cas", [0, 2], True, 2, 5),
    ]
    assert verdict(ops) is Verdict.NOT_LINEARIZABLE


def test_unknown_write_may_take_effect_late() -> None:
    ops = [
        op(0, "write", 1, None, 0, None),  # timed out
        op(1, "read", None, None, 1, 2),
        op(2, "read", None, 1, 30, 31),
    ]
    assert verdict(ops) is Verdict.LINEARIZABLE


def test_unknown_write_may_never_take_effect() -> None:
    ops = [op(0, "write", 1, None, 0, None), op(1, "read", None, None, 5, 6)]
    assert verdict(ops) is Verdict.LINEARIZABLE


def test_unknown_write_cannot_take_effect_before_its_call() -> None:
    ops = [op(0, "read", None, 1, 0, 1), op(1, "write", 1, None, 2, None)]
    assert verdict(ops) is Verdict.NOT_LINEARIZABLE


def test_unknown_cas_applies_only_if_the_comparison_holds() -> None:
    ops = [
        op(0, "write", 5, None, 0, 1),
        op(1, "cas", [4, 9], None, 2, None),
        op(2, "read", None, 9, 3, 4),
    ]
    assert verdict(ops) is Verdict.NOT_LINEARIZABLE


def test_keys_are_checked_independently() -> None:
    ops = [
        op(0, "write", 1, None, 0, 1, key="a"),
        op(1, "read", None, 1, 2, 3, key="a"),
        op(2, "write", 7, None, 0, 1, key="b"),
        op(3, "read", None, 1, 2, 3, key="b"),
    ]
    result = check_history(REGISTER, ops, budget_s=10.0)
    assert result.verdict is Verdict.NOT_LINEARIZABLE
    assert [k.key for k in result.failures] == ["b"]


def test_budget_overrun_is_unknown_not_a_guess() -> None:
    # Many concurrent writes and reads: nontrivial search, zero budget.
    ops = [op(i, "write", i, None, 0, 100) for i in range(40)]
    ops += [op(40 + i, "read", None, i, 1, 99) for i in range(40)]
    result = check_operations(REGISTER, ops, Deadline(0.0))
    assert result.verdict is Verdict.UNKNOWN


def test_large_concurrent_linearizable_history_finishes() -> None:
    # Writers of distinct values, each read sees the latest completed write: memoisation
    # keeps this fast.
    ops = []
    for i in range(300):
        ops.append(op(2 * i, "write", i, None, i, i + 0.5))
        ops.append(op(2 * i + 1, "read", None, i, i + 0.6, i + 0.9))
    assert verdict(ops) is Verdict.LINEARIZABLE


def test_smallest_window_is_still_a_violation_and_short() -> None:
    ops = []
    for i in range(50):
        ops.append(op(2 * i, "write", i, None, i, i + 0.5))
        ops.append(op(2 * i + 1, "read", None, i, i + 0.6, i + 0.9))
    ops.append(op(100, "read", None, 3, 60, 61))  # stale
    window = smallest_window(REGISTER, ops, budget_s=10.0)
    assert len(window) <= 4
    assert 100 in {o.op_id for o in window}
    # A window is checked from any value; failing from there, it fails from the initial one.
    assert verdict(window) is Verdict.NOT_LINEARIZABLE


def test_set_model() -> None:
    good = [
        op(0, "add", 1, None, 0, 1),
        op(1, "add", 2, None, 0, None),
        op(2, "read", None, [1, 2], 5, 6),
    ]
    lost = [op(0, "add", 1, None, 0, 1), op(1, "read", None, [], 5, 6)]
    assert verdict(good, SetModel()) is Verdict.LINEARIZABLE
    assert verdict(lost, SetModel()) is Verdict.NOT_LINEARIZABLE


def test_pairing_events_into_operations() -> None:
    events = [
        Event(1, EventType.INVOKE, "write", "k", 1, 0.0),
        Event(2, EventType.INVOKE, "read", "k", None, 0.1),
        Event(1, EventType.INFO, "write", "k", None, 0.5),
        Event(2, EventType.OK, "read", "k", 1, 0.6),
        Event(3, EventType.INVOKE, "write", "k", 2, 0.7),
        Event(3, EventType.FAIL, "write", "k", None, 0.8),
        Event(4, EventType.INVOKE, "write", "k", 3, 0.9),
    ]
    ops = list(pair(events))
    assert [(o.f, o.status) for o in ops] == [("write", "info"), ("read", "ok"), ("write", "info")]
    assert math.isinf(ops[0].return_s) and ops[1].output == 1


def test_pairing_refuses_a_double_invoke() -> None:
    events = [
        Event(1, EventType.INVOKE, "write", "k", 1, 0.0),
        Event(1, EventType.INVOKE, "write", "k", 2, 0.1),
    ]
    with pytest.raises(ValueError, match="twice"):
        list(pair(events))


def test_set_checker_catches_a_lost_add_and_a_phantom() -> None:
    adds = [op(0, "add", 1, None, 0, 1), op(1, "add", 2, None, 0, None)]
    assert check_set([*adds, op(2, "read", None, [1], 5, 6)]).outcome is Outcome.VALID
    lost = check_set([*adds, op(2, "read", None, [2], 5, 6)])
    assert lost.outcome is Outcome.INVALID and lost.stats["lost"] == 1
    phantom = check_set([*adds, op(2, "read", None, [1, 9], 5, 6)])
    assert phantom.outcome is Outcome.INVALID and phantom.stats["unexpected"] == 1
    assert check_set(adds).outcome is Outcome.UNKNOWN


def grant(op_id: int, token: int, call_s: float, return_s: float) -> Operation:
    return op(op_id, "grant", None, {"lease_id": token, "token": token}, call_s, return_s)


def fenced(op_id: int, token: int, revision: int, call_s: float) -> Operation:
    return op(op_id, "write", {"token": token}, {"revision": revision}, call_s, call_s + 0.1)


def test_lease_checker() -> None:
    good = [grant(0, 10, 0, 1), grant(1, 20, 2, 3), fenced(2, 10, 11, 1.5), fenced(3, 20, 21, 4)]
    assert check_lease(good).outcome is Outcome.VALID
    stale = [*good, fenced(4, 10, 30, 5)]
    assert check_lease(stale).outcome is Outcome.INVALID
    backwards = [grant(0, 20, 0, 1), grant(1, 10, 2, 3)]
    assert check_lease(backwards).outcome is Outcome.INVALID
    concurrent = [grant(0, 20, 0, 3), grant(1, 10, 1, 2)]
    assert check_lease(concurrent).outcome is Outcome.VALID


def event(op_id: int, watcher: int, revision: int) -> Operation:
    return Operation(op_id, watcher, "event", "w", None, [revision, "k", "v"], 0, 0, "ok")


def test_watch_checker() -> None:
    puts = [op(0, "put", "v", {"revision": 5}, 0, 1), op(1, "put", "v", {"revision": 7}, 0, 1)]
    good = [*puts, event(2, 10, 5), event(3, 10, 7), event(4, 11, 5)]
    assert check_watch(good).outcome is Outcome.VALID
    gap = [*puts, event(2, 10, 7)]
    assert check_watch(gap).outcome is Outcome.INVALID
    duplicate = [*puts, event(2, 10, 5), event(3, 10, 5)]
    assert check_watch(duplicate).outcome is Outcome.INVALID
    differ = [*puts, event(2, 10, 5), event(3, 10, 7), event(4, 11, 6)]
    assert check_watch(differ).outcome is Outcome.INVALID


def view(op_id: int, process: int, number: int, members: dict[str, int]) -> Operation:
    return Operation(
        op_id, process, "round", "job", None, {"round": number, "members": members}, 0, 1, "ok"
    )


def test_rendezvous_checker() -> None:
    same = [view(0, 1, 1, {"a": 0, "b": 1}), view(1, 2, 1, {"a": 0, "b": 1})]
    assert check_rendezvous(same).outcome is Outcome.VALID
    differ = [*same, view(2, 3, 1, {"a": 1, "b": 0})]
    assert check_rendezvous(differ).outcome is Outcome.INVALID


def test_a_member_that_exited_on_its_own_is_a_violation() -> None:
    assert check_members({}).outcome is Outcome.VALID
    result = check_members({3: 70})
    assert result.outcome is Outcome.INVALID
    assert "3 (code 70)" in result.summary
