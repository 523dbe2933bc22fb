"""Successful answers of applied commands. Failures are in :mod:`.errors`."""

from __future__ import annotations

from dataclasses import dataclass

from .codec import record
from .errors import Failure
from .values import KeyValue


@dataclass(frozen=True, slots=True)
class Success:
    """Base of every successful answer."""


@record(100)
@dataclass(frozen=True, slots=True)
class NoOp(Success):
    """An empty entry (the leader's no-op on election) was applied."""


@record(101)
@dataclass(frozen=True, slots=True)
class PutResult(Success):
    kv: KeyValue
    prev: KeyValue | None


@record(102)
@dataclass(frozen=True, slots=True)
class DeleteResult(Success):
    """``deleted`` counts the keys; ``prev`` lists them in key order when asked for."""

    deleted: int
    prev: tuple[KeyValue, ...]


@record(103)
@dataclass(frozen=True, slots=True)
class CompareAndSetResult(Success):
    """On success ``kv`` is the stored key; on failure the current one (None if absent)."""

    succeeded: bool
    kv: KeyValue | None


@record(104)
@dataclass(frozen=True, slots=True)
class AddResult(Success):
    value: int
    kv: KeyValue


@record(105)
@dataclass(frozen=True, slots=True)
class LeaseGrantResult(Success):
    """``lease_id`` and ``fencing_token`` are both the raft index of the grant."""

    lease_id: int
    fencing_token: int
    ttl_ms: int


@record(106)
@dataclass(frozen=True, slots=True)
class LeaseEndResult(Success):
    """A lease was revoked or expired; its keys were deleted, in key order."""

    lease_id: int
    deleted_keys: tuple[bytes, ...]


@record(107)
@dataclass(frozen=True, slots=True)
class SessionOpenResult(Success):
    session_id: int
    ttl_ms: int


@record(108)
@dataclass(frozen=True, slots=True)
class SessionKeepAliveResult(Success):
    ttl_ms: int


@record(109)
@dataclass(frozen=True, slots=True)
class SessionCloseResult(Success):
    session_id: int


Result = Success | Failure
"""What ``StateMachine.apply`` returns."""
