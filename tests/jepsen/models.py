"""Sequential specifications for the linearizability checker.

A model is a pure step function: given a state and an operation (its function, input and
output), say whether the operation could have produced that output from that state, and the
state after it. Operations with an unknown outcome have ``output`` None: the step then accepts
whichever result the state implies (the operation is applied as it would have been).
States must be hashable: the checker memoises (linearized set, state) pairs.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from .history import Operation


class Model(Protocol):
    name: str

    def init(self) -> Hashable: ...

    def step(self, state: Hashable, op: Operation) -> tuple[bool, Hashable]: ...


@dataclass(frozen=True, slots=True)
class _Anything:
    """A register whose value is not known (the state before a window of a history): it
    admits every read, so checking from it is at least as permissive as from any value."""


ANYTHING = _Anything()


@dataclass(frozen=True, slots=True)
class RegisterModel:
    """One register: ``read`` -> value (None when unset), ``write`` value, ``cas`` [old, new]
    -> True/False. Initial value None (the key does not exist)."""

    initial: Hashable = None
    name: str = "register"

    def init(self) -> Hashable:
        return self.initial

    def step(self, state: Hashable, op: Operation) -> tuple[bool, Hashable]:
        if op.f == "read":
            if op.output is None and op.unknown:
                return True, state
            if state is ANYTHING:
                return True, op.output
            return op.output == state, state
        if op.f == "write":
            return True, op.input
        if op.f == "cas":
            expected, new = op.input
            if op.unknown:
                # Applied as the state dictates (never applied == applied after everything).
                if state is ANYTHING:
                    return True, ANYTHING
                return True, (new if state == expected else state)
            if op.output:
                return (state is ANYTHING or state == expected), new
            return (state is ANYTHING or state != expected), state
        raise ValueError(f"register model: unknown function {op.f!r}")


@dataclass(frozen=True, slots=True)
class SetModel:
    """A grow-only set: ``add`` element, ``read`` -> sorted list of elements."""

    name: str = "set"

    def init(self) -> Hashable:
        return frozenset()

    def step(self, state: Hashable, op: Operation) -> tuple[bool, Hashable]:
        assert isinstance(state, frozenset)
        if op.f == "add":
            return True, state | {op.input}
        if op.f == "read":
            if op.output is None:
                return True, state
            seen: Any = op.output
            return frozenset(seen) == state, state
        raise ValueError(f"set model: unknown function {op.f!r}")
