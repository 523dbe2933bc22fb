"""Linearizability checking by the Wing-Gong-Lowe search, as porcupine implements it.

Theory of operation. A history is a set of operations, each with a call time and a return
time (infinite when its outcome is unknown: it may take effect at any point after its call, or
never, which is the same as taking effect after everything else). The checker keeps the call
and return entries in one doubly linked list ordered by time (calls before returns at equal
times). It walks the list: at a call entry it tries to *linearize* that operation now (the
model accepts it from the current state); if so it *lifts* the call and its return out of the
list, pushes (entry, previous state) on a stack and starts again from the head. At a return
entry, some operation returned before being linearized: backtrack (pop, *unlift*, and try the
next entry). The list empty means every operation was linearized: the history is
linearizable. The stack empty at a return entry means no order works.

Two things keep it tractable. Memoisation: a (set of linearized operations, state) pair seen
before is not explored again (Lowe's improvement; the set is a Python int used as a bitset).
P-compositionality: operations on independent keys are checked one key at a time. A time
budget turns a search that runs too long into an ``unknown`` verdict rather than a guess.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from .history import Operation
from .models import ANYTHING, Model


class Verdict(enum.Enum):
    LINEARIZABLE = "linearizable"
    NOT_LINEARIZABLE = "not linearizable"
    UNKNOWN = "unknown"  # the time budget ran out


class _Entry:
    """A node of the entry list. A call entry's ``match`` is its return entry."""

    __slots__ = ("match", "next", "op", "prev", "time_s")

    def __init__(self, op: Operation, time_s: float) -> None:
        self.op = op
        self.time_s = time_s
        self.match: _Entry | None = None
        self.prev: _Entry | None = None
        self.next: _Entry | None = None


def _build_list(ops: Sequence[Operation]) -> _Entry:
    """The sentinel head of the time-ordered entry list."""
    entries: list[tuple[float, int, int, _Entry]] = []
    for op in ops:
        call = _Entry(op, op.call_s)
        ret = _Entry(op, op.return_s)
        call.match = ret
        # Calls sort before returns at equal times (0 < 1); the op id keeps the order total.
        entries.append((op.call_s, 0, op.op_id, call))
        entries.append((op.return_s, 1, op.op_id, ret))
    entries.sort(key=lambda e: (e[0], e[1], e[2]))
    head = _Entry(ops[0], -math.inf) if ops else None
    assert head is not None
    previous = head
    for _, _, _, entry in entries:
        previous.next = entry
        entry.prev = previous
        previous = entry
    return head


def _lift(entry: _Entry) -> None:
    assert entry.prev is not None and entry.match is not None
    entry.prev.next = entry.next
    if entry.next is not None:
        entry.next.prev = entry.prev
    ret = entry.match
    assert ret.prev is not None
    ret.prev.next = ret.next
    if ret.next is not None:
        ret.next.prev = ret.prev


def _unlift(entry: _Entry) -> None:
    assert entry.prev is not None and entry.match is not None
    ret = entry.match
    assert ret.prev is not None
    ret.prev.next = ret
    if ret.next is not None:
        ret.next.prev = ret
    entry.prev.next = entry
    if entry.next is not None:
        entry.next.prev = entry


@dataclass(frozen=True, slots=True)
class KeyResult:
    key: str
    verdict: Verdict
    operations: int
    # When not linearizable: the most operations any partial order linearized, and the
    # operations (by id) still pending at that point, which no order could place next.
    longest_prefix: int = 0
    stuck_at: tuple[int, ...] = ()


@dataclass
class Deadline:
    at_s: float

    @staticmethod
    def after(budget_s: float) -> Deadline:
        return Deadline(time.monotonic() + budget_s)

    def passed(self) -> bool:
        return time.monotonic() >= self.at_s


def check_operations(
    model: Model,
    ops: Sequence[Operation],
    deadline: Deadline,
    key: str = "",
    initial: Hashable | None = None,
) -> KeyResult:
    """Check one key's operations (op ids must be distinct)."""
    if not ops:
        return KeyResult(key, Verdict.LINEARIZABLE, 0)
    # Bit positions: dense indices, independent of the op ids.
    bit = {op.op_id: i for i, op in enumerate(ops)}
    head = _build_list(ops)
    state: Hashable = model.init() if initial is None else initial
    linearized = 0
    cache: set[tuple[int, Hashable]] = set()
    calls: list[tuple[_Entry, Hashable]] = []
    longest = 0
    stuck: tuple[int, ...] = ()
    steps = 0
    entry = head.next
    while head.next is not None:
        steps += 1
        if steps % 2048 == 0 and deadline.passed():
            return KeyResult(key, Verdict.UNKNOWN, len(ops))
        assert entry is not None
        if entry.match is not None:
            ok, new_state = model.step(state, entry.op)
            if ok:
                new_linearized = linearized | (1 << bit[entry.op.op_id])
                if (new_linearized, new_state) not in cache:
                    cache.add((new_linearized, new_state))
                    calls.append((entry, state))
                    state = new_state
                    linearized = new_linearized
                    _lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:
            if len(calls) > longest:
                longest = len(calls)
                stuck = _pending_calls(head, entry)
            if not calls:
                return KeyResult(key, Verdict.NOT_LINEARIZABLE, len(ops), longest, stuck)
            entry, state = calls.pop()
            linearized &= ~(1 << bit[entry.op.op_id])
            _unlift(entry)
            entry = entry.next
    return KeyResult(key, Verdict.LINEARIZABLE, len(ops))


def _pending_calls(head: _Entry, upto: _Entry) -> tuple[int, ...]:
    """Ids of operations called before ``upto`` (a return entry) and not linearized."""
    ids = []
    entry = head.next
    while entry is not None:
        if entry.match is not None:
            ids.append(entry.op.op_id)
        if entry is upto:
            break
        entry = entry.next
    ids.append(upto.op.op_id)
    return tuple(dict.fromkeys(ids))


@dataclass
class HistoryResult:
    verdict: Verdict
    keys: list[KeyResult] = field(default_factory=list)

    @property
    def failures(self) -> list[KeyResult]:
        return [k for k in self.keys if k.verdict is Verdict.NOT_LINEARIZABLE]


def check_history(model: Model, ops: Iterable[Operation], budget_s: float) -> HistoryResult:
    """Check every key independently (P-compositionality) within ``budget_s`` in total."""
    by_key: dict[str, list[Operation]] = {}
    for op in ops:
        by_key.setdefault(op.key, []).append(op)
    deadline = Deadline.after(budget_s)
    results = [check_operations(model, by_key[k], deadline, k) for k in sorted(by_key)]
    verdicts = {r.verdict for r in results}
    if Verdict.NOT_LINEARIZABLE in verdicts:
        verdict = Verdict.NOT_LINEARIZABLE
    elif Verdict.UNKNOWN in verdicts:
        verdict = Verdict.UNKNOWN
    else:
        verdict = Verdict.LINEARIZABLE
    return HistoryResult(verdict, results)


def smallest_window(model: Model, ops: Sequence[Operation], budget_s: float) -> list[Operation]:
    """A short stretch of one key's non-linearizable history that is still not linearizable,
    to show a reader. Both cuts keep the verdict sound:

    - operations that returned before every kept one was called are dropped, and the check
      starts from ANYTHING (any register value), which admits whatever they left behind;
    - operations called after the window's end are kept as unknown-outcome writes (they may
      or may not have happened) and reads among them dropped, which only permits more orders.

    So a window that fails shows a real violation. Falls back to ``ops`` on a budget overrun.
    For register histories (ANYTHING is the register model's unknown value).
    """
    deadline = Deadline.after(budget_s)
    ordered = sorted(ops, key=lambda op: op.call_s)

    def fails(window: list[Operation]) -> bool | None:
        result = check_operations(model, window, deadline, initial=ANYTHING)
        if result.verdict is Verdict.UNKNOWN:
            return None
        return result.verdict is Verdict.NOT_LINEARIZABLE

    def suffix_from(start_s: float, source: list[Operation]) -> list[Operation]:
        kept_from = start_s
        while True:
            kept = [op for op in source if op.return_s >= kept_from]
            first_call = min((op.call_s for op in kept), default=kept_from)
            if first_call >= kept_from:
                return kept
            kept_from = first_call

    best = ordered
    for op in reversed(ordered):
        window = suffix_from(op.call_s, ordered)
        verdict = fails(window)
        if verdict is None:
            return best
        if verdict:
            best = window
            break
    for end_index in range(1, len(best) + 1):
        end_s = best[end_index - 1].call_s
        window = [op for op in best if op.call_s <= end_s]
        window += [
            replace(op, output=None, return_s=math.inf, status="info")
            for op in best
            if op.call_s > end_s and op.f != "read"
        ]
        verdict = fails(window)
        if verdict is None:
            return best
        if verdict:
            return window
    return best
