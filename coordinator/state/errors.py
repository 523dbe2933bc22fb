"""Typed failures: expected outcomes of applying a command or answering a query.

These are values, not exceptions: ``StateMachine.apply`` returns them, sessions cache them
like any answer (a retry of a refused write is refused again, identically), and the servicers
map each class to one gRPC status in one place. ``reason`` is the name of the matching
``rallypoint.v1.ErrorReason`` value. Exceptions are kept for broken invariants.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

from .codec import record


@dataclass(frozen=True, slots=True)
class Failure(abc.ABC):
    """Base of every typed failure. ``message`` says what was wrong, for humans."""

    reason: ClassVar[str] = "ERROR_REASON_UNSPECIFIED"

    @property
    @abc.abstractmethod
    def message(self) -> str: ...


@record(200)
@dataclass(frozen=True, slots=True)
class InvalidCommand(Failure):
    """Malformed command (empty key, ttl_ms <= 0, missing session or sequence, ...)."""

    reason: ClassVar[str] = "INVALID_REQUEST"
    detail: str

    @property
    def message(self) -> str:
        return self.detail


@record(201)
@dataclass(frozen=True, slots=True)
class SessionExpired(Failure):
    """The session does not exist: never opened, closed, or expired."""

    reason: ClassVar[str] = "SESSION_EXPIRED"
    session_id: int

    @property
    def message(self) -> str:
        return f"session {self.session_id} does not exist or has expired; open a new session"


@record(202)
@dataclass(frozen=True, slots=True)
class SequenceDiscarded(Failure):
    """The sequence is below what the client acknowledged: its answer is gone."""

    reason: ClassVar[str] = "SEQUENCE_DISCARDED"
    session_id: int
    sequence: int
    first_unacked: int

    @property
    def message(self) -> str:
        return (
            f"session {self.session_id}: sequence {self.sequence} was acknowledged "
            f"(first unacknowledged is {self.first_unacked}); its answer was discarded"
        )


@record(203)
@dataclass(frozen=True, slots=True)
class TooManyOutstanding(Failure):
    """The session holds the maximum number of unacknowledged answers."""

    reason: ClassVar[str] = "TOO_MANY_OUTSTANDING"
    session_id: int
    limit: int

    @property
    def message(self) -> str:
        return (
            f"session {self.session_id} has {self.limit} unacknowledged answers; "
            "advance first_unacked before sending more"
        )


@record(204)
@dataclass(frozen=True, slots=True)
class StaleFence(Failure):
    """A fenced write was refused: the token is not the current one for the lease or key."""

    reason: ClassVar[str] = "STALE_FENCE"
    key: bytes
    lease_id: int
    token: int
    detail: str

    @property
    def message(self) -> str:
        return f"stale fencing token {self.token} (lease {self.lease_id}): {self.detail}"


@record(205)
@dataclass(frozen=True, slots=True)
class LeaseNotFound(Failure):
    reason: ClassVar[str] = "LEASE_NOT_FOUND"
    lease_id: int

    @property
    def message(self) -> str:
        return f"lease {self.lease_id} does not exist (revoked, expired or never granted)"


@record(206)
@dataclass(frozen=True, slots=True)
class KeyTooLarge(Failure):
    reason: ClassVar[str] = "KEY_TOO_LARGE"
    size_bytes: int
    limit_bytes: int

    @property
    def message(self) -> str:
        return f"key of {self.size_bytes} bytes exceeds the limit of {self.limit_bytes} bytes"


@record(207)
@dataclass(frozen=True, slots=True)
class ValueTooLarge(Failure):
    reason: ClassVar[str] = "VALUE_TOO_LARGE"
    size_bytes: int
    limit_bytes: int

    @property
    def message(self) -> str:
        return f"value of {self.size_bytes} bytes exceeds the limit of {self.limit_bytes} bytes"


@record(208)
@dataclass(frozen=True, slots=True)
class NotAnInteger(Failure):
    reason: ClassVar[str] = "NOT_AN_INTEGER"
    key: bytes

    @property
    def message(self) -> str:
        return f"key {self.key!r} does not hold a decimal integer"


@record(209)
@dataclass(frozen=True, slots=True)
class AddOverflow(Failure):
    reason: ClassVar[str] = "ADD_OVERFLOW"
    key: bytes

    @property
    def message(self) -> str:
        return f"adding to key {self.key!r} leaves the signed 64-bit range"


@record(210)
@dataclass(frozen=True, slots=True)
class Compacted(Failure):
    """A watch asked for history older than what is kept."""

    reason: ClassVar[str] = "COMPACTED"
    first_available_revision: int

    @property
    def message(self) -> str:
        return (
            "requested revision has been compacted; the oldest available is "
            f"{self.first_available_revision}"
        )


# ---------------------------------------------------------------- rendezvous (tags 240-249)


@record(240)
@dataclass(frozen=True, slots=True)
class JobNotFound(Failure):
    reason: ClassVar[str] = "JOB_NOT_FOUND"
    job: str

    @property
    def message(self) -> str:
        return f"job {self.job!r} does not exist; join with a config or configure it first"


@record(241)
@dataclass(frozen=True, slots=True)
class JobClosed(Failure):
    reason: ClassVar[str] = "JOB_CLOSED"
    job: str

    @property
    def message(self) -> str:
        return f"job {self.job!r} is closed; configure it again to reopen it"


@record(242)
@dataclass(frozen=True, slots=True)
class ConfigConflict(Failure):
    """A config that differs from (Join) or cannot replace (Configure) the job's."""

    reason: ClassVar[str] = "CONFIG_CONFLICT"
    job: str
    detail: str

    @property
    def message(self) -> str:
        return f"job {self.job!r}: config conflict: {self.detail}"


@record(243)
@dataclass(frozen=True, slots=True)
class NameTaken(Failure):
    reason: ClassVar[str] = "NAME_TAKEN"
    job: str
    name: str
    participant_id: int

    @property
    def message(self) -> str:
        return (
            f"job {self.job!r}: name {self.name!r} is taken by participant "
            f"{self.participant_id} of another session"
        )


@record(244)
@dataclass(frozen=True, slots=True)
class ParticipantNotFound(Failure):
    reason: ClassVar[str] = "PARTICIPANT_NOT_FOUND"
    job: str
    participant_id: int

    @property
    def message(self) -> str:
        return f"job {self.job!r} has no participant {self.participant_id}"


@record(245)
@dataclass(frozen=True, slots=True)
class StaleRound(Failure):
    """The named round is not the job's current ACTIVE round, or the participant is not one
    of its members: a zombie's write, or a straggler's from a round that ended."""

    reason: ClassVar[str] = "STALE_ROUND"
    job: str
    round: int
    current_round: int
    detail: str

    @property
    def message(self) -> str:
        return (
            f"job {self.job!r}: round {self.round} is stale (current round "
            f"{self.current_round}): {self.detail}"
        )


@record(246)
@dataclass(frozen=True, slots=True)
class StaleToken(Failure):
    reason: ClassVar[str] = "STALE_TOKEN"
    job: str
    round: int
    token: int
    current_token: int

    @property
    def message(self) -> str:
        return (
            f"job {self.job!r}: fencing token {self.token} is not round {self.round}'s "
            f"({self.current_token})"
        )


@record(247)
@dataclass(frozen=True, slots=True)
class CheckpointNotFound(Failure):
    """Never begun, aborted, committed already, or dropped when its round ended."""

    reason: ClassVar[str] = "CHECKPOINT_NOT_FOUND"
    job: str
    checkpoint_id: int

    @property
    def message(self) -> str:
        return f"job {self.job!r} has no pending checkpoint {self.checkpoint_id}"


@record(248)
@dataclass(frozen=True, slots=True)
class CheckpointIncomplete(Failure):
    reason: ClassVar[str] = "CHECKPOINT_INCOMPLETE"
    job: str
    checkpoint_id: int
    missing_ranks: tuple[int, ...]

    @property
    def message(self) -> str:
        shown = ", ".join(str(rank) for rank in self.missing_ranks[:16])
        more = "" if len(self.missing_ranks) <= 16 else f" and {len(self.missing_ranks) - 16} more"
        return (
            f"job {self.job!r}: checkpoint {self.checkpoint_id} cannot commit: "
            f"ranks {shown}{more} have not reported their shard"
        )


@record(249)
@dataclass(frozen=True, slots=True)
class LimitExceeded(Failure):
    """A configured bound (jobs, waiting participants, store keys or bytes, pending
    checkpoints, metadata size) would be exceeded."""

    reason: ClassVar[str] = "LIMIT_EXCEEDED"
    what: str
    limit: int

    @property
    def message(self) -> str:
        return f"limit exceeded: {self.what} (limit {self.limit})"


@record(250)
@dataclass(frozen=True, slots=True)
class HeldOut(Failure):
    """A join by the name of a participant the straggler policy evicted, within the job's
    straggler hold (rendezvous.py, "Stragglers"): it may join again from ``until_ms``, the
    machine's time; ``retry_after_ms`` is how long that was from the refused join's time."""

    reason: ClassVar[str] = "HELD_OUT"
    job: str
    name: str
    round: int
    until_ms: int
    retry_after_ms: int

    @property
    def message(self) -> str:
        # client/rendezvous_errors.py reads "join again in <seconds> s" from this text.
        return (
            f"job {self.job!r}: {self.name!r} was evicted as a straggler (round {self.round}) "
            f"and is held out of the job until leader time {self.until_ms} ms: join again in "
            f"{self.retry_after_ms / 1000:.3f} s (straggler_hold_windows)"
        )
